// Per-target decode scaffolding shared by the f32 kernels (simd.cpp) and the compressed ones
// (quant_simd.cpp): the chunk of query heads laid out in stack scratch, and the walk over
// segments of absolute positions with their partial states merged left to right.
#if defined(RINGKV_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_DECODE_INL_H_
#undef RINGKV_DECODE_INL_H_
#else
#define RINGKV_DECODE_INL_H_
#endif

#include <algorithm>
#include <cstddef>

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
  c.block = p.block;
  c.padded_dim = RoundUp(p.head_dim, block_positions);
  float* q = scratch;                      // [count, padded_dim]
  c.scores = q + count * c.padded_dim;     // [count, block]
  c.rescale = c.scores + count * c.block;  // [count]
  for (std::size_t h = 0; h < count; ++h) {
    const float* in = p.query + (q0 + h) * p.head_dim;  // [head_dim]
    float* row = q + h * c.padded_dim;                  // [padded_dim]
    for (std::size_t i = 0; i < p.head_dim; ++i) row[i] = in[i] * p.scale;
    std::fill(row + p.head_dim, row + c.padded_dim, 0.0f);
  }
  c.q = q;
  return RoundUp(count * (c.padded_dim + c.block) + count, block_positions);
}

/// How many query heads, at most `wanted`, fit the scratch at once with `extra` floats per head.
HWY_INLINE std::size_t FittingHeads(const problem& p, std::size_t extra, std::size_t wanted) {
  const std::size_t per_head = RoundUp(p.head_dim, block_positions) + p.block + 1 + extra;
  return std::max<std::size_t>(1, std::min(wanted, (scratch_floats - 64) / per_head));
}

/// How many query heads of a group fit the scratch at once, with `extra` floats per head.
HWY_INLINE std::size_t ChunkHeads(const problem& p, std::size_t extra) {
  return FittingHeads(p, extra, p.q_heads / p.kv_heads);
}

/// One chunk of a decode: its first segment straight into the running state (whose acc is
/// `out`), each later segment into a fresh state merged in, left to right, then normalised.
/// attend(from, to, state) continues a state over the positions of `positions` in [from, to).
template <class Attend>
HWY_INLINE void DecodeSegments(const window& positions, std::size_t dim, const chunk& c,
                               float* extra, const float* sinks, float* out, Attend&& attend) {
  const std::size_t n = c.count;
  const state run{extra, extra + n, out + c.q0 * dim};           // [n], [n], [n, dim]
  const state seg{extra + 2 * n, extra + 3 * n, extra + 4 * n};  // [n], [n], [n, dim]
  ClearRows(n, dim, run);
  const std::size_t end = WindowEnd(positions);
  bool first = true;
  for (std::size_t pos = NextPosition(positions, 0); pos < end;) {
    const std::size_t begin = pos / segment_positions * segment_positions;
    if (first) {
      attend(begin, begin + segment_positions, run);
      first = false;
    } else {
      ClearRows(n, dim, seg);
      attend(begin, begin + segment_positions, seg);
      MergeRows(n, dim, run, seg);
    }
    pos = NextPosition(positions, begin + segment_positions);
  }
  FinishRows(n, dim, run, sinks ? sinks + c.q0 : nullptr, run.acc);
}

/// Calls run(row_loader<T>{}) for the element type T of the problem's rows: one switch per
/// call, never per row (keys and values share the type; kernels::check_windows enforces it).
template <class Run>
HWY_INLINE void WithLoader(const problem& p, Run&& run) {
  switch (p.keys.type) {
    case element::f16:
      return run(row_loader<hwy::float16_t>{});
    case element::bf16:
      return run(row_loader<hwy::bfloat16_t>{});
    case element::fp8_e4m3:
      return run(row_loader<fp8_e4m3>{});
    case element::f32:
      break;
  }
  run(row_loader<float>{});
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_DECODE_INL_H_
