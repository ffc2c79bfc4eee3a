// Per-target dot products: scores of a block's K rows for the query heads of a group, computed in
// tiles of rows × heads with the same arithmetic for every (head, row) whatever the tile, so
// tiling never changes a score.
#if defined(RINGKV_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_DOT_INL_H_
#undef RINGKV_DOT_INL_H_
#else
#define RINGKV_DOT_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

// The score arithmetic, the same for every (query head, row) whatever tile computes it: one
// FMA chain over head_dim (the partial last vector, zero-padded, included), then a sum across
// lanes. Tiles only decide how many chains run side by side (eight: enough to hide the FMA
// latency) and which loads they share: a K vector loaded once serves every head of the tile.

HWY_INLINE float SumLanes(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }

/// Lane-wise addition, and one vector's lanes summed (a reduction for Reduce4).
struct add_lanes {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
  static HWY_INLINE float across(DF d, VF v) { return SumLanes(d, v); }
};

/// Lane-wise maximum, and one vector's largest lane (exact whatever the order).
struct max_lanes {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Max(a, b);
  }
  static HWY_INLINE float across(DF d, VF v) { return hn::GetLane(hn::MaxOfLanes(d, v)); }
};

// Targets of one or two 128-bit blocks reduce chains together (transposed); x86's 512-bit
// targets first fold each chain's two 256-bit halves (two chains per pair of shuffles), then do
// as AVX2 does. Others one by one.
#undef RINGKV_TRANSPOSED_SUMS
#undef RINGKV_FOLDED_SUMS
#if HWY_TARGET != HWY_SCALAR && (HWY_MAX_BYTES == 16 || HWY_TARGET == HWY_AVX2)
#define RINGKV_TRANSPOSED_SUMS 1
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define RINGKV_TRANSPOSED_SUMS 1
#define RINGKV_FOLDED_SUMS 1
#endif

