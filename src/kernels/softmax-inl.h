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

inline constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

/// Query heads [q0, q0 + count) of kv head `kv_head` and their scratch.
struct chunk {
  std::size_t kv_head = 0, q0 = 0, count = 0;
  std::size_t padded_dim = 0;  // head_dim padded to a multiple of 16 floats
  const float* q = nullptr;    // [count, padded_dim] query · scale, zero-padded, 64-byte aligned
  float* scores = nullptr;     // [count, block] a block's scores, then exp'd; aligned
  float* rescale = nullptr;    // [count] exp(old max − new max) for the current block
  std::size_t block = block_positions;  // positions a block covers (problem::block)
};

/// The rows of one kv head for the window positions of one block, in position order.
struct block_rows {
  const std::byte* k[max_block_positions];
  const std::byte* v[max_block_positions];
  std::size_t n = 0;
};

/// The state rows of query heads [q0, q0 + count).
HWY_INLINE state Rows(const state& s, std::size_t q0, std::size_t head_dim) {
  return {s.max + q0, s.sum + q0, s.acc + q0 * head_dim};
}

/// Every head's scores past the block's n rows ← −inf (so exp gives 0 there); O(heads).
HWY_INLINE void PadScores(const chunk& c, std::size_t n) {
  if (n < c.block)
    for (std::size_t h = 0; h < c.count; ++h)
      std::fill(c.scores + h * c.block + n, c.scores + (h + 1) * c.block, minus_infinity);
}

/// Scores of the block's rows for every head of the chunk; lanes past the rows are −inf.
template <class Loader>
HWY_INLINE void ScoreBlock(DF d, std::size_t head_dim, const chunk& c, const block_rows& b,
                           line_feed& feed) {
  ScoreHeads<Loader>(d, c.q, c.padded_dim, c.count, b.k, b.n, head_dim, c.scores, c.block, feed);
  feed.drain();
  PadScores(c, b.n);
}

/// The softmax step's exponential: Highway's Exp (within 1 ulp of e^x).
struct exact_exp {
  template <class D, class V>
  static HWY_INLINE V exp(D d, V x) {
    return hn::Exp(d, x);
  }
};

/// exp(score − max) in place over head h's block of scores; returns their lane-wise sum.
template <class Exp = exact_exp>
HWY_INLINE VF ExpHead(DF d, const chunk& c, const state& s, std::size_t h) {
  const std::size_t N = hn::Lanes(d);
  float* sc = c.scores + h * c.block;  // [block]
  const VF vm = hn::Set(d, s.max[h]);
  VF vsum = hn::Zero(d);
  for (std::size_t k = 0; k < c.block; k += N) {
    const VF e = Exp::exp(d, hn::Sub(hn::Load(d, sc + k), vm));
    hn::Store(e, d, sc + k);
    vsum = hn::Add(vsum, e);
  }
  return vsum;
}

/// Head h's largest score of the block, lane-wise (then reduced across lanes by the caller).
HWY_INLINE VF MaxHead(DF d, const chunk& c, std::size_t h) {
  const std::size_t N = hn::Lanes(d);
  const float* sc = c.scores + h * c.block;  // [block]
  VF m = hn::Load(d, sc);
  for (std::size_t k = N; k < c.block; k += N) m = hn::Max(m, hn::Load(d, sc + k));
  return m;
}

/// Heads [h, h + Lanes(dh)): max ← max(max, the block's max) (read from rescale), rescale ←
/// exp(old max − new max): lane-wise, so a head's value does not depend on its neighbours.
template <class Exp = exact_exp, class DH>
HWY_INLINE void RescaleHeads(DH dh, const chunk& c, const state& s, std::size_t h) {
  const auto old = hn::LoadU(dh, s.max + h);
  const auto now = hn::Max(old, hn::LoadU(dh, c.rescale + h));
  hn::StoreU(now, dh, s.max + h);
  hn::StoreU(Exp::exp(dh, hn::Sub(old, now)), dh, c.rescale + h);
}

/// Heads [h, h + Lanes(dh)): sum ← sum · rescale + the block's sum (in `block`).
template <class DH>
HWY_INLINE void SumHeads(DH dh, const chunk& c, const state& s, std::size_t h, const float* block) {
  hn::StoreU(
      hn::MulAdd(hn::LoadU(dh, s.sum + h), hn::LoadU(dh, c.rescale + h), hn::LoadU(dh, block)), dh,
      s.sum + h);
}

