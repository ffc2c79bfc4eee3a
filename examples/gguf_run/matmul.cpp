// hwy/examples/skeleton.cc pattern: foreach_target.h compiles this file once per target, and
// HWY_DYNAMIC_DISPATCH picks the best one at the first call.
#include <algorithm>
#include <cstddef>
#include <utility>

#include "matmul.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace gguf_run::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Dot products of R weight rows (`cols` apart) with T tokens (`cols` apart), into
/// y[t * y_stride + r]. Each product in the same steps whatever R and T: one accumulator over
/// columns a vector at a time, the lanes summed, then the scalar tail; so a token's result never
/// depends on the rows or tokens tiled with it (the runner's chunking and batch invariance). The
/// tile only saves loads: a weight vector serves T tokens, a token vector R rows.
/// `ahead` [ahead_lines cache lines]: weights a later tile reads, prefetched a few lines an
/// iteration so the memory keeps streaming while the tiles of a row group's other tokens run
/// out of the L1.
template <std::size_t R, std::size_t T>
HWY_INLINE void TileDots(const float* HWY_RESTRICT w, std::size_t cols, const float* HWY_RESTRICT x,
                         float* HWY_RESTRICT y, std::size_t y_stride, const char* ahead,
                         std::size_t ahead_lines) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  using V = hn::Vec<decltype(d)>;
  V a[R][T];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) a[r][t] = hn::Zero(d);
  const std::size_t iterations = cols / N;
  const std::size_t per_iteration =
      iterations == 0 ? 0 : (ahead_lines + iterations - 1) / iterations;
  std::size_t c = 0;
  for (; c + N <= cols; c += N) {
    for (std::size_t i = 0; i < per_iteration && ahead_lines > 0; ++i, --ahead_lines, ahead += 64)
      hwy::Prefetch(ahead);
    V wv[R];
    for (std::size_t r = 0; r < R; ++r) wv[r] = hn::LoadU(d, w + r * cols + c);
    for (std::size_t t = 0; t < T; ++t) {
      const V xv = hn::LoadU(d, x + t * cols + c);
      for (std::size_t r = 0; r < R; ++r) a[r][t] = hn::MulAdd(wv[r], xv, a[r][t]);
    }
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) {
      float tail = 0.0f;
      for (std::size_t k = c; k < cols; ++k) tail += w[r * cols + k] * x[t * cols + k];
      y[t * y_stride + r] = hn::GetLane(hn::SumOfLanes(d, a[r][t])) + tail;
    }
}

// A tile's R·T accumulators, R weight and one token vector fit the registers (32 with AVX-512,
// 16 below). Re-measure: scripts/bench-serve (the runner's decode of N sequences).
#if HWY_TARGET <= HWY_AVX3
constexpr std::size_t tile_tokens = 4;
#else
constexpr std::size_t tile_tokens = 2;
#endif
constexpr std::size_t tile_rows = 4;

/// Tokens [t, n) of rows [r, r + RR) in tiles of up to tile_tokens; the tiles share the
/// prefetch of the `ahead_bytes` at `ahead` (the rows after these), a slice a tile.
template <std::size_t RR>
HWY_INLINE void RowTiles(const float* w, std::size_t cols, const float* x, std::size_t n, float* y,
                         std::size_t y_stride, const float* ahead, std::size_t ahead_bytes) {
  const std::size_t tiles = n / tile_tokens + n % tile_tokens;
  const std::size_t lines = ahead_bytes / 64, slice = (lines + tiles - 1) / tiles;
  const char* next = reinterpret_cast<const char*>(ahead);
  std::size_t left = lines;
  const auto take = [&] {
    const std::size_t k = std::min(slice, left);
    const char* at = next;
    next += 64 * k;
    left -= k;
    return std::pair(at, k);
  };
  std::size_t t = 0;
  for (; t + tile_tokens <= n; t += tile_tokens) {
    const auto [at, k] = take();
    TileDots<RR, tile_tokens>(w, cols, x + t * cols, y + t * y_stride, y_stride, at, k);
  }
  for (; t < n; ++t) {
    const auto [at, k] = take();
    TileDots<RR, 1>(w, cols, x + t * cols, y + t * y_stride, y_stride, at, k);
  }
}

void MatmulRows(const float* w, std::size_t row_begin, std::size_t row_end, std::size_t cols,
                const float* x, std::size_t n, float* y, std::size_t y_stride) {
  std::size_t r = row_begin;
  // Several tokens: while a row group's tiles run from the L1, the next group is fetched.
  const std::size_t group_bytes = tile_rows * cols * sizeof(float);
  if (n > 1)
    for (; r + tile_rows <= row_end; r += tile_rows) {
      const std::size_t next = r + 2 * tile_rows <= row_end ? group_bytes : 0;
      RowTiles<tile_rows>(w + r * cols, cols, x, n, y + r, y_stride, w + (r + tile_rows) * cols,
                          next);
    }
  // One token (a decode step alone) streams one row at a time, as fast as tiles of rows.
  for (; r < row_end; ++r) RowTiles<1>(w + r * cols, cols, x, n, y + r, y_stride, nullptr, 0);
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