#ifdef RINGKV_TRANSPOSED_SUMS
/// Per 128-bit block, op over a, b, c, e's four lanes there: [op a, op b, op c, op e] — four
/// chains reduced together with six shuffles and three ops instead of one reduction each.
template <class D, class V, class Op>
HWY_INLINE V Blocks4(D d, V a, V b, V c, V e, Op op) {
  const hn::Repartition<std::uint64_t, D> d64;
  const V ab = op(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const V ce = op(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  const auto ab64 = hn::BitCast(d64, ab), ce64 = hn::BitCast(d64, ce);
  return op(hn::BitCast(d, hn::InterleaveLower(d64, ab64, ce64)),
            hn::BitCast(d, hn::InterleaveUpper(d64, ab64, ce64)));
}

/// Of a vector of two 128-bit blocks: op(lower block, upper block), stored to s[0..4).
template <class D, class V, class Op>
HWY_INLINE void StoreHalves(D d, V r, Op op, float* s) {
  const hn::Half<D> dh;
  hn::StoreU(op(hn::LowerHalf(dh, r), hn::UpperHalf(dh, r)), dh, s);
}
#endif

#ifdef RINGKV_FOLDED_SUMS
/// [op(a's lower half, a's upper half) | the same of b]: two chains folded to 256 bits each.
template <class Op>
HWY_INLINE VF FoldHalves(DF d, VF a, VF b, Op op) {
  return op(hn::ConcatLowerLower(d, b, a), hn::ConcatUpperUpper(d, b, a));
}
#endif

/// s[0..4) = op reduced over the lanes of a, b, c, e. Each result's order of operations is
/// fixed by the target alone (not by what the other chains hold), so a row's score, or a head's
/// sum, is the same in every tile.
template <class Op>
HWY_INLINE void Reduce4(DF d, VF a, VF b, VF c, VF e, Op op, float* s) {
#if defined(RINGKV_FOLDED_SUMS)
  const hn::Half<DF> dh;
  const VF ab = FoldHalves(d, a, b, op), ce = FoldHalves(d, c, e, op);
  StoreHalves(dh,
              Blocks4(dh, hn::LowerHalf(dh, ab), hn::UpperHalf(dh, ab), hn::LowerHalf(dh, ce),
                      hn::UpperHalf(dh, ce), op),
              op, s);
#elif defined(RINGKV_TRANSPOSED_SUMS) && HWY_MAX_BYTES == 16
  hn::StoreU(Blocks4(d, a, b, c, e, op), d, s);
#elif defined(RINGKV_TRANSPOSED_SUMS)
  StoreHalves(d, Blocks4(d, a, b, c, e, op), op, s);
#else
  s[0] = Op::across(d, a);
  s[1] = Op::across(d, b);
  s[2] = Op::across(d, c);
  s[3] = Op::across(d, e);
#endif
}

/// s[0..4) = the lane sums of a, b, c, e.
HWY_INLINE void Sum4(DF d, VF a, VF b, VF c, VF e, float* s) {
  Reduce4(d, a, b, c, e, add_lanes(), s);
}

/// The two 256-bit halves of r, each holding two 128-bit blocks [x | y] and [z | w], as x + y
/// stored to lo[0..4) and z + w to hi[0..4).
template <class D, class V>
HWY_INLINE void StorePairSums(D d, V lo, V hi, float* s_lo, float* s_hi) {
  const V r = hn::Add(hn::ConcatLowerLower(d, hi, lo), hn::ConcatUpperUpper(d, hi, lo));
  const hn::Half<D> dq;
  hn::StoreU(hn::LowerHalf(dq, r), dq, s_lo);
  hn::StoreU(hn::UpperHalf(dq, r), dq, s_hi);
}

/// lo[0..4) = the lane sums of c0 … c3, hi[0..4) those of c4 … c7, in the same order per chain
/// as Sum4 (so a tile of two heads' four rows, or four heads' four, reduces its chains eight at
/// a time: 2 shuffles and 1 add a chain on x86's 512-bit targets, against 3.25 and 1.5 by Sum4).
HWY_INLINE void Sum8(DF d, VF c0, VF c1, VF c2, VF c3, VF c4, VF c5, VF c6, VF c7, float* lo,
                     float* hi) {
#if defined(RINGKV_FOLDED_SUMS)
  // Per 128-bit block of r: [c0 … c3] over their folded lanes 0–3, then 4–7; [c4 … c7] alike.
  const add_lanes add;
  const VF r = Blocks4(d, FoldHalves(d, c0, c4, add), FoldHalves(d, c1, c5, add),
                       FoldHalves(d, c2, c6, add), FoldHalves(d, c3, c7, add), add);
  const hn::Half<DF> dh;
  StorePairSums(dh, hn::LowerHalf(dh, r), hn::UpperHalf(dh, r), lo, hi);
#elif defined(RINGKV_TRANSPOSED_SUMS) && HWY_TARGET == HWY_AVX2
  StorePairSums(d, Blocks4(d, c0, c1, c2, c3, add_lanes()), Blocks4(d, c4, c5, c6, c7, add_lanes()),
                lo, hi);
#else
  Sum4(d, c0, c1, c2, c3, lo);
  Sum4(d, c4, c5, c6, c7, hi);
#endif
}

/// s[0..8) = the lane sums of c0 … c7 (Sum8 into one array).
HWY_INLINE void Sum8(DF d, VF c0, VF c1, VF c2, VF c3, VF c4, VF c5, VF c6, VF c7, float* s) {
  Sum8(d, c0, c1, c2, c3, c4, c5, c6, c7, s, s + 4);
}

HWY_INLINE float Sum1(DF d, VF c) {
  HWY_ALIGN float s[4];
  const VF zero = hn::Zero(d);
  Sum4(d, c, zero, zero, zero, s);
  return s[0];
}

// One step of a tile: element slice `at` of each row, times the query's slice.
template <class At>
HWY_INLINE void Step8x1(VF q, const std::byte* const* k, At at, VF& c0, VF& c1, VF& c2, VF& c3,
                        VF& c4, VF& c5, VF& c6, VF& c7) {
  c0 = hn::MulAdd(q, at(k[0]), c0);
  c1 = hn::MulAdd(q, at(k[1]), c1);
  c2 = hn::MulAdd(q, at(k[2]), c2);
  c3 = hn::MulAdd(q, at(k[3]), c3);
  c4 = hn::MulAdd(q, at(k[4]), c4);
  c5 = hn::MulAdd(q, at(k[5]), c5);
  c6 = hn::MulAdd(q, at(k[6]), c6);
  c7 = hn::MulAdd(q, at(k[7]), c7);
}

template <class At>
HWY_INLINE void Step4x2(VF qa, VF qb, const std::byte* const* k, At at, VF& a0, VF& a1, VF& a2,
                        VF& a3, VF& b0, VF& b1, VF& b2, VF& b3) {
  OuterStep2x4(qa, qb, at(k[0]), at(k[1]), at(k[2]), at(k[3]), a0, a1, a2, a3, b0, b1, b2, b3);
}

/// Scores of eight rows for one query head (q zero-padded to whole vectors, aligned); each row
/// read from element `skip` on (another kv head's row, see ScoreRows).
template <class Loader>
HWY_INLINE void Score8x1(DF d, const float* HWY_RESTRICT q, const std::byte* const* k,
                         std::size_t dim, float* s, std::size_t skip) {
  const std::size_t N = hn::Lanes(d);
  VF c0 = hn::Zero(d), c1 = hn::Zero(d), c2 = hn::Zero(d), c3 = hn::Zero(d);
  VF c4 = hn::Zero(d), c5 = hn::Zero(d), c6 = hn::Zero(d), c7 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + N <= dim; i += N)
    Step8x1(hn::Load(d, q + i), k, vector_at<Loader>{d, skip + i}, c0, c1, c2, c3, c4, c5, c6, c7);
  if (i < dim)
    Step8x1(hn::Load(d, q + i), k, tail_at<Loader>{d, skip + i, dim - i}, c0, c1, c2, c3, c4, c5,
            c6, c7);
  Sum8(d, c0, c1, c2, c3, c4, c5, c6, c7, s);
}

/// Scores of four rows for two query heads of a group: each K vector loaded once for both.
template <class Loader>
HWY_INLINE void Score4x2(DF d, const float* HWY_RESTRICT qa, const float* HWY_RESTRICT qb,
                         const std::byte* const* k, std::size_t dim, float* sa, float* sb) {
  const std::size_t N = hn::Lanes(d);
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  VF b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + N <= dim; i += N)
    Step4x2(hn::Load(d, qa + i), hn::Load(d, qb + i), k, vector_at<Loader>{d, i}, a0, a1, a2, a3,
            b0, b1, b2, b3);
  if (i < dim)
    Step4x2(hn::Load(d, qa + i), hn::Load(d, qb + i), k, tail_at<Loader>{d, i, dim - i}, a0, a1, a2,
            a3, b0, b1, b2, b3);
  Sum8(d, a0, a1, a2, a3, b0, b1, b2, b3, sa, sb);
}