/// Per head: the new max, exp(score − max) in place (vector Exp over the block), the rescale of
/// the old state, and the new denominator. Heads go four at a time: their maxima and sums are
/// reduced across lanes together (Reduce4), and the state's max, rescale and sum are updated
/// as 4-lane vectors; a lone head takes the same arithmetic in a 1-lane vector, so a head's
/// values never depend on which heads share its chunk. c.rescale holds the block maxima until
/// RescaleHeads turns them into rescales. Out of line (one copy per target and exponential
/// instead of one per row type): inlined, its Exp copies make simd.cpp compile far longer under
/// the sanitizers.
template <class Exp = exact_exp>
HWY_NOINLINE void ExpBlockWith(const chunk& c, const state& s) {
  static_assert(
      block_positions % hn::MaxLanes(DF()) == 0 && cached_block_positions % block_positions == 0,
      "a block is whole vectors");
  const DF d;
  const hn::CappedTag<float, 4> d4;  // four heads (one at a time where vectors are 1 lane)
  const hn::CappedTag<float, 1> d1;
  HWY_ALIGN float block[4];
  const std::size_t n = c.count, n4 = n / 4 * 4;
  for (std::size_t h = 0; h < n4; h += 4) {
    Reduce4(d, MaxHead(d, c, h), MaxHead(d, c, h + 1), MaxHead(d, c, h + 2), MaxHead(d, c, h + 3),
            max_lanes(), c.rescale + h);
    for (std::size_t k = 0; k < 4; k += hn::Lanes(d4)) RescaleHeads<Exp>(d4, c, s, h + k);
  }
  for (std::size_t h = n4; h < n; ++h) {
    c.rescale[h] = max_lanes::across(d, MaxHead(d, c, h));
    RescaleHeads<Exp>(d1, c, s, h);
  }
  for (std::size_t h = 0; h < n4; h += 4) {
    Sum4(d, ExpHead<Exp>(d, c, s, h), ExpHead<Exp>(d, c, s, h + 1), ExpHead<Exp>(d, c, s, h + 2),
         ExpHead<Exp>(d, c, s, h + 3), block);
    for (std::size_t k = 0; k < 4; k += hn::Lanes(d4)) SumHeads(d4, c, s, h + k, block + k);
  }
  for (std::size_t h = n4; h < n; ++h) {
    block[0] = Sum1(d, ExpHead<Exp>(d, c, s, h));
    SumHeads(d1, c, s, h, block);
  }
}

/// ExpBlockWith Highway's Exp: the f32 and f16 kernels' softmax step.
inline void ExpBlock(const chunk& c, const state& s) { ExpBlockWith<exact_exp>(c, s); }

// acc ← acc · r + Σ_j p_j · v_j over a slice of head_dim. Per element the arithmetic is the same
// whatever tile computes it: one chain over the block's rows from zero, then one fused fold.
// Tiles keep eight chains in flight and share loads: two heads × four vectors (each V vector
// loaded once for both heads of the pair), one head × eight, × four, × one, and the partial
// last vector.

HWY_INLINE void Fold(DF d, float* acc, VF r, VF a) {
  hn::StoreU(hn::MulAdd(hn::LoadU(d, acc), r, a), d, acc);
}

/// Fold for the row's last n (< Lanes) elements: touches nothing past acc + n.
HWY_INLINE void FoldPartial(DF d, float* acc, VF r, VF a, std::size_t n) {
  StorePartial(d, hn::MulAdd(LoadPartial(d, acc, n), r, a), acc, n);
}

HWY_INLINE void Fold4(DF d, float* acc, VF r, VF a0, VF a1, VF a2, VF a3) {
  const std::size_t N = hn::Lanes(d);
  Fold(d, acc, r, a0);
  Fold(d, acc + N, r, a1);
  Fold(d, acc + 2 * N, r, a2);
  Fold(d, acc + 3 * N, r, a3);
}

/// a_k += w · row[i + k·N …] for k = 0 … 3.
template <class Loader>
HWY_INLINE void Step4(DF d, VF w, const std::byte* row, std::size_t i, VF& a0, VF& a1, VF& a2,
                      VF& a3) {
  const std::size_t N = hn::Lanes(d);
  a0 = hn::MulAdd(w, Loader::load(d, row, i), a0);
  a1 = hn::MulAdd(w, Loader::load(d, row, i + N), a1);
  a2 = hn::MulAdd(w, Loader::load(d, row, i + 2 * N), a2);
  a3 = hn::MulAdd(w, Loader::load(d, row, i + 3 * N), a3);
}

