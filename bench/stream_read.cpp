// stream_read (see stream_read.h), compiled once per Highway target (skeleton.cc pattern).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "stream_read.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "stream_read.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv_bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

/// Σ over `steps` steps of eight vectors, load(i, k) the k-th vector of step i, in eight chains:
/// two adds per cycle at three cycles' latency need six to keep up with L1.
template <class Load>
HWY_INLINE float EightChains(DF d, std::size_t steps, Load load) {
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  for (std::size_t i = 0; i < steps; ++i) {
    a0 = hn::Add(a0, load(i, 0));
    a1 = hn::Add(a1, load(i, 1));
    a2 = hn::Add(a2, load(i, 2));
    a3 = hn::Add(a3, load(i, 3));
    a4 = hn::Add(a4, load(i, 4));
    a5 = hn::Add(a5, load(i, 5));
    a6 = hn::Add(a6, load(i, 6));
    a7 = hn::Add(a7, load(i, 7));
  }
  const auto sum =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

float StreamReadImpl(const float* p, std::size_t n) {
  const DF d;
  const std::size_t N = hn::Lanes(d), steps = n / (8 * N);
  float s = EightChains(
      d, steps, [&](std::size_t i, std::size_t k) { return hn::LoadU(d, p + i * 8 * N + k * N); });
  for (std::size_t i = steps * 8 * N; i < n; ++i) s += p[i];
  return s;
}

/// Where the k-th (0 … 7) vector of step i starts when a and b are read four vectors (of
/// Lanes(DF) elements) of each in turn: the paired order StreamReadPairImpl and StreamFmaPair
/// share.
template <class T>
HWY_INLINE const T* PairedAt(DF d, const T* a, const T* b, std::size_t i, std::size_t k) {
  const std::size_t N = hn::Lanes(d);
  return (k < 4 ? a : b) + i * 4 * N + k % 4 * N;
}

/// That vector as f32: floats as they are, f16 halves promoted (the conversion the kernel's f16
/// rows take on x86, F16C).
HWY_INLINE hn::Vec<DF> PairedVector(DF d, const float* a, const float* b, std::size_t i,
                                    std::size_t k) {
  return hn::LoadU(d, PairedAt(d, a, b, i, k));
}
HWY_INLINE hn::Vec<DF> PairedVector(DF d, const hwy::float16_t* a, const hwy::float16_t* b,
                                    std::size_t i, std::size_t k) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, PairedAt(d, a, b, i, k)));
}

HWY_INLINE hn::Vec<DF> PairedVector(DF d, const std::int8_t* a, const std::int8_t* b, std::size_t i,
                                    std::size_t k) {
  const hn::Rebind<std::int8_t, DF> d8;
  const hn::Rebind<std::int32_t, DF> di;
  return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, PairedAt(d, a, b, i, k))));
}

/// Four vectors of each array in turn: two streams in flight at once.
float StreamReadPairImpl(const float* a, const float* b, std::size_t n) {
  const DF d;
  const std::size_t N = hn::Lanes(d), steps = n / (4 * N);
  float s = EightChains(d, steps,
                        [&](std::size_t i, std::size_t k) { return PairedVector(d, a, b, i, k); });
  for (std::size_t i = steps * 4 * N; i < n; ++i) s += a[i] + b[i];
  return s;
}