#ifdef RINGKV_WIDE_TILES
/// One step of a four-head tile: element slice `at` (from element i) of four rows, times the
/// four query heads' slices (q rows q_stride apart).
template <class At>
HWY_INLINE void Step4x4(DF d, const float* HWY_RESTRICT q, std::size_t q_stride, std::size_t i,
                        const std::byte* const* k, At at, VF* a, VF* b, VF* c, VF* e) {
  OuterStep4x4(hn::Load(d, q + i), hn::Load(d, q + q_stride + i), hn::Load(d, q + 2 * q_stride + i),
               hn::Load(d, q + 3 * q_stride + i), at(k[0]), at(k[1]), at(k[2]), at(k[3]), a, b, c,
               e);
}

/// Scores of four rows for four query heads of a group (q rows q_stride apart, scores s_stride
/// apart): each K vector loaded once for all four.
template <class Loader>
HWY_INLINE void Score4x4(DF d, const float* HWY_RESTRICT q, std::size_t q_stride,
                         const std::byte* const* k, std::size_t dim, float* s,
                         std::size_t s_stride) {
  const std::size_t N = hn::Lanes(d);
  VF a[4], b[4], c[4], e[4];
  for (std::size_t r = 0; r < 4; ++r) a[r] = b[r] = c[r] = e[r] = hn::Zero(d);
  std::size_t i = 0;
  for (; i + N <= dim; i += N) Step4x4(d, q, q_stride, i, k, vector_at<Loader>{d, i}, a, b, c, e);
  if (i < dim) Step4x4(d, q, q_stride, i, k, tail_at<Loader>{d, i, dim - i}, a, b, c, e);
  Sum8(d, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], s, s + s_stride);
  Sum8(d, c[0], c[1], c[2], c[3], e[0], e[1], e[2], e[3], s + 2 * s_stride, s + 3 * s_stride);
}
#endif

