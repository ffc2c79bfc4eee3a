// stream_read (see stream_read.h), compiled once per Highway target (skeleton.cc pattern).
#include <cstddef>

#include "stream_read.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "stream_read.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv_bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float StreamReadImpl(const float* p, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  // Eight chains: two adds per cycle at three cycles' latency need six to keep up with L1.
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto a4 = hn::Zero(d), a5 = hn::Zero(d), a6 = hn::Zero(d), a7 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 8 * N <= n; i += 8 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * N));
    a4 = hn::Add(a4, hn::LoadU(d, p + i + 4 * N));
    a5 = hn::Add(a5, hn::LoadU(d, p + i + 5 * N));
    a6 = hn::Add(a6, hn::LoadU(d, p + i + 6 * N));
    a7 = hn::Add(a7, hn::LoadU(d, p + i + 7 * N));
  }
  const auto sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                           hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  float s = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) s += p[i];
  return s;
}

float StreamReadPairImpl(const float* a, const float* b, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  // Four vectors of each array in turn, eight chains as above: two streams in flight at once.
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, a + i));
    a1 = hn::Add(a1, hn::LoadU(d, a + i + N));
    a2 = hn::Add(a2, hn::LoadU(d, a + i + 2 * N));
    a3 = hn::Add(a3, hn::LoadU(d, a + i + 3 * N));
    b0 = hn::Add(b0, hn::LoadU(d, b + i));
    b1 = hn::Add(b1, hn::LoadU(d, b + i + N));
    b2 = hn::Add(b2, hn::LoadU(d, b + i + 2 * N));
    b3 = hn::Add(b3, hn::LoadU(d, b + i + 3 * N));
  }
  const auto sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                           hn::Add(hn::Add(b0, b1), hn::Add(b2, b3)));
  float s = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) s += a[i] + b[i];
  return s;
}

}  // namespace ringkv_bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv_bench {
HWY_EXPORT(StreamReadImpl);
HWY_EXPORT(StreamReadPairImpl);
float stream_read(const float* p, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadImpl)(p, n);
}
float stream_read_pair(const float* a, const float* b, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(StreamReadPairImpl)(a, b, n);
}
}  // namespace ringkv_bench
#endif
