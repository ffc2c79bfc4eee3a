// The Highway kernels' entry points (hwy/examples/skeleton.cc pattern): foreach_target.h compiles
// this file once per target; HWY_EXPORT + HWY_DYNAMIC_DISPATCH pick the best target once per call.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

HWY_INLINE std::size_t RoundUp(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

/// Carves the stack scratch into a chunk of up to `count` query heads: the scaled query rows,
/// a block of scores and the rescales. Returns the floats used (a multiple of 16, so what follows
/// stays 64-byte aligned).
HWY_INLINE std::size_t LayOutChunk(const problem& p, std::size_t kv_head, std::size_t q0,
                                   std::size_t count, float* scratch, chunk& c) {
  c.kv_head = kv_head;
  c.q0 = q0;
  c.count = count;
  c.padded_dim = RoundUp(p.head_dim, block_positions);
  float* q = scratch;                                     // [count, padded_dim]
  c.scores = q + count * c.padded_dim;                    // [count, block_positions]
  c.rescale = c.scores + count * block_positions;         // [count]
  for (std::size_t h = 0; h < count; ++h) {
    const float* in = p.query + (q0 + h) * p.head_dim;    // [head_dim]
    float* row = q + h * c.padded_dim;                    // [padded_dim]
    for (std::size_t i = 0; i < p.head_dim; ++i) row[i] = in[i] * p.scale;
    std::fill(row + p.head_dim, row + c.padded_dim, 0.0f);
  }
  c.q = q;
  return RoundUp(count * (c.padded_dim + block_positions) + count, block_positions);
}

/// How many query heads of a group fit the scratch at once, with `extra` floats per head.
HWY_INLINE std::size_t ChunkHeads(const problem& p, std::size_t extra) {
  const std::size_t per_head = RoundUp(p.head_dim, block_positions) + block_positions + 1 + extra;
  const std::size_t group = p.q_heads / p.kv_heads;
  return std::max<std::size_t>(1, std::min(group, (scratch_floats - 64) / per_head));
}

template <class Loader>
HWY_NOINLINE void AttendT(const problem& p, std::size_t from, std::size_t to, const state& s) {
  HWY_ALIGN float scratch[scratch_floats];
  const std::size_t group = p.q_heads / p.kv_heads, per_chunk = ChunkHeads(p, 0);
  chunk c;
  for (std::size_t kv = 0; kv < p.kv_heads; ++kv)
    for (std::size_t q0 = kv * group; q0 < (kv + 1) * group; q0 += per_chunk) {
      LayOutChunk(p, kv, q0, std::min(per_chunk, (kv + 1) * group - q0), scratch, c);
      AttendRange<Loader>(p, c, from, to, Rows(s, q0, p.head_dim));
    }
}

/// One chunk of a decode: its first segment straight into the running state (whose acc is
/// `out`), each later segment into a fresh state merged in, left to right, then normalised.
template <class Loader>
HWY_INLINE void DecodeChunk(const problem& p, const chunk& c, float* extra, const float* sinks,
                            float* out) {
  const std::size_t n = c.count, dim = p.head_dim;
  const state run{extra, extra + n, out + c.q0 * dim};                      // [n], [n], [n, dim]
  const state seg{extra + 2 * n, extra + 3 * n, extra + 4 * n};              // [n], [n], [n, dim]
  ClearRows(n, dim, run);
  const std::size_t end = WindowEnd(p.keys);
  bool first = true;
  for (std::size_t pos = NextPosition(p.keys, 0); pos < end;) {
    const std::size_t begin = pos / segment_positions * segment_positions;
    if (first) {
      AttendRange<Loader>(p, c, begin, begin + segment_positions, run);
      first = false;
    } else {
      ClearRows(n, dim, seg);
      AttendRange<Loader>(p, c, begin, begin + segment_positions, seg);
      MergeRows(n, dim, run, seg);
    }
    pos = NextPosition(p.keys, begin + segment_positions);
  }
  FinishRows(n, dim, run, sinks ? sinks + c.q0 : nullptr, run.acc);
}

template <class Loader>
HWY_NOINLINE void DecodeT(const problem& p, const float* sinks, float* out) {
  HWY_ALIGN float scratch[scratch_floats];
  const std::size_t group = p.q_heads / p.kv_heads;
  const std::size_t per_chunk = ChunkHeads(p, p.head_dim + 4);
  chunk c;
  for (std::size_t kv = 0; kv < p.kv_heads; ++kv)
    for (std::size_t q0 = kv * group; q0 < (kv + 1) * group; q0 += per_chunk) {
      const std::size_t used =
          LayOutChunk(p, kv, q0, std::min(per_chunk, (kv + 1) * group - q0), scratch, c);
      DecodeChunk<Loader>(p, c, scratch + used, sinks, out);
    }
}

std::int64_t TargetImpl() { return HWY_TARGET; }

float DotImpl(const float* a, const float* b, std::size_t n) { return Dot(DF(), a, b, n); }

void AttendImpl(const problem& p, std::size_t from, std::size_t to, const state& s) {
  AttendT<row_loader<float>>(p, from, to, s);  // f32 is the only element type so far
}

void MergeImpl(std::size_t q_heads, std::size_t head_dim, const state& into, const state& from) {
  MergeRows(q_heads, head_dim, into, from);
}

void FinishImpl(std::size_t q_heads, std::size_t head_dim, const state& s, const float* sinks,
                float* out) {
  FinishRows(q_heads, head_dim, s, sinks, out);
}

void DecodeImpl(const problem& p, const float* sinks, float* out) {
  DecodeT<row_loader<float>>(p, sinks, out);
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv::simd {

HWY_EXPORT(TargetImpl);
HWY_EXPORT(DotImpl);
HWY_EXPORT(AttendImpl);
HWY_EXPORT(MergeImpl);
HWY_EXPORT(FinishImpl);
HWY_EXPORT(DecodeImpl);

const char* target_name() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetImpl)()); }
float dot(const float* a, const float* b, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
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
