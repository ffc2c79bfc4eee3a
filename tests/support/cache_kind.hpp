// Plans decode's reads as on another kind of machine for a scope (src/simd.h's test hook), so a
// test of a read path (the dense or spaced prefetch walk, pipelined rows) takes that path
// whatever caches the machine running it has.
#pragma once
#include "simd.h"

namespace ringkv_test {

/// Restores this machine's own cache kind when it leaves scope (also when a check throws).
class cache_kind_override {
 public:
  explicit cache_kind_override(ringkv::simd::cache_kind k) {
    ringkv::simd::set_cache_kind_for_test(&k);
  }
  ~cache_kind_override() { ringkv::simd::set_cache_kind_for_test(nullptr); }
  cache_kind_override(const cache_kind_override&) = delete;
  cache_kind_override& operator=(const cache_kind_override&) = delete;
};

}  // namespace ringkv_test