template <class Loader>
HWY_INLINE void Accumulate2x4(DF d, const float* pa, const float* pb, const block_rows& b,
                              std::size_t i, float ra, float rb, float* acc_a, float* acc_b) {
  const std::size_t N = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  VF b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j) {
    const std::byte* row = b.v[j];
    OuterStep2x4(hn::Set(d, pa[j]), hn::Set(d, pb[j]), Loader::load(d, row, i),
                 Loader::load(d, row, i + N), Loader::load(d, row, i + 2 * N),
                 Loader::load(d, row, i + 3 * N), a0, a1, a2, a3, b0, b1, b2, b3);
  }
  Fold4(d, acc_a + i, hn::Set(d, ra), a0, a1, a2, a3);
  Fold4(d, acc_b + i, hn::Set(d, rb), b0, b1, b2, b3);
}

#ifdef RINGKV_WIDE_TILES
/// Four heads × four vectors (weights p + g·stride, accumulators acc + g·head_dim, rescales r):
/// each V vector loaded once for the four heads.
template <class Loader>
HWY_INLINE void Accumulate4x4(DF d, const float* p, std::size_t stride, const block_rows& b,
                              std::size_t i, const float* r, float* acc, std::size_t head_dim) {
  const std::size_t N = hn::Lanes(d);
  VF a[4], bb[4], c[4], e[4];
  for (std::size_t k = 0; k < 4; ++k) a[k] = bb[k] = c[k] = e[k] = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j) {
    const std::byte* row = b.v[j];
    OuterStep4x4(hn::Set(d, p[j]), hn::Set(d, p[stride + j]), hn::Set(d, p[2 * stride + j]),
                 hn::Set(d, p[3 * stride + j]), Loader::load(d, row, i),
                 Loader::load(d, row, i + N), Loader::load(d, row, i + 2 * N),
                 Loader::load(d, row, i + 3 * N), a, bb, c, e);
  }
  Fold4(d, acc + i, hn::Set(d, r[0]), a[0], a[1], a[2], a[3]);
  Fold4(d, acc + head_dim + i, hn::Set(d, r[1]), bb[0], bb[1], bb[2], bb[3]);
  Fold4(d, acc + 2 * head_dim + i, hn::Set(d, r[2]), c[0], c[1], c[2], c[3]);
  Fold4(d, acc + 3 * head_dim + i, hn::Set(d, r[3]), e[0], e[1], e[2], e[3]);
}
#endif

// The one-head tiles read each row from element skip + i on (see ScoreRows' skip).
template <class Loader>
HWY_INLINE void Accumulate1x8(DF d, const float* p, const block_rows& b, std::size_t i,
                              std::size_t skip, float r, float* acc) {
  const std::size_t N = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  VF a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j) {
    const VF w = hn::Set(d, p[j]);
    Step4<Loader>(d, w, b.v[j], skip + i, a0, a1, a2, a3);
    Step4<Loader>(d, w, b.v[j], skip + i + 4 * N, a4, a5, a6, a7);
  }
  const VF vr = hn::Set(d, r);
  Fold4(d, acc + i, vr, a0, a1, a2, a3);
  Fold4(d, acc + i + 4 * N, vr, a4, a5, a6, a7);
}

template <class Loader>
HWY_INLINE void Accumulate1x4(DF d, const float* p, const block_rows& b, std::size_t i,
                              std::size_t skip, float r, float* acc) {
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j)
    Step4<Loader>(d, hn::Set(d, p[j]), b.v[j], skip + i, a0, a1, a2, a3);
  Fold4(d, acc + i, hn::Set(d, r), a0, a1, a2, a3);
}

/// One vector of the slice (`at` reads a whole vector or the row's tail).
template <class At>
HWY_INLINE VF AccumulateOne(DF d, const float* p, const block_rows& b, At at) {
  VF a = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j) a = hn::MulAdd(hn::Set(d, p[j]), at(b.v[j]), a);
  return a;
}

