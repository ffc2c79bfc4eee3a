// The compressed-window decode kernel (see quant_simd.h): codes expanded per block through a
// codebook held in SIMD lanes, then the f32 kernels' online softmax (softmax-inl.h, decode-inl.h).
// foreach_target.h compiles this file once per target; HWY_DYNAMIC_DISPATCH picks one per call.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant_simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/quant_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "kernels/decode-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

using DI = hn::Rebind<std::int32_t, DF>;
using DU8 = hn::Rebind<std::uint8_t, DF>;
using DI8 = hn::Rebind<std::int8_t, DF>;

inline constexpr std::size_t max_tile_dim = max_compressed_head_dim;

/// A codebook of up to 16 levels as whole vectors (zero-padded): `vectors` of Lanes floats.
struct lane_table {
  HWY_ALIGN float levels[16 + hn::MaxLanes(DF())] = {};
  std::size_t vectors = 1;
  void set(const float* values, std::size_t count) {
    std::copy(values, values + count, levels);
    vectors = std::max<std::size_t>(1, (count + hn::Lanes(DF()) - 1) / hn::Lanes(DF()));
  }
};

/// table[idx] per lane: one TableLookupLanes per table vector, the vector chosen by idx's high
/// bits (one lookup on 16-lane targets, two for 16 levels on 8-lane ones). Vectors = 0: the
/// table's own count (known only at run time).
template <std::size_t Vectors = 0>
HWY_INLINE VF Lookup(DF d, const float* levels, std::size_t count, hn::Vec<DI> idx) {
  const DI di;
  const std::size_t N = hn::Lanes(d), vectors = Vectors ? Vectors : count;
  const auto lane = hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, std::int32_t(N - 1))));
  VF r = hn::TableLookupLanes(hn::Load(d, levels), lane);
  for (std::size_t v = 1; v < vectors; ++v) {
    const auto upper = hn::RebindMask(d, hn::Gt(idx, hn::Set(di, std::int32_t(v * N - 1))));
    r = hn::IfThenElse(upper, hn::TableLookupLanes(hn::Load(d, levels + v * N), lane), r);
  }
  return r;
}

/// The first d codes of a packed row as bytes (LSB-first stream); bytes past d are untouched.
HWY_INLINE void Unpack(const std::byte* packed, unsigned bits, std::size_t d, std::uint8_t* out) {
  const auto* in = reinterpret_cast<const std::uint8_t*>(packed);
  if (bits == 4) {
    for (std::size_t k = 0; k < d / 2; ++k) {
      out[2 * k] = in[k] & 15;
      out[2 * k + 1] = in[k] >> 4;
    }
    if (d % 2) out[d - 1] = in[d / 2] & 15;
  } else if (bits == 1) {
    for (std::size_t i = 0; i < d; ++i) out[i] = (in[i / 8] >> (i % 8)) & 1;
  } else {
    for (std::size_t i = 0; i < d; ++i) out[i] = codec::code_at(packed, bits, i);
  }
}

/// out[0, padded) = scale · table[codes[i]]; codes is padded with zeros (lanes past head_dim
/// hold scale·table[0], which a zero-padded query and the head_dim-bounded V fold ignore).
HWY_INLINE void ExpandCodes(const std::uint8_t* codes, std::size_t padded, const lane_table& t,
                            float scale, float* out) {
  const DF d;
  const DI di;
  const DU8 d8;
  const VF vs = hn::Set(d, scale);
  for (std::size_t i = 0; i < padded; i += hn::Lanes(d))
    hn::Store(
        hn::Mul(Lookup(d, t.levels, t.vectors, hn::PromoteTo(di, hn::LoadU(d8, codes + i))), vs), d,
        out + i);
}