/// The score of one row for one head (window edges, where a block has few rows), the row read
/// from element `skip` on.
template <class Loader>
HWY_INLINE float Score1x1(DF d, const float* HWY_RESTRICT q, const std::byte* row, std::size_t dim,
                          std::size_t skip) {
  const std::size_t N = hn::Lanes(d);
  VF c = hn::Zero(d);
  std::size_t i = 0;
  for (; i + N <= dim; i += N)
    c = hn::MulAdd(hn::Load(d, q + i), Loader::load(d, row, skip + i), c);
  if (i < dim) c = hn::MulAdd(hn::Load(d, q + i), Loader::load_tail(d, row, skip + i, dim - i), c);
  return Sum1(d, c);
}

/// Scores of rows [from, n) for one head, eight at a time. Each row is read from element `skip`
/// on: 0 for the rows themselves, h · (elements between kv heads) for the same positions' rows
/// of the kv head h further on (AttendSpread's heads), the same loads as from their own pointers.
/// `Dim` is head_dim when known at compile time (see ScoreRows), else 0.
template <class Loader, std::size_t Dim>
HWY_INLINE void ScoreRowsOf(DF d, const float* HWY_RESTRICT q, const std::byte* const* k,
                            std::size_t from, std::size_t n, std::size_t head_dim, float* s,
                            line_feed& feed, std::size_t skip) {
  const std::size_t dim = Dim != 0 ? Dim : head_dim;
  std::size_t j = from;
  for (; j + 8 <= n; j += 8) {
    Score8x1<Loader>(d, q, k + j, dim, s + j, skip);
    feed.step();
  }
  for (; j < n; ++j) s[j] = Score1x1<Loader>(d, q, k[j], dim, skip);
}

// head_dims the f32 score tiles are compiled for as constants besides the general case, so their
// loops over head_dim unroll; the arithmetic is the same either way (f16 rows gain nothing so).
// ScoreRows and ScoreHeads each write the choice out: a generic dispatcher taking the call as a
// lambda is not inlined. Re-measure: scripts/bench-targets --shapes '/256/|/4096/2'
inline constexpr std::size_t unrolled_dims[] = {64, 128};

/// ScoreRowsOf, with head_dim a constant for f32 rows where it is one of unrolled_dims.
template <class Loader>
HWY_INLINE void ScoreRows(DF d, const float* HWY_RESTRICT q, const std::byte* const* k,
                          std::size_t from, std::size_t n, std::size_t dim, float* s,
                          line_feed& feed, std::size_t skip = 0) {
  if constexpr (std::is_same_v<typename Loader::type, float>) {
    if (dim == unrolled_dims[0])
      return ScoreRowsOf<Loader, unrolled_dims[0]>(d, q, k, from, n, dim, s, feed, skip);
    if (dim == unrolled_dims[1])
      return ScoreRowsOf<Loader, unrolled_dims[1]>(d, q, k, from, n, dim, s, feed, skip);
  }
  ScoreRowsOf<Loader, 0>(d, q, k, from, n, dim, s, feed, skip);
}