/// One head's slice [i, head_dim) with the widest one-head tiles that fit; rows read from
/// element `skip` on (see ScoreRows).
template <class Loader>
HWY_INLINE void AccumulateRest(DF d, std::size_t head_dim, const float* p, const block_rows& b,
                               std::size_t i, float r, float* acc, line_feed& feed,
                               std::size_t skip = 0) {
  const std::size_t N = hn::Lanes(d);
  for (; i + 8 * N <= head_dim; i += 8 * N) {
    Accumulate1x8<Loader>(d, p, b, i, skip, r, acc);
    feed.step();
  }
  for (; i + 4 * N <= head_dim; i += 4 * N) {
    Accumulate1x4<Loader>(d, p, b, i, skip, r, acc);
    feed.step();
  }
  for (; i + N <= head_dim; i += N)
    Fold(d, acc + i, hn::Set(d, r), AccumulateOne(d, p, b, vector_at<Loader>{d, skip + i}));
  if (i < head_dim) {
    const std::size_t n = head_dim - i;
    FoldPartial(d, acc + i, hn::Set(d, r), AccumulateOne(d, p, b, tail_at<Loader>{d, skip + i, n}),
                n);
  }
}

/// Tile calls AccumulateBlock makes (the steps its feed is spread over).
HWY_INLINE std::size_t AccumulateTiles(DF d, std::size_t heads, std::size_t head_dim) {
  const std::size_t N = hn::Lanes(d);
  const std::size_t lone = head_dim / (8 * N) + head_dim % (8 * N) / (4 * N);
  const std::size_t quads = TakeWideGroups(heads) * (head_dim / (4 * N));
  return quads + heads / 2 * (head_dim / (4 * N)) + heads % 2 * lone;
}

/// Folds the block's V rows into every head's accumulator: heads in fours (RINGKV_WIDE_TILES) or
/// pairs sharing each V load, a lone head on its own; the block's rows stay in L1 from one pair
/// to the next. The feed gets a step after each tile.
template <class Loader>
HWY_INLINE void AccumulateBlock(DF d, std::size_t head_dim, const chunk& c, const block_rows& b,
                                const state& s, line_feed& feed) {
  const std::size_t N = hn::Lanes(d);
  std::size_t h = 0;
#ifdef RINGKV_WIDE_TILES
  for (; h + 4 <= c.count; h += 4) {
    const float* p = c.scores + h * c.block;
    float* acc = s.acc + h * head_dim;
    std::size_t i = 0;
    for (; i + 4 * N <= head_dim; i += 4 * N) {
      Accumulate4x4<Loader>(d, p, c.block, b, i, c.rescale + h, acc, head_dim);
      feed.step();
    }
    for (std::size_t g = 0; g < 4; ++g)
      AccumulateRest<Loader>(d, head_dim, p + g * c.block, b, i, c.rescale[h + g],
                             acc + g * head_dim, feed);
  }
#endif
  for (; h + 2 <= c.count; h += 2) {
    const float* pa = c.scores + h * c.block;
    const float* pb = pa + c.block;
    float* acc_a = s.acc + h * head_dim;
    float* acc_b = acc_a + head_dim;
    std::size_t i = 0;
    for (; i + 4 * N <= head_dim; i += 4 * N) {
      Accumulate2x4<Loader>(d, pa, pb, b, i, c.rescale[h], c.rescale[h + 1], acc_a, acc_b);
      feed.step();
    }
    AccumulateRest<Loader>(d, head_dim, pa, b, i, c.rescale[h], acc_a, feed);
    AccumulateRest<Loader>(d, head_dim, pb, b, i, c.rescale[h + 1], acc_b, feed);
  }
  if (h < c.count)
    AccumulateRest<Loader>(d, head_dim, c.scores + h * c.block, b, 0, c.rescale[h],
                           s.acc + h * head_dim, feed);
  feed.drain();
}

/// A block's rows when each chunk head reads a kv head of its own (AttendSpread): the rows of
/// the chunk's first kv head; chunk head h reads the same positions' rows h · k_skip (K) and
/// h · v_skip (V) elements further on, the kv heads' distance in every run (see
/// uniform_head_stride), so one set of row pointers serves every head, not a set collected per
/// head. Re-measure: scripts/bench-targets --shapes /256/8
struct spread_rows {
  block_rows first;
  std::size_t k_skip = 0, v_skip = 0;
};

/// Scores of each chunk head's own rows (ScoreRows, as a one-head chunk computes them).
template <class Loader>
HWY_INLINE void ScoreBlock(DF d, std::size_t head_dim, const chunk& c, const spread_rows& b,
                           line_feed& feed) {
  for (std::size_t h = 0; h < c.count; ++h)
    ScoreRows<Loader>(d, c.q + h * c.padded_dim, b.first.k, 0, b.first.n, head_dim,
                      c.scores + h * c.block, feed, h * b.k_skip);
  feed.drain();
  PadScores(c, b.first.n);
}

