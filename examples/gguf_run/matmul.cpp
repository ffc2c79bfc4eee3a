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

/// Dot products of R weight rows (`cols` apart) with T tokens (`cols` apart), into
/// y[t * y_stride + r]. Each product in the same steps whatever R and T: two accumulators over
/// columns in steps of two vectors, one more vector into the first, the lanes summed, then the
/// scalar tail; so a token's result never depends on the rows or tokens tiled with it (the
/// runner's chunking and batch invariance). The tile only saves loads: a weight vector serves T
/// tokens, a token vector R rows.
template <std::size_t R, std::size_t T>
HWY_INLINE void TileDots(const float* HWY_RESTRICT w, std::size_t cols, const float* HWY_RESTRICT x,
                         float* HWY_RESTRICT y, std::size_t y_stride) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  using V = hn::Vec<decltype(d)>;
  V a0[R][T], a1[R][T];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) a0[r][t] = a1[r][t] = hn::Zero(d);
  std::size_t c = 0;
  for (; c + 2 * N <= cols; c += 2 * N) {
    V w0[R], w1[R];
    for (std::size_t r = 0; r < R; ++r) {
      w0[r] = hn::LoadU(d, w + r * cols + c);
      w1[r] = hn::LoadU(d, w + r * cols + c + N);
    }
    for (std::size_t t = 0; t < T; ++t) {
      const V x0 = hn::LoadU(d, x + t * cols + c), x1 = hn::LoadU(d, x + t * cols + c + N);
      for (std::size_t r = 0; r < R; ++r) {
        a0[r][t] = hn::MulAdd(w0[r], x0, a0[r][t]);
        a1[r][t] = hn::MulAdd(w1[r], x1, a1[r][t]);
      }
    }
  }
  if (c + N <= cols) {
    for (std::size_t t = 0; t < T; ++t) {
      const V x0 = hn::LoadU(d, x + t * cols + c);
      for (std::size_t r = 0; r < R; ++r)
        a0[r][t] = hn::MulAdd(hn::LoadU(d, w + r * cols + c), x0, a0[r][t]);
    }
    c += N;
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) {
      float tail = 0.0f;
      for (std::size_t k = c; k < cols; ++k) tail += w[r * cols + k] * x[t * cols + k];
      y[t * y_stride + r] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0[r][t], a1[r][t]))) + tail;
    }
}

// Tokens a tile: its R·T·2 accumulators, R·2 weight and 2 token vectors fit the registers (32
// with AVX-512, 16 below). Re-measure: scripts/bench-serve (the runner's decode of N sequences).
#if HWY_TARGET <= HWY_AVX3
constexpr std::size_t tile_tokens = 4;
#else
constexpr std::size_t tile_tokens = 2;
#endif
constexpr std::size_t tile_rows = 2;

/// Tokens [t, n) of rows [r, r + RR) in tiles of up to tile_tokens.
template <std::size_t RR>
HWY_INLINE void RowTiles(const float* w, std::size_t cols, const float* x, std::size_t n, float* y,
                         std::size_t y_stride) {
  std::size_t t = 0;
  for (; t + tile_tokens <= n; t += tile_tokens)
    TileDots<RR, tile_tokens>(w, cols, x + t * cols, y + t * y_stride, y_stride);
  for (; t < n; ++t) TileDots<RR, 1>(w, cols, x + t * cols, y + t * y_stride, y_stride);
}

void MatmulRows(const float* w, std::size_t row_begin, std::size_t row_end, std::size_t cols,
                const float* x, std::size_t n, float* y, std::size_t y_stride) {
  std::size_t r = row_begin;
  // One token (a decode step alone) streams one row at a time: pairs of rows ran it ~10% slower.
  if (n > 1)
    for (; r + tile_rows <= row_end; r += tile_rows)
      RowTiles<tile_rows>(w + r * cols, cols, x, n, y + r, y_stride);
  for (; r < row_end; ++r) RowTiles<1>(w + r * cols, cols, x, n, y + r, y_stride);
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
