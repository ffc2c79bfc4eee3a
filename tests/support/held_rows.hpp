// Whether two stores hold the same positions with the same rows, bit for bit: lengths, window
// starts, and every held row (the pinned sinks and the rolling part) as read_keys/read_values
// give them. Shared by the pool suite and its differential fuzz target. Include after
// `import ringkv;`.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

namespace ringkv_test {

inline bool same_held_rows(const ringkv::kv_cache_store& a, const ringkv::kv_cache_store& b) {
  const ringkv::kv_cache_config c = a.config();
  for (std::size_t l = 0; l < c.layers; ++l) {
    if (a.length(l) != b.length(l) || a.window_start(l) != b.window_start(l)) return false;
    const std::size_t keep = std::min(a.options().keep, a.length(l));
    const std::size_t from = std::max(keep, a.window_start(l)), to = a.length(l);
    for (const auto& [lo, hi] : {std::pair{std::size_t(0), keep}, std::pair{from, to}}) {
      if (lo == hi) continue;
      std::vector<float> x(c.row_floats() * (hi - lo)), y(x.size());
      a.read_keys(l, lo, hi, x);
      b.read_keys(l, lo, hi, y);
      if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) return false;
      a.read_values(l, lo, hi, x);
      b.read_values(l, lo, hi, y);
      if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) return false;
    }
  }
  return true;
}

}  // namespace ringkv_test
