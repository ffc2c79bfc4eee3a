// Runs a test body once per Highway target compiled into the library and supported by this CPU,
// so every SIMD path (AVX2, SSE4, SSSE3, EMU128 on an AVX2 machine) is exercised.
#pragma once
#include <cstdint>
#include <hwy/targets.h>

namespace ringkv_test {

/// Restores Highway's own target choice when it leaves scope (also when a check throws).
class target_override {
 public:
  explicit target_override(std::int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~target_override() { hwy::SetSupportedTargetsForTest(0); }
  target_override(const target_override&) = delete;
  target_override& operator=(const target_override&) = delete;
};

/// Calls body(name) with dispatch forced to each compiled and supported target in turn.
template <class Body>
void for_each_target(Body&& body) {
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    target_override scoped(target);
    body(hwy::TargetName(target));
  }
}

}  // namespace ringkv_test