/// out[0, padded) = scale · table[code i] straight from the packed row: each vector's N codes
/// (N·Bits bits, whole bytes, at most 4) are read as one word, broadcast, shifted per lane by
/// lane·Bits and masked into lookup indices; the number of table vectors is known here, so the
/// lookups unroll. Targets where N·Bits is not whole bytes or exceeds 32 unpack to bytes first.
template <unsigned Bits>
HWY_INLINE void ExpandPackedT(const std::byte* packed, std::size_t dim, std::size_t padded,
                              const lane_table& t, float scale, std::uint8_t* bytes, float* out) {
  constexpr std::size_t N = hn::MaxLanes(DF()), group_bits = N * Bits;
  if constexpr (group_bits > 32 || group_bits % 8 != 0) {
    Unpack(packed, Bits, dim, bytes);
    ExpandCodes(bytes, padded, t, scale, out);
  } else {
    const DF d;
    const hn::Rebind<std::uint32_t, DF> du;
    const DI di;
    const VF vs = hn::Set(d, scale);
    const auto shifts = hn::Mul(hn::Iota(du, 0), hn::Set(du, Bits));
    const auto mask = hn::Set(du, (1u << Bits) - 1);
    constexpr std::size_t vectors = ((std::size_t{1} << Bits) + N - 1) / N;
    HWY_ALIGN float levels[vectors * N];  // the codebook times this row's norm: no per-lane Mul
    for (std::size_t v = 0; v < vectors; ++v)
      hn::Store(hn::Mul(hn::Load(d, t.levels + v * N), vs), d, levels + v * N);
    const std::size_t full = dim / N * N;
    const std::byte* HWY_RESTRICT in = packed;
    float* HWY_RESTRICT o = out;
    for (std::size_t i = 0; i < full; i += N, in += group_bits / 8, o += N) {
      std::uint32_t word = 0;
      std::memcpy(&word, in, group_bits / 8);  // LSB-first stream, little-endian
      const auto idx = hn::And(hn::Set(du, word) >> shifts, mask);
      hn::Store(Lookup<vectors>(d, levels, vectors, hn::BitCast(di, idx)), d, o);
    }
    if (full == padded) return;
    std::uint32_t word = 0;  // the row's last, partial group, then zero lanes up to padded
    for (std::size_t k = full * Bits / 8; k < (dim * Bits + 7) / 8; ++k)
      word |= std::uint32_t(std::to_integer<std::uint8_t>(packed[k]))
              << (8 * (k - full * Bits / 8));
    const auto idx = hn::And(hn::Set(du, word) >> shifts, mask);
    hn::Store(Lookup<vectors>(d, levels, vectors, hn::BitCast(di, idx)), d, out + full);
    for (std::size_t i = full + N; i < padded; i += N) hn::Store(hn::Zero(d), d, out + i);
  }
}

HWY_INLINE void ExpandPacked(const std::byte* packed, unsigned bits, std::size_t dim,
                             std::size_t padded, const lane_table& t, float scale,
                             std::uint8_t* bytes, float* out) {
  switch (bits) {
    case 1:
      return ExpandPackedT<1>(packed, dim, padded, t, scale, bytes, out);
    case 2:
      return ExpandPackedT<2>(packed, dim, padded, t, scale, bytes, out);
    case 3:
      return ExpandPackedT<3>(packed, dim, padded, t, scale, bytes, out);
    default:
      return ExpandPackedT<4>(packed, dim, padded, t, scale, bytes, out);
  }
}

/// out[0, padded) = scale · int8 codes (row is padded: reads stop at head_dim via `codes`).
HWY_INLINE void ExpandInt8(const std::uint8_t* codes, std::size_t padded, float scale, float* out) {
  const DF d;
  const DI di;
  const DI8 d8;
  const VF vs = hn::Set(d, scale);
  for (std::size_t i = 0; i < padded; i += hn::Lanes(d)) {
    const auto c = hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(codes) + i);
    hn::Store(hn::Mul(hn::ConvertTo(d, hn::PromoteTo(di, c)), vs), d, out + i);
  }
}