/// As StreamReadPairImpl (n elements of each array, floats or f16), with G multiply-adds on
/// every vector read (one per query head of a kv head's group: the multiply-adds a decode step
/// must do on that vector, scores or V sums), into eight chains. With Exps, over rows of
/// head_dim elements, also the exps a step must take besides: after every head_dim / 4 steps
/// (Lanes positions' rows of K and V), one vector Exp per query head of the group (Lanes
/// positions' scores each), of values taken from the chains so it cannot be hoisted, summed into
/// a chain of its own (as the softmax's denominator).
template <std::size_t G, bool Exps, class T>
float StreamFmaPair(const T* a, const T* b, std::size_t n, std::size_t head_dim) {
  const DF d;
  const std::size_t N = hn::Lanes(d), steps = n / (4 * N);
  // Steps between two rounds of exps; without exps, all of them in one round.
  const std::size_t period = std::max<std::size_t>(1, Exps ? head_dim / 4 : steps);
  hn::Vec<DF> q[G];
  for (std::size_t h = 0; h < G; ++h) q[h] = hn::Set(d, 1.0f + 1e-7f * float(h));
  hn::Vec<DF> acc[8];
  for (auto& x : acc) x = hn::Zero(d);
  auto esum = hn::Zero(d);
  for (std::size_t i0 = 0; i0 < steps; i0 += period) {
    for (std::size_t i = i0; i < std::min(steps, i0 + period); ++i)
      for (std::size_t k = 0; k < 8; ++k) {
        const auto x = PairedVector(d, a, b, i, k);
        for (std::size_t h = 0; h < G; ++h)
          acc[(k + h) % 8] = hn::MulAdd(q[h], x, acc[(k + h) % 8]);
      }
    if constexpr (Exps) {
      const auto tiny = hn::Set(d, -1e-30f);
      for (std::size_t h = 0; h < G; ++h)
        esum = hn::Add(esum, hn::Exp(d, hn::Mul(acc[h % 8], tiny)));
    }
  }
  auto sum = esum;
  for (std::size_t k = 0; k < 8; ++k) sum = hn::Add(sum, acc[k]);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

/// StreamFmaPair<G, Exps> for a group of 1, 2, 4 or 8 (others as 8).
template <bool Exps, class T>
float StreamFmaPairGroup(const T* a, const T* b, std::size_t n, std::size_t group,
                         std::size_t head_dim) {
  switch (group) {
    case 1:
      return StreamFmaPair<1, Exps>(a, b, n, head_dim);
    case 2:
      return StreamFmaPair<2, Exps>(a, b, n, head_dim);
    case 4:
      return StreamFmaPair<4, Exps>(a, b, n, head_dim);
    default:
      return StreamFmaPair<8, Exps>(a, b, n, head_dim);
  }
}

float StreamFmaPairImpl(const float* a, const float* b, std::size_t n, std::size_t group) {
  return StreamFmaPairGroup<false>(a, b, n, group, 0);
}

float StreamFmaPairF16Impl(const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                           std::size_t group) {
  return StreamFmaPairGroup<false>(reinterpret_cast<const hwy::float16_t*>(a),
                                   reinterpret_cast<const hwy::float16_t*>(b), n, group, 0);
}

float StreamFmaExpPairImpl(const float* a, const float* b, std::size_t n, std::size_t group,
                           std::size_t head_dim) {
  return StreamFmaPairGroup<true>(a, b, n, group, head_dim);
}

/// Eight independent FMA chains, `repeats` steps: one multiply-add per lane each.
float FmaPeakImpl(std::size_t repeats) {
  const DF d;
  const auto m = hn::Set(d, 0.999999f), e = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (std::size_t r = 0; r < repeats; ++r) {
    a0 = hn::MulAdd(a0, m, e);
    a1 = hn::MulAdd(a1, m, e);
    a2 = hn::MulAdd(a2, m, e);
    a3 = hn::MulAdd(a3, m, e);
    a4 = hn::MulAdd(a4, m, e);
    a5 = hn::MulAdd(a5, m, e);
    a6 = hn::MulAdd(a6, m, e);
    a7 = hn::MulAdd(a7, m, e);
  }
  const auto sum =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

std::size_t FmaLanesImpl() { return hn::Lanes(DF()); }

float StreamFmaExpPairInt8Impl(const std::int8_t* a, const std::int8_t* b, std::size_t n,
                               std::size_t group, std::size_t head_dim) {
  return StreamFmaPairGroup<true>(a, b, n, group, head_dim);
}

}  // namespace ringkv_bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv_bench {
HWY_EXPORT(StreamReadImpl);
HWY_EXPORT(StreamReadPairImpl);
HWY_EXPORT(StreamFmaPairImpl);
HWY_EXPORT(StreamFmaPairF16Impl);
HWY_EXPORT(StreamFmaExpPairImpl);
HWY_EXPORT(FmaPeakImpl);
HWY_EXPORT(FmaLanesImpl);
float fma_chains(std::size_t repeats) { return HWY_DYNAMIC_DISPATCH(FmaPeakImpl)(repeats); }
std::size_t fma_lanes() { return HWY_DYNAMIC_DISPATCH(FmaLanesImpl)(); }
HWY_EXPORT(StreamFmaExpPairInt8Impl);
float stream_fma_exp_pair_int8(const std::int8_t* a, const std::int8_t* b, std::size_t n,
                               std::size_t group, std::size_t head_dim) {
  return HWY_DYNAMIC_DISPATCH(StreamFmaExpPairInt8Impl)(a, b, n, group, head_dim);
}
float stream_fma_exp_pair(const float* a, const float* b, std::size_t n, std::size_t group,
                          std::size_t head_dim) {
  return HWY_DYNAMIC_DISPATCH(StreamFmaExpPairImpl)(a, b, n, group, head_dim);
}
float stream_fma_pair(const float* a, const float* b, std::size_t n, std::size_t group) {
  return HWY_DYNAMIC_DISPATCH(StreamFmaPairImpl)(a, b, n, group);
}
float stream_fma_pair_f16(const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                          std::size_t group) {
  return HWY_DYNAMIC_DISPATCH(StreamFmaPairF16Impl)(a, b, n, group);
}
float stream_read(const float* p, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadImpl)(p, n);
}
float stream_read_pair(const float* a, const float* b, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadPairImpl)(a, b, n);
}
}  // namespace ringkv_bench
#endif
