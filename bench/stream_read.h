// The bandwidth roof of the attention benchmark: reads memory as fast as this CPU can (Highway,
// dynamic dispatch), nothing else. Private to the benchmark.
#pragma once
#include <cstddef>

namespace ringkv_bench {
/// Σ p[i] over n floats, with enough independent vector sums that only loads limit it; O(n).
float stream_read(const float* p, std::size_t n);
/// Σ a[i] + b[i] over n floats of each, the two arrays read in turn (two streams); O(n).
float stream_read_pair(const float* a, const float* b, std::size_t n);
}  // namespace ringkv_bench
