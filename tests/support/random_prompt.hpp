// Seeded random prompt rows, shared by the prefill suite and bench/prefill_bench.
#pragma once
#include <cstddef>
#include <random>
#include <span>
#include <vector>

/// Rows for n tokens drawn from normal(0, spread): q [n, q_row], k and v [n, kv_row].
struct random_prompt {
  std::size_t q_row, kv_row;
  std::vector<float> q, k, v;
  random_prompt(std::size_t n, std::size_t q_width, std::size_t kv_width, unsigned seed,
                float spread = 1.0f)
      : q_row(q_width), kv_row(kv_width), q(n * q_row), k(n * kv_row), v(n * kv_row) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, spread);
    for (auto* buf : {&q, &k, &v})
      for (float& x : *buf) x = nd(rng);
  }
  /// Token rows [from, from + n) of q, k or v (views, no copy).
  std::span<const float> qs(std::size_t from, std::size_t n) const {
    return std::span<const float>(q).subspan(from * q_row, n * q_row);
  }
  std::span<const float> ks(std::size_t from, std::size_t n) const {
    return std::span<const float>(k).subspan(from * kv_row, n * kv_row);
  }
  std::span<const float> vs(std::size_t from, std::size_t n) const {
    return std::span<const float>(v).subspan(from * kv_row, n * kv_row);
  }
};