/// Two heads × four vectors, each head its own V rows (head a's from element skip_a + i on, head
/// b's from skip_b + i): eight chains in flight where one head's four would wait on the FMA
/// latency; per element the arithmetic of Accumulate1x4.
template <class Loader>
HWY_INLINE void AccumulatePair(DF d, const float* pa, const float* pb, const block_rows& b,
                               std::size_t i, std::size_t skip_a, std::size_t skip_b, float ra,
                               float rb, float* acc_a, float* acc_b) {
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  VF b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  for (std::size_t j = 0; j < b.n; ++j) {
    Step4<Loader>(d, hn::Set(d, pa[j]), b.v[j], skip_a + i, a0, a1, a2, a3);
    Step4<Loader>(d, hn::Set(d, pb[j]), b.v[j], skip_b + i, b0, b1, b2, b3);
  }
  Fold4(d, acc_a + i, hn::Set(d, ra), a0, a1, a2, a3);
  Fold4(d, acc_b + i, hn::Set(d, rb), b0, b1, b2, b3);
}

/// Elements of a row a lone head folds with its eight-vector tiles (Accumulate1x8).
HWY_INLINE std::size_t EightVectorElements(DF d, std::size_t head_dim) {
  return head_dim / (8 * hn::Lanes(d)) * (8 * hn::Lanes(d));
}

/// Tile calls the spread AccumulateBlock makes for `heads` heads (its feed's steps).
HWY_INLINE std::size_t SpreadAccumulateTiles(DF d, std::size_t heads, std::size_t head_dim) {
  const std::size_t N = hn::Lanes(d), wide = EightVectorElements(d, head_dim);
  return heads / 2 * (2 * wide / (8 * N) + (head_dim - wide) / (4 * N)) +
         heads % 2 * AccumulateTiles(d, 1, head_dim);
}

/// Folds each chunk head's own V rows into its accumulator, with the same arithmetic per element
/// as a head alone. Heads go in pairs: each head's eight-vector tiles on its own, then the two
/// heads together over slices of four vectors (AccumulatePair: eight chains, where one head's
/// four would wait on the FMA latency), then the rest of each row as AccumulateRest; a lone head
/// as AccumulateRest. Pairs over whole rows do not pay for f16 rows.
/// Re-measure: scripts/bench-targets --shapes /256/8
template <class Loader>
HWY_INLINE void AccumulateBlock(DF d, std::size_t head_dim, const chunk& c, const spread_rows& b,
                                const state& s, line_feed& feed) {
  const std::size_t N = hn::Lanes(d), wide = EightVectorElements(d, head_dim);
  std::size_t h = 0;
  for (; h + 2 <= c.count; h += 2) {
    const float* pa = c.scores + h * c.block;
    float* acc_a = s.acc + h * head_dim;
    for (std::size_t g = 0; g < 2; ++g)
      for (std::size_t i = 0; i < wide; i += 8 * N) {
        Accumulate1x8<Loader>(d, pa + g * c.block, b.first, i, (h + g) * b.v_skip, c.rescale[h + g],
                              acc_a + g * head_dim);
        feed.step();
      }
    std::size_t i = wide;
    for (; i + 4 * N <= head_dim; i += 4 * N) {
      AccumulatePair<Loader>(d, pa, pa + c.block, b.first, i, h * b.v_skip, (h + 1) * b.v_skip,
                             c.rescale[h], c.rescale[h + 1], acc_a, acc_a + head_dim);
      feed.step();
    }
    for (std::size_t g = 0; g < 2; ++g)
      AccumulateRest<Loader>(d, head_dim, pa + g * c.block, b.first, i, c.rescale[h + g],
                             acc_a + g * head_dim, feed, (h + g) * b.v_skip);
  }
  if (h < c.count)
    AccumulateRest<Loader>(d, head_dim, c.scores + h * c.block, b.first, 0, c.rescale[h],
                           s.acc + h * head_dim, feed, h * b.v_skip);
  feed.drain();
}

