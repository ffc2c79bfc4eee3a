// A count given on an example's command line.
#pragma once
#include <cstddef>
#include <cstdlib>

/// out = s read as a decimal count in [min, max]; false, out unchanged, for anything else.
inline bool parse_count(const char* s, std::size_t& out, unsigned long long min = 0,
                        unsigned long long max = 1ull << 30) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || v < min || v > max) return false;
  out = static_cast<std::size_t>(v);
  return true;
}
