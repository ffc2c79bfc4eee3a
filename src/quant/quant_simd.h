// The compressed-window decode kernel's entry point, declared without Highway (docs/design.md):
// attention straight from TurboQuant / int8 codes. Arguments are trusted (checked by the caller).
//
// Arithmetic: the query is scaled and rotated once per step (q' = scale·Π·q); for each block of
// absolute positions (as the f32 kernel: blocks of block_positions, segments merged left to
// right) the block's K and V codes of one kv head are expanded once for the whole query-head
// group — the 2^b-entry codebook held in SIMD lanes and indexed with TableLookupLanes, times the
// row's norm — into an L1 tile of block_positions rows, which the f32 online-softmax step then
// scores and accumulates. With QJL, each score adds ‖k‖·‖r‖·⟨scale·sqrt(π/2)/d·S·q, sign bits⟩.
// V is accumulated in the rotated space and rotated back once per output row. Nothing else is
// decoded, nothing is allocated; the result depends only on the positions' codes.
#pragma once
#include <cstddef>

#include "quant_codec.h"
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
};

/// out [q_heads, head_dim] = softmax(q·K̂ᵀ·scale (+ sink)) · V̂; O(window · (q_heads + decode) ·
/// head_dim), no allocation.
void compressed_decode(const compressed_problem& p, const float* sinks, float* out);

}  // namespace ringkv::simd