/// Expansion tiles of one block: K and V rows (rotated space, times the norm), QJL sign rows as
/// ±1 and their factors ‖k‖·‖r‖, and a byte buffer for unpacked codes.
struct tiles {
  HWY_ALIGN float k[block_positions * max_tile_dim];
  HWY_ALIGN float v[block_positions * max_tile_dim];
  HWY_ALIGN float z[block_positions * max_tile_dim];
  float factors[block_positions];
  HWY_ALIGN std::uint8_t codes[max_tile_dim + 64];
  lane_table key_levels, value_levels, signs;
};

/// Expands kv head h's rows of positions [lo, hi) of `w` into tile rows (stride `padded`) and
/// points rows[] at them; with z, also the QJL sign rows and factors. Returns how many.
HWY_INLINE std::size_t ExpandRows(const code_window& w, const lane_table& levels, std::size_t h,
                                  std::size_t lo, std::size_t hi, std::size_t padded, float* tile,
                                  tiles& t, const std::byte** rows, float* z) {
  const codec::rows_format& f = w.format;
  std::size_t n = 0;
  for (std::size_t r = 0; r < w.run_count; ++r) {
    const codec::rows_run& run = w.runs[r];
    const std::size_t b = std::max(lo, run.first), e = std::min(hi, run.first + run.count);
    for (std::size_t p = b; p < e; ++p, ++n) {
      const std::size_t row = h * run.head_stride + (p - run.first);
      const std::byte* codes = run.codes + row * f.code_bytes;
      float* out = tile + n * padded;
      if (f.int8) {
        std::memcpy(t.codes, codes, f.head_dim);
        ExpandInt8(t.codes, padded, run.scales[row], out);
      } else {
        ExpandPacked(codes, f.bits, f.head_dim, padded, levels, run.scales[row], t.codes, out);
      }
      rows[n] = reinterpret_cast<const std::byte*>(out);
      if (z == nullptr) continue;
      ExpandPacked(run.signs + row * f.sign_bytes, 1, f.head_dim, padded, t.signs, 1.0f, t.codes,
                   z + n * padded);
      t.factors[n] = run.scales[row] * run.residual_norms[row];
    }
  }
  return n;
}

/// Per query head of the chunk: the scaled query rotated in place into the kv head's frame, and
/// (QJL) sq = scale·sqrt(π/2)/d · S·q from the unrotated query.
HWY_INLINE void PrepareQueries(const compressed_problem& cp, const chunk& c, float* q_rows,
                               float* sq) {
  const codec::rows_format& f = cp.keys.format;
  const std::size_t d = cp.head_dim;
  if (f.qjl) {
    const float* s = f.projections + c.kv_head * d * d;
    const float g = cp.scale * float(codec::qjl_scale(d));
    for (std::size_t h = 0; h < c.count; ++h) {
      const float* q = cp.query + (c.q0 + h) * d;
      for (std::size_t i = 0; i < d; ++i) sq[h * c.padded_dim + i] = g * Dot(DF(), s + i * d, q, d);
    }
  }
  if (f.int8) return;
  HWY_ALIGN float tmp[max_tile_dim];
  const float* state = f.rotations + c.kv_head * f.rotation_floats;
  for (std::size_t h = 0; h < c.count; ++h) {
    float* row = q_rows + h * c.padded_dim;
    codec::rotate(state, f.hadamard, d, row, tmp);
    std::copy(tmp, tmp + d, row);
  }
}

/// The normalised outputs of the chunk rotated back (Πᵀ) from the values' frame.
HWY_INLINE void RotateBack(const compressed_problem& cp, const chunk& c, float* out) {
  const codec::rows_format& f = cp.values.format;
  if (f.int8) return;
  HWY_ALIGN float tmp[max_tile_dim];
  const std::size_t d = cp.head_dim;
  const float* state = f.rotations + c.kv_head * f.rotation_floats;
  for (std::size_t h = 0; h < c.count; ++h) {
    float* row = out + (c.q0 + h) * d;
    codec::rotate_back(state, f.hadamard, d, row, tmp);
    std::copy(tmp, tmp + d, row);
  }
}

