// A same-process stand-in for ggml's CPU flash attention at decode (one query row per head), so
// the benchmark can compare ringkv with ggml's algorithm in the same minutes instead of only
// with figures measured elsewhere. Re-written from the algorithm (not ggml's code): per query
// head, per position in order, a 4-accumulator SIMD dot with the K row, the scalar online
// softmax update (expf on every new maximum or weight), the accumulator rescaled on a new
// maximum and the V row added with a SIMD multiply-add. K and V are read once per query head,
// as ggml's `_one_chunk` loop does. Private to the benchmark; Highway behind this header.
#pragma once
#include <cstddef>
#include <span>

namespace ringkv_bench {

/// One run of a window, in position order: `positions` K and V rows per kv head from `k` / `v`
/// on, kv head h's rows `head_stride` floats after kv head h − 1's, rows `dim` floats apart.
struct ggml_run {
  const float* k;
  const float* v;
  std::size_t positions, head_stride;
};

/// Query heads [h0, h1) of `query` ([q_heads, dim]) over the runs, kv head h / group each, into
/// `out` (same shape); `acc` is [dim] scratch. O((h1 − h0) · positions · dim), nothing allocated.
void ggml_style_decode(const float* query, std::size_t h0, std::size_t h1, std::size_t group,
                       std::size_t dim, std::span<const ggml_run> runs, float scale, float* out,
                       float* acc);

}  // namespace ringkv_bench
