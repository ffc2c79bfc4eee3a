// hwy/examples/skeleton.cc pattern, as matmul.cpp. Element by element: a token's results never
// depend on the rows around it, so batching keeps the bits.
#include <algorithm>
#include <cstddef>

#include "activation.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "activation.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace gguf_run::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Highway's Exp holds to 88.72 (e^88.72 is near FLT_MAX); past it silu(x) = x / e^-x is 0.
constexpr float exp_limit = 88.0f;

/// Applies f to every lane of gate[0, n) times up, the tail through a zero-padded copy (this
/// Highway has no partial loads).
template <class F>
HWY_INLINE void Each(float* gate, const float* up, std::size_t n, F f) {
  const DF d;
  const std::size_t N = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(f(d, hn::LoadU(d, gate + i)), hn::LoadU(d, up + i)), d, gate + i);
  if (i == n) return;
  HWY_ALIGN float g[64] = {}, u[64] = {};  // a vector's lanes, at most 64 floats on any target
  std::copy(gate + i, gate + n, g);
  std::copy(up + i, up + n, u);
  hn::Store(hn::Mul(f(d, hn::Load(d, g)), hn::Load(d, u)), d, g);
  std::copy(g, g + (n - i), gate + i);
}

void SiluTimes(float* gate, const float* up, std::size_t n) {
  Each(gate, up, n, [](DF d, VF x) {
    const VF e = hn::Exp(d, hn::Min(hn::Neg(x), hn::Set(d, exp_limit)));
    return hn::Div(x, hn::Add(hn::Set(d, 1.0f), e));
  });
}

void GeluTimes(float* gate, const float* up, std::size_t n) {
  Each(gate, up, n, [](DF d, VF x) {
    const VF inner = hn::Mul(hn::Mul(hn::Set(d, sqrt_2_over_pi), x),
                             hn::MulAdd(hn::Mul(hn::Set(d, gelu_coef_a), x), x, hn::Set(d, 1.0f)));
    const VF half_x = hn::Mul(hn::Set(d, 0.5f), x);
    return hn::Mul(half_x, hn::Add(hn::Set(d, 1.0f), hn::Tanh(d, inner)));
  });
}

}  // namespace gguf_run::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gguf_run {
HWY_EXPORT(SiluTimes);
HWY_EXPORT(GeluTimes);

void silu_times(float* gate, const float* up, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(SiluTimes)(gate, up, n);
}
void gelu_times(float* gate, const float* up, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(GeluTimes)(gate, up, n);
}
}  // namespace gguf_run
#endif
