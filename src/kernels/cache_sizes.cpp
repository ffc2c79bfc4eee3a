// The cache sizes this_cache_kind() reads: Linux's sysfs first, glibc's sysconf where sysfs is
// silent. Why not sysconf alone: on a Zen 4 EPYC vCPU glibc 2.36 reports the L3 as 320 MiB where
// sysfs (the kernel's reading of CPUID leaf 0x8000001D) says 32 MiB, which would plan that machine
// as large_l3 and read windows past its L3 without prefetch.
// Re-measure: scripts/bench-targets --shapes '/32768/'
#include <charconv>
#include <cstddef>
#include <fstream>
#include <string>
#include <system_error>

#include "simd.h"

#include <unistd.h>

namespace ringkv::simd {
namespace {

/// The file's first whitespace-separated word, empty if it cannot be read.
std::string first_word(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  in >> word;
  return word;
}

/// Bytes of a sysfs size ("32768K", "1M", "512"), 0 if it is not one.
std::size_t size_bytes(const std::string& text) {
  std::size_t n = 0;
  const char* end = text.data() + text.size();
  const auto [rest, err] = std::from_chars(text.data(), end, n);
  if (err != std::errc() || rest == text.data()) return 0;
  const std::string unit(rest, end);
  if (unit.empty()) return n;
  if (unit == "K") return n << 10;
  if (unit == "M") return n << 20;
  if (unit == "G") return n << 30;
  return 0;
}

}  // namespace

std::size_t sysfs_cache_bytes(const std::string& dir, int level) {
  const std::string wanted = std::to_string(level);
  for (int i = 0;; ++i) {
    const std::string index = dir + "/index" + std::to_string(i) + "/";
    const std::string at = first_word(index + "level");
    if (at.empty()) return 0;  // the indexes are numbered from 0 without gaps
    if (at == wanted && first_word(index + "type") != "Instruction")
      return size_bytes(first_word(index + "size"));
  }
}

std::size_t cache_bytes(int level) {
  if (const std::size_t b = sysfs_cache_bytes("/sys/devices/system/cpu/cpu0/cache", level))
    return b;
  const int name = level == 1   ? _SC_LEVEL1_DCACHE_SIZE
                   : level == 2 ? _SC_LEVEL2_CACHE_SIZE
                   : level == 3 ? _SC_LEVEL3_CACHE_SIZE
                                : -1;
  const long bytes = name < 0 ? -1 : ::sysconf(name);
  return bytes > 0 ? std::size_t(bytes) : 0;
}

}  // namespace ringkv::simd
