// ggml_style_decode (see ggml_style.h), compiled once per Highway target (skeleton.cc pattern).
// The vector widths follow ggml's AVX2 build: four accumulators of one vector each per step.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>

#include "ggml_style.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ggml_style.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv_bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

/// Σ x[i] · y[i]: four vector chains over steps of 4 vectors, their sum reduced, the rest scalar.
float Dot(DF d, const float* x, const float* y, std::size_t n) {
  const std::size_t N = hn::Lanes(d), step = 4 * N, whole = n / step * step;
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  for (std::size_t i = 0; i < whole; i += step) {
    s0 = hn::MulAdd(hn::LoadU(d, x + i), hn::LoadU(d, y + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, x + i + N), hn::LoadU(d, y + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(d, x + i + 2 * N), hn::LoadU(d, y + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(d, x + i + 3 * N), hn::LoadU(d, y + i + 3 * N), s3);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s2), hn::Add(s1, s3))));
  for (std::size_t i = whole; i < n; ++i) s += x[i] * y[i];
  return s;
}

/// y[i] += x[i] · w, four vectors a step, the rest scalar.
void Mad(DF d, float* y, const float* x, float w, std::size_t n) {
  const std::size_t N = hn::Lanes(d), step = 4 * N, whole = n / step * step;
  const auto vw = hn::Set(d, w);
  for (std::size_t i = 0; i < whole; i += step)
    for (std::size_t j = 0; j < step; j += N)
      hn::StoreU(hn::MulAdd(hn::LoadU(d, x + i + j), vw, hn::LoadU(d, y + i + j)), d, y + i + j);
  for (std::size_t i = whole; i < n; ++i) y[i] += x[i] * w;
}

/// y[i] ·= w.
void Scale(DF d, float* y, float w, std::size_t n) {
  const std::size_t N = hn::Lanes(d), whole = n / N * N;
  const auto vw = hn::Set(d, w);
  for (std::size_t i = 0; i < whole; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, y + i), vw), d, y + i);
  for (std::size_t i = whole; i < n; ++i) y[i] *= w;
}

void GgmlStyleDecode(const float* query, std::size_t h0, std::size_t h1, std::size_t group,
                     std::size_t dim, const ggml_run* runs, std::size_t n_runs, float scale,
                     float* out, float* acc) {
  const DF d;
  for (std::size_t h = h0; h < h1; ++h) {
    const float* q = query + h * dim;  // [dim]
    float m = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    std::memset(acc, 0, dim * sizeof(float));  // [dim]
    for (std::size_t r = 0; r < n_runs; ++r) {
      const float* k = runs[r].k + h / group * runs[r].head_stride;  // [positions, dim]
      const float* v = runs[r].v + h / group * runs[r].head_stride;  // [positions, dim]
      for (std::size_t p = 0; p < runs[r].positions; ++p) {
        const float s = Dot(d, k + p * dim, q, dim) * scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > m) {  // a new maximum: the accumulator is rescaled, this row's weight is 1
          ms = std::exp(m - s);
          m = s;
          Scale(d, acc, ms, dim);
        } else {
          vs = std::exp(s - m);
        }
        Mad(d, acc, v + p * dim, vs, dim);
        sum = sum * ms + vs;
      }
    }
    std::memcpy(out + h * dim, acc, dim * sizeof(float));
    Scale(d, out + h * dim, sum == 0.0f ? 0.0f : 1.0f / sum, dim);
  }
}

}  // namespace ringkv_bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv_bench {
HWY_EXPORT(GgmlStyleDecode);
void ggml_style_decode(const float* query, std::size_t h0, std::size_t h1, std::size_t group,
                       std::size_t dim, std::span<const ggml_run> runs, float scale, float* out,
                       float* acc) {
  HWY_DYNAMIC_DISPATCH(GgmlStyleDecode)(query, h0, h1, group, dim, runs.data(), runs.size(), scale,
                                        out, acc);
}
}  // namespace ringkv_bench
#endif
