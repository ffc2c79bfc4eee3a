// A deterministic stand-in for random inputs, shared by the kernel and attention tests.
#pragma once
#include <cstdint>

namespace ringkv_test {

/// splitmix64 of i mapped to [-1, 1): the same value for the same i on every machine; O(1).
inline float pseudo_random(std::uint64_t i) {
  std::uint64_t z = i * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return float(double(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

}  // namespace ringkv_test