/// Continues the chunk's state `s` (its rows) over the positions of `positions` in [from, to),
/// one block of absolute positions at a time; blocks that hold no window position are skipped.
/// collect(pos, end, b, feed) fills b's K and V rows of positions [pos, end), returns how many,
/// and may start `feed` with rows to prefetch while the block's scores are computed;
/// adjust(next, b, feed) runs once the scores are computed, before the softmax step: it may
/// change them (e.g. add a correction) and start `feed` with rows to prefetch while V rows are
/// summed (e.g. those of the next block, which starts at position `next`). The block's rows
/// are those of one kv head, which the chunk's heads share.
template <class Loader, class Collect, class Adjust>
HWY_INLINE void AttendBlocks(const window& positions, std::size_t head_dim, const chunk& c,
                             std::size_t from, std::size_t to, const state& s, Collect&& collect,
                             Adjust&& adjust) {
  const DF d;
  block_rows b{};
  line_feed while_scoring, while_summing;
  const std::size_t hi = std::min(to, WindowEnd(positions));
  for (std::size_t pos = NextPosition(positions, from); pos < hi;) {
    const std::size_t end = BlockEnd(pos, hi, c.block);
    b.n = collect(pos, end, b, while_scoring);
    ScoreBlock<Loader>(d, head_dim, c, b, while_scoring);
    const std::size_t next = NextPosition(positions, end);
    adjust(next, b, while_summing);
    ExpBlock(c, s);
    AccumulateBlock<Loader>(d, head_dim, c, b, s, while_summing);
    pos = next;
  }
}

/// As AttendBlocks over at most one segment, for the chunk heads' own rows (spread_rows: b's
/// skips set), in three phases: every block's scores (K rows only), then every block's softmax
/// step, then every block's V rows folded in. Each block's arithmetic, and the order of the
/// steps that change the state (ExpBlock block after block, AccumulateBlock block after block;
/// neither reads what the other writes but the block's own weights and rescale), are
/// AttendBlocks's, so the bits are the same. What changes is the reads: K alone, then V alone,
/// each a stream with nothing waiting on a softmax step between blocks. feed_next(w, pos, end,
/// scoring, feed) may start `feed` with the rows of `w` (keys while scoring, then values) of
/// the next block, [pos, end), to prefetch while this block's scores or V sums are computed.
template <class Loader, class FeedNext>
HWY_INLINE void AttendPhased(const problem& p, const chunk& c, std::size_t from, std::size_t to,
                             const state& s, spread_rows b, FeedNext&& feed_next) {
  // At most one block more than whole blocks: a range may start or end mid-block.
  constexpr std::size_t max_blocks = segment_positions / block_positions + 1;
  constexpr std::size_t max_scores = segment_positions + max_block_positions;
  HWY_DASSERT(to - from <= segment_positions && c.count <= side_by_side_heads);
  HWY_ALIGN float scores[max_scores * side_by_side_heads];  // [blocks, count, block]
  float rescale[max_blocks * side_by_side_heads];           // [blocks, count]
  const DF d;
  line_feed feed;
  const window& positions = p.keys;
  const std::size_t hi = std::min(to, WindowEnd(positions));
  chunk block = c;
  const auto use = [&](std::size_t k) {
    block.scores = scores + k * c.count * c.block;
    block.rescale = rescale + k * c.count;
  };
  // One phase: for each block [pos, end) in order, its buffers in use, b's rows of `w` (into
  // `rows`) collected and the next block's fed; then step(). Returns how many blocks.
  const auto each_block = [&](const window& w, const std::byte** rows, bool scoring, auto&& step) {
    std::size_t k = 0;
    for (std::size_t pos = NextPosition(positions, from); pos < hi; ++k) {
      const std::size_t end = BlockEnd(pos, hi, c.block), next = NextPosition(positions, end);
      use(k);
      b.first.n = CollectRows(w, c.kv_head, pos, end, rows);
      if (next < hi) feed_next(w, next, BlockEnd(next, hi, c.block), scoring, feed);
      step();
      pos = next;
    }
    return k;
  };
  const std::size_t blocks = each_block(p.keys, b.first.k, true,
                                        [&] { ScoreBlock<Loader>(d, p.head_dim, block, b, feed); });
  for (std::size_t k = 0; k < blocks; ++k) {
    use(k);
    ExpBlock(block, s);
  }
  each_block(p.values, b.first.v, false,
             [&] { AccumulateBlock<Loader>(d, p.head_dim, block, b, s, feed); });
}

