// The roofs of the benchmarks: reads memory as fast as this CPU can, and multiply-adds as fast
// as it can (Highway, dynamic dispatch), nothing else. Private to the benchmarks.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ringkv_bench {
/// Σ p[i] over n floats, with enough independent vector sums that only loads limit it; O(n).
float stream_read(const float* p, std::size_t n);
/// Σ a[i] + b[i] over n floats of each, the two arrays read in turn (two streams); O(n).
float stream_read_pair(const float* a, const float* b, std::size_t n);
/// stream_read_pair with `group` (1, 2, 4 or 8) multiply-adds on every vector read: the least
/// arithmetic a decode step with `group` query heads per kv head does on those bytes; O(n·group).
float stream_fma_pair(const float* a, const float* b, std::size_t n, std::size_t group);
/// stream_fma_pair with one vector exp per Lanes scores besides (`group` scores a position, a
/// position every head_dim elements): the floor with the exps a step must take; O(n·group).
float stream_fma_exp_pair(const float* a, const float* b, std::size_t n, std::size_t group,
                          std::size_t head_dim);
/// stream_fma_pair over n f16 elements (bits) of each array, each vector promoted to f32 first:
/// the floor of a step over f16 rows; O(n·group).
float stream_fma_pair_f16(const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                          std::size_t group);
/// Eight independent FMA chains of `repeats` steps, no loads: this core's arithmetic peak
/// (8 · fma_lanes() · repeats multiply-adds); O(repeats).
float fma_chains(std::size_t repeats);
/// f32 lanes of the vectors fma_chains runs on (the dispatched target's); O(1).
std::size_t fma_lanes();
/// stream_fma_exp_pair over n int8 elements of each array, each vector converted to f32 first:
/// the floor of an exact step over int8 rows (their per-row scales left out); O(n·group).
float stream_fma_exp_pair_int8(const std::int8_t* a, const std::int8_t* b, std::size_t n,
                               std::size_t group, std::size_t head_dim);
}  // namespace ringkv_bench
