// hwy/examples/skeleton.cc pattern: foreach_target.h compiles this file once per target, and
// HWY_DYNAMIC_DISPATCH picks the best one at the first call.
#include <cstddef>

#include "matmul.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace gguf_run::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Dot products of one weight row with T tokens (T = 1 … 4): two accumulators a token over
/// columns in steps of two vectors, one more vector, then the scalar tail; the same steps for
/// every T, so the sum of a token never depends on its neighbours.
template <std::size_t T>
HWY_INLINE void RowDots(const float* HWY_RESTRICT w, std::size_t cols, const float* HWY_RESTRICT x,
                        float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  using V = hn::Vec<decltype(d)>;
  V a0[T], a1[T];
  for (std::size_t t = 0; t < T; ++t) a0[t] = a1[t] = hn::Zero(d);
  std::size_t c = 0;
  for (; c + 2 * N <= cols; c += 2 * N) {
    const V w0 = hn::LoadU(d, w + c), w1 = hn::LoadU(d, w + c + N);
    for (std::size_t t = 0; t < T; ++t) {
      a0[t] = hn::MulAdd(w0, hn::LoadU(d, x + t * cols + c), a0[t]);
      a1[t] = hn::MulAdd(w1, hn::LoadU(d, x + t * cols + c + N), a1[t]);
    }
  }
  if (c + N <= cols) {
    const V w0 = hn::LoadU(d, w + c);
    for (std::size_t t = 0; t < T; ++t)
      a0[t] = hn::MulAdd(w0, hn::LoadU(d, x + t * cols + c), a0[t]);
    c += N;
  }
  for (std::size_t t = 0; t < T; ++t) {
    float tail = 0.0f;
    for (std::size_t k = c; k < cols; ++k) tail += w[k] * x[t * cols + k];
    out[t] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0[t], a1[t]))) + tail;
  }
}

void MatmulRows(const float* w, std::size_t row_begin, std::size_t row_end, std::size_t cols,
                const float* x, std::size_t n, float* y, std::size_t y_stride) {
  float out[4];
  for (std::size_t r = row_begin; r < row_end; ++r) {
    const float* wr = w + r * cols;
    std::size_t t = 0;
    for (; t + 4 <= n; t += 4) {
      RowDots<4>(wr, cols, x + t * cols, out);
      for (std::size_t k = 0; k < 4; ++k) y[(t + k) * y_stride + r] = out[k];
    }
    for (; t < n; ++t) {
      RowDots<1>(wr, cols, x + t * cols, out);
      y[t * y_stride + r] = out[0];
    }
  }
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace gguf_run::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gguf_run {
HWY_EXPORT(MatmulRows);
HWY_EXPORT(TargetName);

void matmul_rows(const float* w, std::size_t row_begin, std::size_t row_end, std::size_t cols,
                 const float* x, std::size_t n, float* y, std::size_t y_stride) {
  HWY_DYNAMIC_DISPATCH(MatmulRows)(w, row_begin, row_end, cols, x, n, y, y_stride);
}

const char* matmul_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
}  // namespace gguf_run
#endif
