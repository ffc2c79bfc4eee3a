// The tiled prefill kernel (hwy/examples/skeleton.cc pattern, as simd.cpp): a tile of a chunk's
// queries × the query heads of one kv head is scored against each block of that kv head's rows,
// loaded once for the whole tile, with decode's arithmetic for each query over its own window
// (docs/design.md §3.3): a prefill has the bits of token-by-token decode.
#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/prefill.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

/// Which of a block's rows (the tile's, in position order) one query sees: rows [0, pinned)
/// (pinned positions below its rolling part) and rows [lo, hi).
struct seen_rows {
  std::size_t pinned = 0, lo = 0, hi = 0;
  std::size_t count() const { return pinned + hi - lo; }
};

/// How many of positions[0, n) (increasing) are below `limit`.
HWY_INLINE std::size_t Below(const std::size_t* positions, std::size_t n, std::size_t limit) {
  return static_cast<std::size_t>(std::lower_bound(positions, positions + n, limit) - positions);
}

/// The rows of a block at positions[0, n) that the query at `position` sees (its window, as
/// prefill_problem says).
HWY_INLINE seen_rows SeenRows(const prefill_problem& p, std::size_t position,
                              const std::size_t* positions, std::size_t n) {
  seen_rows s;
  s.hi = Below(positions, n, position + 1);
  const std::size_t from = prefill_from(p, position);
  if (from == 0) return s;  // every position up to its own
  s.pinned = Below(positions, n, std::min(p.keep, position + 1));
  s.lo = Below(positions, n, from);  // from > keep: at least `pinned`
  return s;
}

/// The positions of `w` in [lo, hi), in order (CollectRows' rows'); returns how many.
HWY_INLINE std::size_t CollectPositions(const window& w, std::size_t lo, std::size_t hi,
                                        std::size_t* positions) {
  std::size_t n = 0;
  for (std::size_t r = 0; r < w.run_count; ++r) {
    const run& ru = w.runs[r];
    for (std::size_t p = std::max(lo, ru.first); p < std::min(hi, ru.first + ru.count); ++p)
      positions[n++] = p;
  }
  return n;
}

/// The n rows of `rows` (K, then V) read through Source and stored as f32 in `to` ([2,
/// max_block_positions, stride]; the partial last vector zero-padded), the pointers moved there:
/// each f16/bf16 row promoted once for the whole tile, exactly as Source promotes it in registers.
template <class Source>
HWY_INLINE void PromoteRows(DF d, std::size_t dim, std::size_t stride, float* to,
                            block_rows& rows) {
  const std::size_t N = hn::Lanes(d);
  for (const std::byte** side : {rows.k, rows.v}) {
    for (std::size_t j = 0; j < rows.n; ++j) {
      float* row = to + j * stride;  // [stride]
      std::size_t i = 0;
      for (; i + N <= dim; i += N) hn::Store(Source::load(d, side[j], i), d, row + i);
      if (i < dim) hn::Store(Source::load_tail(d, side[j], i, dim - i), d, row + i);
      side[j] = reinterpret_cast<const std::byte*>(row);
    }
    to += max_block_positions * stride;
  }
}

/// Continues each query's segment state over one block (`all`: the rows any query of the tile
/// sees, at `positions`): the queries that see all of them together (runs of consecutive
/// queries), each other one over the rows it sees, as decode collects them for its window.
template <class Loader>
HWY_INLINE void AttendTileBlock(const prefill_problem& p, const prefill_tile& t, const chunk& c,
                                const block_rows& all, const std::size_t* positions,
                                const state& seg) {
  const DF d;
  const std::size_t group = p.step.q_heads / p.step.kv_heads, dim = p.step.head_dim;
  line_feed none;  // no software prefetch: the tile reads each block's rows many times over
  const auto attend = [&](std::size_t q0, std::size_t queries, const block_rows& rows) {
    const std::size_t h0 = q0 * group;
    chunk sub = c;
    sub.count = queries * group;
    sub.q = c.q + h0 * c.padded_dim;
    sub.scores = c.scores + h0 * c.block;
    sub.rescale = c.rescale + h0;
    const state s = Rows(seg, h0, dim);
    ScoreBlock<Loader>(d, dim, sub, rows, none);
    ExpBlock(sub, s);
    AccumulateBlock<Loader>(d, dim, sub, rows, s, none);
  };
  const auto seen = [&](std::size_t i) {
    return SeenRows(p, p.first + t.first + i, positions, all.n);
  };
  block_rows own;
  for (std::size_t i = 0; i < t.count;) {
    const seen_rows s = seen(i);
    if (s.count() == all.n) {
      std::size_t j = i + 1;
      while (j < t.count && seen(j).count() == all.n) ++j;
      attend(i, j - i, all);
      i = j;
      continue;
    }
    if (s.count() != 0) {  // a block decode never sees is skipped
      own.n = 0;
      for (std::size_t r = 0; r < all.n; ++r)
        if (r < s.pinned || (r >= s.lo && r < s.hi)) {
          own.k[own.n] = all.k[r];
          own.v[own.n++] = all.v[r];
        }
      attend(i, 1, own);
    }
    ++i;
  }
}

