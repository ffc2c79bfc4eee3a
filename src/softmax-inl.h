// Per-target online softmax over a window: one block of absolute positions at a time (scores,
// one max and rescale, vector exp, V rows summed and folded in), log-sum-exp merge of partial
// states, and the final normalisation.
#if defined(RINGKV_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_SOFTMAX_INL_H_
#undef RINGKV_SOFTMAX_INL_H_
#else
#define RINGKV_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "dot-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

// A block's scores as vectors of at most block_positions lanes, so a block is a whole number of
// vectors on every target.
using DB = hn::CappedTag<float, block_positions>;

inline constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

/// Query heads [q0, q0 + count) of kv head `kv_head` and their scratch.
struct chunk {
  std::size_t kv_head = 0, q0 = 0, count = 0;
  std::size_t padded_dim = 0;  // head_dim rounded up to block_positions floats
  const float* q = nullptr;    // [count, padded_dim] query · scale, zero-padded, 64-byte aligned
  float* scores = nullptr;     // [count, block_positions] a block's scores, then exp'd; aligned
  float* rescale = nullptr;    // [count] exp(old max − new max) for the current block
};

/// The rows of one kv head for the window positions of one block, in position order.
struct block_rows {
  const std::byte* k[block_positions];
  const std::byte* v[block_positions];
  std::size_t n = 0;
};

/// The state rows of query heads [q0, q0 + count).
HWY_INLINE state Rows(const state& s, std::size_t q0, std::size_t head_dim) {
  return {s.max + q0, s.sum + q0, s.acc + q0 * head_dim};
}

/// Scores of the block's rows for every head of the chunk; lanes past the rows are −inf.
template <class Loader>
HWY_INLINE void ScoreBlock(DF d, std::size_t head_dim, const chunk& c, const block_rows& b) {
  for (std::size_t h = 0; h < c.count; ++h) {
    float* s = c.scores + h * block_positions;
    DotRows<Loader>(d, c.q + h * c.padded_dim, b.k, b.n, head_dim, s);
    std::fill(s + b.n, s + block_positions, minus_infinity);
  }
}

/// Per head: the new max, exp(score − max) in place (vector Exp over the block), the rescale of
/// the old state, and the new denominator.
HWY_INLINE void ExpBlock(const chunk& c, const state& s) {
  const DB db;
  const std::size_t nb = hn::Lanes(db);
  for (std::size_t h = 0; h < c.count; ++h) {
    float* sc = c.scores + h * block_positions;
    auto vmax = hn::Load(db, sc);
    for (std::size_t k = nb; k < block_positions; k += nb) vmax = hn::Max(vmax, hn::Load(db, sc + k));
    const float m_new = std::max(s.max[h], hn::GetLane(hn::MaxOfLanes(db, vmax)));
    const auto vm = hn::Set(db, m_new);
    auto vsum = hn::Zero(db);
    for (std::size_t k = 0; k < block_positions; k += nb) {
      const auto e = hn::Exp(db, hn::Sub(hn::Load(db, sc + k), vm));
      hn::Store(e, db, sc + k);
      vsum = hn::Add(vsum, e);
    }
    const float r = hn::GetLane(hn::Exp(db, hn::Set(db, s.max[h] - m_new)));
    s.sum[h] = s.sum[h] * r + hn::GetLane(hn::SumOfLanes(db, vsum));
    s.max[h] = m_new;
    c.rescale[h] = r;
  }
}

// acc ← acc · r + Σ_j p_j · v_j for a slice of head_dim. Per element the arithmetic is the same
// whatever the slice width: a chain over the block's rows from zero, then one fused fold.

template <class Loader>
HWY_INLINE void AccumulateTile4(DF d, const float* p, const block_rows& b, std::size_t i, float r,
                                float* acc) {
  const std::size_t N = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j) {
    const VF pj = hn::Set(d, p[j]);
    a0 = hn::MulAdd(pj, Loader::load(d, b.v[j], i), a0);
    a1 = hn::MulAdd(pj, Loader::load(d, b.v[j], i + N), a1);
    a2 = hn::MulAdd(pj, Loader::load(d, b.v[j], i + 2 * N), a2);
    a3 = hn::MulAdd(pj, Loader::load(d, b.v[j], i + 3 * N), a3);
  }
  const VF vr = hn::Set(d, r);
  hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i), vr, a0), d, acc + i);
  hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i + N), vr, a1), d, acc + i + N);
  hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i + 2 * N), vr, a2), d, acc + i + 2 * N);
  hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i + 3 * N), vr, a3), d, acc + i + 3 * N);
}

template <class Loader>
HWY_INLINE void AccumulateTile1(DF d, const float* p, const block_rows& b, std::size_t i, float r,
                                float* acc) {
  VF a = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j)
    a = hn::MulAdd(hn::Set(d, p[j]), Loader::load(d, b.v[j], i), a);
  hn::StoreU(hn::MulAdd(hn::LoadU(d, acc + i), hn::Set(d, r), a), d, acc + i);
}

template <class Loader>
HWY_INLINE void AccumulateTail(DF d, const float* p, const block_rows& b, std::size_t i,
                               std::size_t n, float r, float* acc) {
  VF a = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j)
    a = hn::MulAdd(hn::Set(d, p[j]), Loader::load_tail(d, b.v[j], i, n), a);
  StorePartial(d, hn::MulAdd(LoadPartial(d, acc + i, n), hn::Set(d, r), a), acc + i, n);
}

