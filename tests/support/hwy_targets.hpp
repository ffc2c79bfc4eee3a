// Runs a test body once per Highway target compiled into the library and supported by this CPU,
// so every SIMD path (AVX2, SSE4, SSSE3, EMU128 on an AVX2 machine) is exercised.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <hwy/targets.h>

#include "kernels/simd.h"

namespace ringkv_test {

/// Makes `target` the best target this CPU reports (the worse ones stay, for kernels not compiled
/// for it); restores Highway's own choice when it leaves scope (also when a check throws).
class target_override {
 public:
  explicit target_override(std::int64_t target) {
    hwy::SetSupportedTargetsForTest(hwy::SupportedTargets() & ~(target - 1));
  }
  ~target_override() { hwy::SetSupportedTargetsForTest(0); }
  target_override(const target_override&) = delete;
  target_override& operator=(const target_override&) = delete;
};

/// Calls body(name) with dispatch forced to each target this CPU supports that the kernels were
/// compiled for (`compiled`: simd::compiled_targets() by default, simd::compressed_targets() for
/// the compressed kernel; the sanitizer presets leave EMU128 out, and this translation unit's own
/// HWY_TARGETS may differ from the kernels'); throws if there is none, so a test cannot pass by
/// running nothing.
template <class Body>
void for_each_target(Body&& body, std::int64_t compiled = ringkv::simd::compiled_targets()) {
  int ran = 0;
  for (std::int64_t left = hwy::SupportedTargets() & compiled; left != 0; left &= left - 1) {
    const std::int64_t target = left & -left;
    target_override scoped(target);
    body(hwy::TargetName(target));
    ++ran;
  }
  if (ran == 0) throw std::logic_error("for_each_target: no compiled target is supported here");
}

}  // namespace ringkv_test