/// Tile calls ScoreHeads makes for n rows and `heads` heads (the steps its feed is spread over).
HWY_INLINE std::size_t ScoreTiles(std::size_t heads, std::size_t n) {
  const std::size_t quads = TakeWideGroups(heads) * (n / 4);
  return quads + heads / 2 * (n / 4) + heads % 2 * (n / 8);
}

/// Scores of n rows for `heads` query heads (rows qs + h·q_stride, scores s + h·s_stride):
/// heads in fours (RINGKV_WIDE_TILES) or pairs sharing each K load, four rows at a time; the
/// rest one head at a time. The feed gets a step after each tile.
/// `Dim` as in ScoreRowsOf.
template <class Loader, std::size_t Dim>
HWY_INLINE void ScoreHeadsOf(DF d, const float* HWY_RESTRICT qs, std::size_t q_stride,
                             std::size_t heads, const std::byte* const* k, std::size_t n,
                             std::size_t head_dim, float* s, std::size_t s_stride,
                             line_feed& feed) {
  const std::size_t dim = Dim != 0 ? Dim : head_dim;
  std::size_t h = 0;
#ifdef RINGKV_WIDE_TILES
  for (; h + 4 <= heads; h += 4) {
    const float* q = qs + h * q_stride;
    float* sh = s + h * s_stride;
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      Score4x4<Loader>(d, q, q_stride, k + j, dim, sh + j, s_stride);
      feed.step();
    }
    for (std::size_t g = 0; g < 4; ++g)
      ScoreRowsOf<Loader, Dim>(d, q + g * q_stride, k, j, n, dim, sh + g * s_stride, feed, 0);
  }
#endif
  for (; h + 2 <= heads; h += 2) {
    const float* qa = qs + h * q_stride;
    const float* qb = qa + q_stride;
    float* sa = s + h * s_stride;
    float* sb = sa + s_stride;
    std::size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      Score4x2<Loader>(d, qa, qb, k + j, dim, sa + j, sb + j);
      feed.step();
    }
    ScoreRowsOf<Loader, Dim>(d, qa, k, j, n, dim, sa, feed, 0);
    ScoreRowsOf<Loader, Dim>(d, qb, k, j, n, dim, sb, feed, 0);
  }
  if (h < heads)
    ScoreRowsOf<Loader, Dim>(d, qs + h * q_stride, k, 0, n, dim, s + h * s_stride, feed, 0);
}

/// ScoreHeadsOf, with head_dim a constant for f32 rows where it is one of unrolled_dims.
template <class Loader>
HWY_INLINE void ScoreHeads(DF d, const float* HWY_RESTRICT qs, std::size_t q_stride,
                           std::size_t heads, const std::byte* const* k, std::size_t n,
                           std::size_t dim, float* s, std::size_t s_stride, line_feed& feed) {
  if constexpr (std::is_same_v<typename Loader::type, float>) {
    if (dim == unrolled_dims[0])
      return ScoreHeadsOf<Loader, unrolled_dims[0]>(d, qs, q_stride, heads, k, n, dim, s, s_stride,
                                                    feed);
    if (dim == unrolled_dims[1])
      return ScoreHeadsOf<Loader, unrolled_dims[1]>(d, qs, q_stride, heads, k, n, dim, s, s_stride,
                                                    feed);
  }
  ScoreHeadsOf<Loader, 0>(d, qs, q_stride, heads, k, n, dim, s, s_stride, feed);
}

/// Σ a[i]·b[i] for two unaligned arrays, neither padded (two chains, then across lanes).
HWY_INLINE float Dot(DF d, const float* a, const float* b, std::size_t n) {
  const std::size_t N = hn::Lanes(d);
  VF e = hn::Zero(d), o = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    e = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), e);
    o = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), o);
  }
  if (i + N <= n) {
    e = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), e);
    i += N;
  }
  if (i < n) o = hn::MulAdd(LoadPartial(d, a + i, n - i), LoadPartial(d, b + i, n - i), o);
  return SumLanes(d, hn::Add(e, o));
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_DOT_INL_H_
