// Per-target dot products: one query row against several K rows at once (a tile), with the same
// arithmetic for every row whatever the tile size, so tiling never changes a score.
#if defined(RINGKV_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_DOT_INL_H_
#undef RINGKV_DOT_INL_H_
#else
#define RINGKV_DOT_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"
#include "rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

// The per-row arithmetic: two accumulator chains over head_dim (even and odd vectors), the
// partial last vector into the odd chain, then (even + odd) reduced across lanes. Every tile
// size below calls these same steps per row.

template <class Loader>
HWY_INLINE void DotPair(DF d, VF q0, VF q1, const std::byte* row, std::size_t i, VF& even,
                        VF& odd) {
  even = hn::MulAdd(q0, Loader::load(d, row, i), even);
  odd = hn::MulAdd(q1, Loader::load(d, row, i + hn::Lanes(d)), odd);
}

template <class Loader>
HWY_INLINE void DotOne(DF d, VF q0, const std::byte* row, std::size_t i, VF& even) {
  even = hn::MulAdd(q0, Loader::load(d, row, i), even);
}

template <class Loader>
HWY_INLINE void DotTail(DF d, VF q0, const std::byte* row, std::size_t i, std::size_t n, VF& odd) {
  odd = hn::MulAdd(q0, Loader::load_tail(d, row, i, n), odd);
}

HWY_INLINE float DotFinal(DF d, VF even, VF odd) {
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(even, odd)));
}

/// Scores of four rows against q (zero-padded to a whole number of vectors, aligned); four
/// rows in flight hide the FMA latency of each row's chains.
template <class Loader>
HWY_INLINE void DotTile4(DF d, const float* HWY_RESTRICT q, const std::byte* const* rows,
                         std::size_t dim, float* out) {
  const std::size_t N = hn::Lanes(d);
  VF e0 = hn::Zero(d), e1 = hn::Zero(d), e2 = hn::Zero(d), e3 = hn::Zero(d);
  VF o0 = hn::Zero(d), o1 = hn::Zero(d), o2 = hn::Zero(d), o3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 2 * N <= dim; i += 2 * N) {
    const VF q0 = hn::Load(d, q + i), q1 = hn::Load(d, q + i + N);
    DotPair<Loader>(d, q0, q1, rows[0], i, e0, o0);
    DotPair<Loader>(d, q0, q1, rows[1], i, e1, o1);
    DotPair<Loader>(d, q0, q1, rows[2], i, e2, o2);
    DotPair<Loader>(d, q0, q1, rows[3], i, e3, o3);
  }
  if (i + N <= dim) {
    const VF q0 = hn::Load(d, q + i);
    DotOne<Loader>(d, q0, rows[0], i, e0);
    DotOne<Loader>(d, q0, rows[1], i, e1);
    DotOne<Loader>(d, q0, rows[2], i, e2);
    DotOne<Loader>(d, q0, rows[3], i, e3);
    i += N;
  }
  if (i < dim) {
    const VF q0 = hn::Load(d, q + i);
    DotTail<Loader>(d, q0, rows[0], i, dim - i, o0);
    DotTail<Loader>(d, q0, rows[1], i, dim - i, o1);
    DotTail<Loader>(d, q0, rows[2], i, dim - i, o2);
    DotTail<Loader>(d, q0, rows[3], i, dim - i, o3);
  }
  out[0] = DotFinal(d, e0, o0);
  out[1] = DotFinal(d, e1, o1);
  out[2] = DotFinal(d, e2, o2);
  out[3] = DotFinal(d, e3, o3);
}

/// The score of one row, with exactly DotTile4's per-row arithmetic.
template <class Loader>
HWY_INLINE float DotTile1(DF d, const float* HWY_RESTRICT q, const std::byte* row,
                          std::size_t dim) {
  const std::size_t N = hn::Lanes(d);
  VF e = hn::Zero(d), o = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 2 * N <= dim; i += 2 * N)
    DotPair<Loader>(d, hn::Load(d, q + i), hn::Load(d, q + i + N), row, i, e, o);
  if (i + N <= dim) {
    DotOne<Loader>(d, hn::Load(d, q + i), row, i, e);
    i += N;
  }
  if (i < dim) DotTail<Loader>(d, hn::Load(d, q + i), row, i, dim - i, o);
  return DotFinal(d, e, o);
}

/// Scores of n rows against q into out[0, n).
template <class Loader>
HWY_INLINE void DotRows(DF d, const float* HWY_RESTRICT q, const std::byte* const* rows,
                        std::size_t n, std::size_t dim, float* out) {
  std::size_t j = 0;
  for (; j + 4 <= n; j += 4) DotTile4<Loader>(d, q, rows + j, dim, out + j);
  for (; j < n; ++j) out[j] = DotTile1<Loader>(d, q, rows[j], dim);
}

/// Σ a[i]·b[i] for two unaligned arrays, neither padded: the same chains as a score.
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
  return DotFinal(d, e, o);
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_DOT_INL_H_