/// AttendBlocks over the problem's own K/V rows. Unless p.prefetch is none (see
/// prefetch_walk_for), with software prefetches timed so the L1 holds only what is in use, and
/// trickled between tiles (line_feed): this block's V rows are fed while its scores are
/// computed, the next block's K rows while its V rows are summed (past the L2 the hardware
/// prefetchers alone do not keep up). Re-measure: scripts/bench-targets --shapes 4096
template <class Loader>
HWY_INLINE void AttendRange(const problem& p, const chunk& c, std::size_t from, std::size_t to,
                            const state& s) {
  const std::size_t hi = std::min(to, WindowEnd(p.keys));
  const std::size_t row_bytes = p.head_dim * sizeof(typename Loader::type);
  const prefetch_walk walk = p.prefetch;
  const bool prefetch = walk != prefetch_walk::none;
  const std::byte* ahead[max_block_positions];  // the next block's K rows, fed while V is summed
  AttendBlocks<Loader>(
      p.keys, p.head_dim, c, from, to, s,
      [&](std::size_t pos, std::size_t end, block_rows& b, line_feed& feed) {
        const std::size_t n = CollectRows(p.values, c.kv_head, pos, end, b.v);
        if (prefetch) feed.start(walk, b.v, n, row_bytes, ScoreTiles(c.count, n));
        return CollectRows(p.keys, c.kv_head, pos, end, b.k);
      },
      [&](std::size_t next, const block_rows&, line_feed& feed) {
        if (!prefetch || next >= hi) return;
        const std::size_t n =
            CollectRows(p.keys, c.kv_head, next, BlockEnd(next, hi, c.block), ahead);
        feed.start(walk, ahead, n, row_bytes, AccumulateTiles(DF(), c.count, p.head_dim));
      });
}

/// A block of one head's V rows folded in row by row: acc ← acc · r + Σ_j p_j · v_j, the sum
/// a chain per element from zero in `sum` ([padded_dim], in L1) instead of in registers — the
/// same operations per element as AccumulateRest's tiles, so the same bits — while `also(j)`
/// runs between rows (PipelineBlocks scores the next block's rows there).
template <class Loader, class Also>
HWY_INLINE void AccumulateRowByRow(DF d, std::size_t head_dim, const float* p, const block_rows& b,
                                   std::size_t rows, float r, float* acc, float* HWY_RESTRICT sum,
                                   Also&& also) {
  const std::size_t N = hn::Lanes(d), whole = head_dim / N * N;
  for (std::size_t i = 0; i < head_dim; i += N) hn::Store(hn::Zero(d), d, sum + i);
  for (std::size_t j = 0; j < rows; ++j) {
    also(j);
    if (j >= b.n) continue;
    const VF w = hn::Set(d, p[j]);
    for (std::size_t i = 0; i < whole; i += N)
      hn::Store(hn::MulAdd(w, Loader::load(d, b.v[j], i), hn::Load(d, sum + i)), d, sum + i);
    if (whole < head_dim)
      hn::Store(hn::MulAdd(w, Loader::load_tail(d, b.v[j], whole, head_dim - whole),
                           hn::Load(d, sum + whole)),
                d, sum + whole);
  }
  const VF vr = hn::Set(d, r);
  for (std::size_t i = 0; i < whole; i += N) Fold(d, acc + i, vr, hn::Load(d, sum + i));
  if (whole < head_dim) FoldPartial(d, acc + whole, vr, hn::Load(d, sum + whole), head_dim - whole);
}