/// attend_tile for rows of Source's type.
template <class Source>
HWY_NOINLINE void AttendTileT(const prefill_problem& p, const prefill_tile& t, std::size_t kv,
                              const float* sinks, float* out, float* scratch) {
  using F32 = row_loader<float>;
  const problem& step = p.step;
  const std::size_t group = step.q_heads / step.kv_heads, dim = step.head_dim;
  const std::size_t heads = t.count * group;
  const prefill_layout l = prefill_layout_of(heads, dim);
  chunk c;
  c.kv_head = kv;
  c.count = heads;
  c.block = t.block;
  c.padded_dim = RoundUp(dim, block_positions);
  c.scores = scratch + l.scores;
  c.rescale = scratch + l.rescale;
  float* q = scratch + l.q;  // [heads, padded_dim], as LayOutChunk lays out a decode's
  for (std::size_t i = 0; i < t.count; ++i)
    for (std::size_t g = 0; g < group; ++g) {
      const float* in = step.query + ((t.first + i) * step.q_heads + kv * group + g) * dim;
      float* row = q + (i * group + g) * c.padded_dim;
      for (std::size_t k = 0; k < dim; ++k) row[k] = in[k] * step.scale;
      std::fill(row + dim, row + c.padded_dim, 0.0f);
    }
  c.q = q;
  const std::size_t counts = RoundUp(heads, block_positions);
  const auto state_at = [&](std::size_t offset) {
    float* s = scratch + offset;  // max [heads], sum [heads], acc [heads, dim]
    return state{s, s + counts, s + 2 * counts};
  };
  const state run = state_at(l.run), seg = state_at(l.segment);
  ClearRows(heads, dim, run);
  const std::size_t first = p.first + t.first, last = first + t.count - 1;
  const std::size_t from = prefill_from(p, first);
  const std::size_t hi = std::min(last + 1, WindowEnd(step.keys));
  // The first position from x on that a query of the tile sees: past the pinned positions, on
  // to the first query's rolling part.
  const auto next = [&](std::size_t x) {
    if (from > 0 && x >= p.keep && x < from) x = from;
    return NextPosition(step.keys, x);
  };
  block_rows all;
  std::size_t positions[max_block_positions];
  // Decode's segments: each query's state over a segment starts fresh and is merged into its
  // running state left to right (into an empty one: a copy, as if attended there directly).
  for (std::size_t pos = next(0); pos < hi;) {
    const std::size_t segment_end =
        std::min(pos / segment_positions * segment_positions + segment_positions, hi);
    ClearRows(heads, dim, seg);
    while (pos < segment_end) {
      const std::size_t end = BlockEnd(pos, segment_end, t.block);
      all.n = CollectRows(step.keys, kv, pos, end, all.k);
      CollectRows(step.values, kv, pos, end, all.v);
      CollectPositions(step.keys, pos, end, positions);
      if constexpr (!std::is_same_v<typename Source::type, float>)
        PromoteRows<Source>(DF(), dim, c.padded_dim, scratch + l.rows, all);
      AttendTileBlock<F32>(p, t, c, all, positions, seg);
      pos = next(end);
    }
    MergeRows(heads, dim, run, seg);
  }
  for (std::size_t i = 0; i < t.count; ++i)
    FinishRows(group, dim, Rows(run, i * group, dim), sinks ? sinks + kv * group : nullptr,
               out + ((t.first + i) * step.q_heads + kv * group) * dim);
}

void AttendTileImpl(const prefill_problem& p, const prefill_tile& t, std::size_t kv,
                    const float* sinks, float* out, float* scratch) {
  WithLoader(p.step,
             [&](auto loader) { AttendTileT<decltype(loader)>(p, t, kv, sinks, out, scratch); });
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv::simd {

HWY_EXPORT(AttendTileImpl);

prefill_plan plan_prefill(const prefill_problem& p) {
  prefill_plan plan;
  plan.tile_queries =
      std::max<std::size_t>(1, prefill_tile_heads / (p.step.q_heads / p.step.kv_heads));
  for (std::size_t i = 0; i < p.tokens; ++i) {
    // Every query from the one whose window is full on has that window's block.
    const bool full = p.first + i + 1 >= p.window;
    const std::size_t block = prefill_block(p, p.first + i), count = full ? p.tokens - i : 1;
    prefill_tile* last = plan.range_count ? &plan.ranges[plan.range_count - 1] : nullptr;
    if (last != nullptr && last->block == block) {
      last->count += count;
    } else {
      // A window's length takes a block per range of lengths: at most four ranges (16, 32, 64,
      // 32 as plan_reads' thresholds are passed).
      HWY_ASSERT(plan.range_count < prefill_plan::max_ranges);
      plan.ranges[plan.range_count++] = {i, count, block};
    }
    if (full) break;
  }
  for (std::size_t r = 0; r < plan.range_count; ++r)
    plan.tiles += (plan.ranges[r].count + plan.tile_queries - 1) / plan.tile_queries;
  return plan;
}

prefill_tile tile_of(const prefill_plan& plan, std::size_t t) {
  for (std::size_t r = 0;; ++r) {
    const prefill_tile& range = plan.ranges[r];
    const std::size_t tiles = (range.count + plan.tile_queries - 1) / plan.tile_queries;
    if (t < tiles) {
      const std::size_t first = t * plan.tile_queries;
      return {range.first + first, std::min(plan.tile_queries, range.count - first), range.block};
    }
    t -= tiles;
  }
}

std::size_t prefill_task_floats(const prefill_problem& p) {
  const std::size_t group = p.step.q_heads / p.step.kv_heads;
  return prefill_layout_of(std::max<std::size_t>(1, prefill_tile_heads / group) * group,
                           p.step.head_dim)
      .floats;
}

void attend_tile(const prefill_problem& p, const prefill_tile& t, std::size_t kv_head,
                 const float* sinks, float* out, float* scratch) {
  HWY_DYNAMIC_DISPATCH(AttendTileImpl)(p, t, kv_head, sinks, out, scratch);
}

}  // namespace ringkv::simd
#endif  // HWY_ONCE
