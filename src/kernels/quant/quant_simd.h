// The compressed-window decode kernel's entry point, declared without Highway (docs/design.md):
// attention straight from TurboQuant / int8 codes. Arguments are trusted (checked by the caller).
//
// Arithmetic: the query is scaled and rotated once per step (q' = scale·Π·q). Per segment of
// absolute positions (merged left to right, as the f32 kernel) every key is scored first:
// TurboQuant keys (slot groups, quant_codec.h) by looking their codes up in 7-bit tables of
// q'ᵢ·c (one scale a query head), summed exactly in integers, times the scale and the key's
// norm; with QJL plus the same of ⟨scale·sqrt(π/2)/d·S·q, sign bits⟩ times ‖k‖·‖r‖; int8 keys by
// an exact integer dot product with the query rounded to 16 bits. Then per block of 64 positions
// the online-softmax step and the V rows expanded in registers (the codebook in SIMD lanes,
// TableLookupLanes) into the block's weighted sums. V is accumulated in the rotated space and
// rotated back once per output row. Nothing else is decoded, nothing is allocated; the result
// depends only on the positions' codes.
#pragma once
#include <cstddef>

#include "quant/quant_codec.h"
#include "kernels/simd.h"

namespace ringkv::simd {

/// head_dim limit of the compressed kernel (its expansion tiles are stack buffers).
inline constexpr std::size_t max_compressed_head_dim = 256;

/// One side's compressed window: how rows are encoded, and up to max_runs runs in position order.
struct code_window {
  codec::rows_format format;
  codec::rows_run runs[max_runs];
  std::size_t run_count = 0;
};

/// One decode step over compressed K/V. Query head q reads kv head q / (q_heads / kv_heads).
struct compressed_problem {
  const float* query = nullptr;  // [q_heads, head_dim], original coordinates
  code_window keys, values;      // the same positions; TurboQuant keys/values share rotations
  std::size_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  // The query heads this call computes, [q_first, q_last) (a thread's share of a step): a head's
  // arithmetic does not depend on which other heads a call takes, so any split gives its bits.
  std::size_t q_first = 0, q_last = 0;
};

/// Rows [q_first, q_last) of out [q_heads, head_dim] = softmax(q·K̂ᵀ·scale (+ sink)) · V̂;
/// O(window · (heads + decode) · head_dim), no allocation; other rows of `out` are untouched.
void compressed_decode(const compressed_problem& p, const float* sinks, float* out);
/// The Highway targets compressed_decode was compiled for (HWY_TARGETS' bits: the kernels' and
/// AVX3_DL), so tests run exactly those; O(1).
std::int64_t compressed_targets();

}  // namespace ringkv::simd