/// As AttendRange for a chunk of one query head whose rows come from the L3 or memory
/// (p.pipelined, see pipelined_min_row_bytes): software-pipelined, each row of the next block's K
/// read between two rows of this block's V, so both arrays are read as two steady streams a row
/// at a time, the order a per-position loop (ggml's) reads them in and the hardware prefetchers
/// follow (block by block they do not keep up without software prefetch). The
/// arithmetic per block is AttendRange's (Score1x1's chains, ExpBlock, the V rows folded in as
/// AccumulateRest folds them), so the bits are the same. Unless p.prefetch is none
/// (pipelined_prefetch), it also prefetches, between two rows, a row of the next block's V and of
/// the K of the block after it: each stream a block ahead of its reads.
/// Re-measure: scripts/bench-targets --shapes 128/4096/8
template <class Loader>
HWY_INLINE void PipelineBlocks(const problem& p, const chunk& c, std::size_t from, std::size_t to,
                               const state& s) {
  const DF d;
  const std::size_t hi = std::min(to, WindowEnd(p.keys)), dim = p.head_dim;
  const std::size_t row_bytes = dim * sizeof(typename Loader::type);
  HWY_ALIGN float scores[2][max_block_positions];  // this block's weights, the next's scores
  HWY_ALIGN float sum[max_head_dim];               // [padded_dim] the block's V rows summed
  block_rows rows[2];
  const std::byte* far[max_block_positions];  // K rows of the block after the next, to prefetch
  const bool prefetch = p.prefetch != prefetch_walk::none;  // see pipelined_prefetch
  std::size_t pos = NextPosition(p.keys, from);
  if (pos >= hi) return;
  std::size_t end = BlockEnd(pos, hi, c.block), now = 0;
  const auto collect = [&](std::size_t i, std::size_t lo, std::size_t up) {
    rows[i].n = CollectRows(p.keys, c.kv_head, lo, up, rows[i].k);
    CollectRows(p.values, c.kv_head, lo, up, rows[i].v);
    std::fill(scores[i] + rows[i].n, scores[i] + c.block, minus_infinity);
  };
  collect(0, pos, end);
  for (std::size_t j = 0; j < rows[0].n; ++j)
    scores[0][j] = Score1x1<Loader>(d, c.q, rows[0].k[j], dim, 0);
  for (;;) {
    chunk block = c;
    block.scores = scores[now];
    ExpBlock(block, s);
    const std::size_t next = NextPosition(p.keys, end), later = now ^ 1;
    block_rows& ahead = rows[later];
    ahead.n = 0;
    std::size_t far_n = 0;
    if (next < hi) {
      end = BlockEnd(next, hi, c.block);
      collect(later, next, end);
      const std::size_t after = NextPosition(p.keys, end);
      if (prefetch && after < hi)
        far_n = CollectRows(p.keys, c.kv_head, after, BlockEnd(after, hi, c.block), far);
    }
    AccumulateRowByRow<Loader>(d, dim, scores[now], rows[now], std::max(rows[now].n, ahead.n),
                               c.rescale[0], s.acc, sum, [&](std::size_t j) {
                                 if (j < far_n) PrefetchRow(far[j], row_bytes);
                                 if (j >= ahead.n) return;
                                 if (prefetch) PrefetchRow(ahead.v[j], row_bytes);
                                 scores[later][j] = Score1x1<Loader>(d, c.q, ahead.k[j], dim, 0);
                               });
    if (ahead.n == 0) return;
    now = later;
  }
}

/// As AttendRange when each query head has its own kv head (GQA 1) and p.side_by_side (see
/// plan_reads): chunk head h reads kv head c.kv_head + h. Alone, such a head's block runs its
/// softmax step as a chain of one-lane operations with little else to overlap it; side by side,
/// ExpBlock takes four heads' steps as 4-lane vectors and the out-of-order core has four heads'
/// tiles to interleave. Each head's arithmetic is AttendRange's for a one-head chunk (ScoreRows,
/// ExpBlock's per-lane state, AccumulateRest), so the bits do not depend on which heads share a
/// chunk. The segment is read in phases (AttendPhased): all its K rows, then the softmax steps,
/// then all its V rows, so each array streams with no softmax step waited on between blocks.
/// Prefetch, when the step has it, is the spaced walk over all the chunk's heads' rows: the next
/// block's K rows while this block's scores are computed, its V rows while this one's are summed.
/// Re-measure: scripts/bench-targets --shapes '/(256|4096)/8'
template <class Loader>
HWY_INLINE void AttendSpread(const problem& p, const chunk& c, std::size_t from, std::size_t to,
                             const state& s) {
  using T = typename Loader::type;
  const std::byte* ahead[max_block_positions];  // the next block's rows to prefetch
  const bool prefetch = p.prefetch != prefetch_walk::none;
  const std::size_t row_bytes = p.head_dim * sizeof(T);
  // Bytes between kv heads' rows of a position, the same in every run (uniform_head_stride).
  const std::size_t k_head = p.keys.runs[0].head_stride, v_head = p.values.runs[0].head_stride;
  spread_rows rows;
  rows.k_skip = k_head / sizeof(T);
  rows.v_skip = v_head / sizeof(T);
  // The next block's rows of `w` (the first head's; the walk takes every head's), trickled over
  // this block's score tiles or V tiles.
  AttendPhased<Loader>(
      p, c, from, to, s, rows,
      [&](const window& w, std::size_t pos, std::size_t end, bool scoring, line_feed& feed) {
        if (!prefetch) return;
        const std::size_t n = CollectRows(w, c.kv_head, pos, end, ahead);
        const std::size_t tiles =
            scoring ? c.count * ScoreTiles(1, n) : SpreadAccumulateTiles(DF(), c.count, p.head_dim);
        feed.start(prefetch_walk::spaced, ahead, n, row_bytes, tiles, c.count,
                   scoring ? k_head : v_head);
      });
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
      StorePartial(d,
                   hn::MulAdd(LoadPartial(d, a + i, n), va, hn::Mul(LoadPartial(d, b + i, n), vb)),
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