/// Folds the block's V rows into every head's accumulator. Slices of head_dim outside, heads
/// inside: a slice of the block's V rows stays in L1 while each head of the group uses it.
template <class Loader>
HWY_INLINE void AccumulateBlock(DF d, std::size_t head_dim, const chunk& c, const block_rows& b,
                                const state& s) {
  const std::size_t N = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + 4 * N <= head_dim; i += 4 * N)
    for (std::size_t h = 0; h < c.count; ++h)
      AccumulateTile4<Loader>(d, c.scores + h * block_positions, b, i, c.rescale[h],
                              s.acc + h * head_dim);
  for (; i + N <= head_dim; i += N)
    for (std::size_t h = 0; h < c.count; ++h)
      AccumulateTile1<Loader>(d, c.scores + h * block_positions, b, i, c.rescale[h],
                              s.acc + h * head_dim);
  if (i < head_dim)
    for (std::size_t h = 0; h < c.count; ++h)
      AccumulateTail<Loader>(d, c.scores + h * block_positions, b, i, head_dim - i,
                             c.rescale[h], s.acc + h * head_dim);
}

/// Continues the chunk's state `s` (its rows) over the positions of `positions` in [from, to),
/// one block of absolute positions at a time; blocks that hold no window position are skipped.
/// collect(pos, end, b) fills b's K and V rows of positions [pos, end) and returns how many;
/// adjust(b) may change the block's scores before the softmax step (e.g. add a correction).
template <class Loader, class Collect, class Adjust>
HWY_INLINE void AttendBlocks(const window& positions, std::size_t head_dim, const chunk& c,
                             std::size_t from, std::size_t to, const state& s, Collect&& collect,
                             Adjust&& adjust) {
  const DF d;
  block_rows b;
  const std::size_t hi = std::min(to, WindowEnd(positions));
  for (std::size_t pos = NextPosition(positions, from); pos < hi;) {
    const std::size_t end = std::min(pos / block_positions * block_positions + block_positions, hi);
    b.n = collect(pos, end, b);
    ScoreBlock<Loader>(d, head_dim, c, b);
    adjust(b);
    ExpBlock(c, s);
    AccumulateBlock<Loader>(d, head_dim, c, b, s);
    pos = NextPosition(positions, end);
  }
}

/// AttendBlocks over the problem's own K/V rows.
template <class Loader>
HWY_INLINE void AttendRange(const problem& p, const chunk& c, std::size_t from, std::size_t to,
                            const state& s) {
  AttendBlocks<Loader>(
      p.keys, p.head_dim, c, from, to, s,
      [&](std::size_t pos, std::size_t end, block_rows& b) {
        CollectRows(p.values, c.kv_head, pos, end, b.v);
        return CollectRows(p.keys, c.kv_head, pos, end, b.k);
      },
      [](const block_rows&) {});
}

/// An empty state's rows: max −inf, sum and acc zero.
HWY_INLINE void ClearRows(std::size_t count, std::size_t head_dim, const state& s) {
  std::fill(s.max, s.max + count, minus_infinity);
  std::fill(s.sum, s.sum + count, 0.0f);
  std::fill(s.acc, s.acc + count * head_dim, 0.0f);
}

/// into ← merge(into, from) per head, natural-log LSE; an empty side changes nothing.
HWY_INLINE void MergeRows(std::size_t count, std::size_t head_dim, const state& into,
                          const state& from) {
  const DF d;
  const std::size_t N = hn::Lanes(d);
  for (std::size_t h = 0; h < count; ++h) {
    const float ma = into.max[h], mb = from.max[h];
    float* a = into.acc + h * head_dim;
    const float* b = from.acc + h * head_dim;
    if (mb == minus_infinity) continue;
    if (ma == minus_infinity) {
      into.max[h] = mb;
      into.sum[h] = from.sum[h];
      std::memcpy(a, b, head_dim * sizeof(float));
      continue;
    }
    const float m = std::max(ma, mb);
    const float sa = hn::GetLane(hn::Exp(d, hn::Set(d, ma - m)));
    const float sb = hn::GetLane(hn::Exp(d, hn::Set(d, mb - m)));
    into.max[h] = m;
    into.sum[h] = into.sum[h] * sa + from.sum[h] * sb;
    const VF va = hn::Set(d, sa), vb = hn::Set(d, sb);
    std::size_t i = 0;
    for (; i + N <= head_dim; i += N)
      hn::StoreU(hn::MulAdd(hn::LoadU(d, a + i), va, hn::Mul(hn::LoadU(d, b + i), vb)), d, a + i);
    if (i < head_dim) {
      const std::size_t n = head_dim - i;
      StorePartial(d, hn::MulAdd(LoadPartial(d, a + i, n), va, hn::Mul(LoadPartial(d, b + i, n), vb)),
                   a + i, n);
    }
  }
}

/// out = acc / (sum + exp(sink − max)) per head; zeros for a head that saw no position. The sink
/// term is one scalar exp per head in double, so a sink far above max gives zeros, not inf/inf.
HWY_INLINE void FinishRows(std::size_t count, std::size_t head_dim, const state& s,
                           const float* sinks, float* out) {
  const DF d;
  const std::size_t N = hn::Lanes(d);
  for (std::size_t h = 0; h < count; ++h) {
    double denominator = s.sum[h];
    if (sinks != nullptr) denominator += std::exp(double(sinks[h]) - double(s.max[h]));
    const float* a = s.acc + h * head_dim;
    float* o = out + h * head_dim;
    if (s.max[h] == minus_infinity || denominator == 0.0) {
      std::fill(o, o + head_dim, 0.0f);
      continue;
    }
    const VF vd = hn::Set(d, static_cast<float>(denominator));
    std::size_t i = 0;
    for (; i + N <= head_dim; i += N) hn::StoreU(hn::Div(hn::LoadU(d, a + i), vd), d, o + i);
    if (i < head_dim)
      StorePartial(d, hn::Div(LoadPartial(d, a + i, head_dim - i), vd), o + i, head_dim - i);
  }
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_SOFTMAX_INL_H_
