// Plans decode's reads as on another kind of machine for a scope (src/kernels/simd.h's test
// hook), so a test of a read path (the dense or spaced prefetch walk, pipelined rows) takes that
// path whatever caches the machine running it has.
#pragma once
#include <cstddef>

#include "kernels/simd.h"

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

/// A step's problem as plan_reads sees it: W positions of q/kv heads of D elements of `type`,
/// one run laid out [positions, kv heads, D] (no rows behind it: plan_reads reads only the
/// geometry), planned for `threads` threads as on this machine's (or the overridden) kind.
inline ringkv::simd::problem plan_of(std::size_t q, std::size_t kv, std::size_t dim, std::size_t w,
                                     std::size_t threads,
                                     ringkv::simd::element type = ringkv::simd::element::f32) {
  ringkv::simd::problem p;
  p.q_heads = q, p.kv_heads = kv, p.head_dim = dim;
  const std::size_t bytes = ringkv::simd::element_bytes(type);
  for (ringkv::simd::window* side : {&p.keys, &p.values}) {
    side->runs[0] = {
        .head_stride = dim * bytes, .position_stride = kv * dim * bytes, .first = 0, .count = w};
    side->run_count = 1;
    side->type = type;
  }
  ringkv::simd::plan_reads(p, threads);
  return p;
}

}  // namespace ringkv_test