/// The window's positions only (no rows): what the block and segment walks need.
HWY_INLINE window PositionsOf(const code_window& w) {
  window out;
  for (std::size_t r = 0; r < w.run_count; ++r)
    out.runs[r] = {nullptr, 0, 0, w.runs[r].first, w.runs[r].count};
  out.run_count = w.run_count;
  return out;
}

HWY_NOINLINE void CompressedDecodeImpl(const compressed_problem& cp, const float* sinks,
                                       float* out) {
  HWY_ALIGN float scratch[scratch_floats];
  tiles t;  // ~100 KB of stack at head_dim 256: a thread_local per target would cost every thread
  const bool qjl = cp.keys.format.qjl;
  t.key_levels.set(cp.keys.format.centroids,
                   cp.keys.format.int8 ? 0 : std::size_t{1} << cp.keys.format.bits);
  t.value_levels.set(cp.values.format.centroids,
                     cp.values.format.int8 ? 0 : std::size_t{1} << cp.values.format.bits);
  const float plus_minus[2] = {-1.0f, 1.0f};
  t.signs.set(plus_minus, 2);
  std::fill(t.codes, t.codes + sizeof(t.codes), std::uint8_t{0});

  problem p;  // positions and geometry only: rows come from the expansion
  p.query = cp.query;
  p.keys = PositionsOf(cp.keys);
  p.values = PositionsOf(cp.values);
  p.q_heads = cp.q_heads;
  p.kv_heads = cp.kv_heads;
  p.head_dim = cp.head_dim;
  p.scale = cp.scale;
  p.block = block_positions;  // what the expansion tiles hold (tiles::k, v, z, factors)
  const std::size_t dim = p.head_dim, group = p.q_heads / p.kv_heads;
  const std::size_t padded = RoundUp(dim, block_positions);
  const std::size_t per_chunk = ChunkHeads(p, dim + 4 + (qjl ? padded + block_positions : 0));
  chunk c;
  for (std::size_t kv = 0; kv < p.kv_heads; ++kv)
    for (std::size_t q0 = kv * group; q0 < (kv + 1) * group; q0 += per_chunk) {
      const std::size_t count = std::min(per_chunk, (kv + 1) * group - q0);
      const std::size_t used = LayOutChunk(p, kv, q0, count, scratch, c);
      float* extra = scratch + used;
      float* sq = extra + RoundUp(4 * count + count * dim, block_positions);
      PrepareQueries(cp, c, scratch, sq);
      auto collect = [&](std::size_t pos, std::size_t end, block_rows& b, line_feed&) {
        ExpandRows(cp.values, t.value_levels, kv, pos, end, padded, t.v, t, b.v, nullptr);
        return ExpandRows(cp.keys, t.key_levels, kv, pos, end, padded, t.k, t, b.k,
                          qjl ? t.z : nullptr);
      };
      auto correct = [&](std::size_t, const block_rows& b, line_feed&) {
        if (!qjl) return;
        for (std::size_t h = 0; h < c.count; ++h)
          for (std::size_t j = 0; j < b.n; ++j)
            c.scores[h * c.block + j] +=
                t.factors[j] * Dot(DF(), sq + h * padded, t.z + j * padded, dim);
      };
      DecodeSegments(
          p.keys, dim, c, extra, sinks, out, [&](std::size_t from, std::size_t to, const state& s) {
            AttendBlocks<row_loader<float>>(p.keys, dim, c, from, to, s, collect, correct);
          });
      RotateBack(cp, c, out);
    }
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv::simd {

HWY_EXPORT(CompressedDecodeImpl);

void compressed_decode(const compressed_problem& p, const float* sinks, float* out) {
  HWY_DYNAMIC_DISPATCH(CompressedDecodeImpl)(p, sinks, out);
}

}  // namespace ringkv::simd
#endif  // HWY_ONCE
