// The Highway kernels' entry points (hwy/examples/skeleton.cc pattern): foreach_target.h compiles
// this file once per target; HWY_EXPORT + HWY_DYNAMIC_DISPATCH pick the best target once per call.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

/// AttendRange kept out of line: one copy per row type serves both entry points (AttendT and
/// the decode segments), which halves this file's compile time (three row types, five targets).
template <class Loader>
HWY_NOINLINE void AttendRows(const problem& p, const chunk& c, std::size_t from, std::size_t to,
                             const state& s) {
  if (p.pipelined && c.count == 1)
    PipelineBlocks<Loader>(p, c, from, to, s);
  else
    AttendRange<Loader>(p, c, from, to, s);
}

template <class Loader>
HWY_NOINLINE void AttendT(const problem& p, std::size_t from, std::size_t to, const state& s) {
  HWY_ALIGN float scratch[scratch_floats];
  const std::size_t group = p.q_heads / p.kv_heads, per_chunk = ChunkHeads(p, 0);
  chunk c;
  for (std::size_t kv = 0; kv < p.kv_heads; ++kv)
    for (std::size_t q0 = kv * group; q0 < (kv + 1) * group; q0 += per_chunk) {
      LayOutChunk(p, kv, q0, std::min(per_chunk, (kv + 1) * group - q0), scratch, c);
      AttendRows<Loader>(p, c, from, to, Rows(s, q0, p.head_dim));
    }
}

/// The whole decode, chunk by chunk: a chunk is up to ChunkHeads query heads of one kv head's
/// group, or, when p.side_by_side, up to side_by_side_heads kv heads with their one query head
/// each (see AttendSpread); each chunk walks its segments (DecodeSegments).
template <class Loader>
HWY_NOINLINE void DecodeT(const problem& p, const float* sinks, float* out) {
  HWY_ALIGN float scratch[scratch_floats];
  const std::size_t group = p.q_heads / p.kv_heads;
  const std::size_t per_chunk =
      FittingHeads(p, p.head_dim + 4, p.side_by_side ? side_by_side_heads : group);
  chunk c;
  for (std::size_t q0 = 0; q0 < p.q_heads;) {
    const std::size_t kv = q0 / group;
    // One past the last head the chunk may take: its group's, or any kv head's side by side.
    const std::size_t last = p.side_by_side ? p.q_heads : (kv + 1) * group;
    const std::size_t used = LayOutChunk(p, kv, q0, std::min(per_chunk, last - q0), scratch, c);
    DecodeSegments(p.keys, p.head_dim, c, scratch + used, sinks, out,
                   [&](std::size_t from, std::size_t to, const state& s) {
                     if (p.side_by_side)
                       AttendSpread<Loader>(p, c, from, to, s);
                     else
                       AttendRows<Loader>(p, c, from, to, s);
                   });
    q0 += c.count;
  }
}

std::int64_t TargetImpl() { return HWY_TARGET; }

float DotImpl(const float* a, const float* b, std::size_t n) { return Dot(DF(), a, b, n); }

/// Whether `match` (a vector -> its lanes' bits, all ones where a lane matches) holds for no
/// float of p[0, n): ORs it over vectors, and the tail one float at a time.
template <class Match>
bool NoLaneMatches(const float* p, std::size_t n, Match match) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  auto any = hn::Zero(du);
  const std::size_t lanes = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) any = hn::Or(any, match(hn::LoadU(d, p + i)));
  for (; i < n; ++i) any = hn::Or(any, match(hn::Set(d, p[i])));
  return hn::AllTrue(du, hn::Eq(any, hn::Zero(du)));
}

/// Whether no float of p[0, n) has all exponent bits set (NaN, ±Inf).
bool AllFiniteImpl(const float* p, std::size_t n) {
  const hn::RebindToUnsigned<DF> du;
  const auto exponent = hn::Set(du, 0x7f800000u);
  return NoLaneMatches(p, n, [&](VF v) {
    return hn::VecFromMask(du, hn::Eq(hn::And(hn::BitCast(du, v), exponent), exponent));
  });
}

/// Whether every |p[i]| of p[0, n) is below `limit` (a NaN counts as below).
bool AllBelowImpl(const float* p, std::size_t n, float limit) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const auto bound = hn::Set(d, limit);
  return NoLaneMatches(
      p, n, [&](VF v) { return hn::BitCast(du, hn::VecFromMask(d, hn::Ge(hn::Abs(v), bound))); });
}

void AttendImpl(const problem& p, std::size_t from, std::size_t to, const state& s) {
  WithLoader(p, [&](auto loader) { AttendT<decltype(loader)>(p, from, to, s); });
}

void MergeImpl(std::size_t q_heads, std::size_t head_dim, const state& into, const state& from) {
  MergeRows(q_heads, head_dim, into, from);
}

void FinishImpl(std::size_t q_heads, std::size_t head_dim, const state& s, const float* sinks,
                float* out) {
  FinishRows(q_heads, head_dim, s, sinks, out);
}

void DecodeImpl(const problem& p, const float* sinks, float* out) {
  WithLoader(p, [&](auto loader) { DecodeT<decltype(loader)>(p, sinks, out); });
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv::simd {

HWY_EXPORT(TargetImpl);
HWY_EXPORT(DotImpl);
HWY_EXPORT(AllFiniteImpl);
HWY_EXPORT(AllBelowImpl);
HWY_EXPORT(AttendImpl);
HWY_EXPORT(MergeImpl);
HWY_EXPORT(FinishImpl);
HWY_EXPORT(DecodeImpl);

namespace {
// Set only by tests, between steps (set_cache_kind_for_test); relaxed: no data rides on it.
std::atomic<int> cache_kind_for_test{-1};
}  // namespace

cache_kind this_cache_kind() {
  static const cache_kind here = [] {
    // 0 where the system does not say: then the limits of the smallest caches.
    const std::size_t l2 = cache_bytes(2), l3 = cache_bytes(3);
    if (l3 >= large_l3_bytes) return cache_kind::large_l3;
    return l2 > small_l2_bytes ? cache_kind::large_l2 : cache_kind::small_l2;
  }();
  const int forced = cache_kind_for_test.load(std::memory_order_relaxed);
  return forced < 0 ? here : cache_kind(forced);
}

void set_cache_kind_for_test(const cache_kind* k) {
  cache_kind_for_test.store(k ? int(*k) : -1, std::memory_order_relaxed);
}

const char* target_name() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetImpl)()); }
std::int64_t compiled_targets() { return HWY_TARGETS; }
float dot(const float* a, const float* b, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}
bool all_finite(const float* p, std::size_t n) { return HWY_DYNAMIC_DISPATCH(AllFiniteImpl)(p, n); }
bool all_below(const float* p, std::size_t n, float limit) {
  return HWY_DYNAMIC_DISPATCH(AllBelowImpl)(p, n, limit);
}
void attend(const problem& p, std::size_t from, std::size_t to, const state& s) {
  HWY_DYNAMIC_DISPATCH(AttendImpl)(p, from, to, s);
}
void merge(std::size_t q_heads, std::size_t head_dim, const state& into, const state& from) {
  HWY_DYNAMIC_DISPATCH(MergeImpl)(q_heads, head_dim, into, from);
}
void finish(std::size_t q_heads, std::size_t head_dim, const state& s, const float* sinks,
            float* out) {
  HWY_DYNAMIC_DISPATCH(FinishImpl)(q_heads, head_dim, s, sinks, out);
}
void decode(const problem& p, const float* sinks, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeImpl)(p, sinks, out);
}

}  // namespace ringkv::simd
#endif  // HWY_ONCE
