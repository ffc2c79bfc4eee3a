// Per-target fast scan of TurboQuant keys in slot groups (quant_codec.h): the score of a key is
// norm × Σᵢ q'ᵢ·c[codeᵢ] for the query q' rotated into the kv head's frame, so per query head a
// table of 16 bytes a unit (the 7-bit rounded q'ᵢ·c of each nibble's codes) turns a group's
// codes into scores with byte shuffles (TableLookupBytes): one shuffle looks up one unit's
// codes of 16 slots, a vector of 16 bytes a unit at a time (the "fast scan" of product
// quantization: André, Kermarrec, Le Scouarnec, VLDB 2015). The lookups are summed in 16-bit
// lanes, exactly, so a slot's score does not depend on which slots, groups or vectors shared
// its arithmetic: the bits are those of any ring phase or split, and of any target (3-bit codes:
// of any target that looks up the same tables, pairs or single codes). 3-bit codes: triples-inl.h.
#if defined(RINGKV_SCAN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_SCAN_INL_H_
#undef RINGKV_SCAN_INL_H_
#else
#define RINGKV_SCAN_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/rows-inl.h"
#include "quant/quant_codec.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

using D8 = hn::ScalableTag<std::uint8_t>;
using D16 = hn::ScalableTag<std::uint16_t>;
using V16 = hn::Vec<D16>;

/// Query heads a scan takes at once (their 16-bit sums stay in registers).
inline constexpr std::size_t max_scan_heads = 4;

// Marks a lambda always inlined, as HWY_INLINE a function: the kernels' dispatch lambdas wrap
// whole loops, which the inliner otherwise leaves out of line.
// Re-measure: python3 bench/compressed_targets.py --shapes '^64/4096/8'
#ifndef RINGKV_INLINE_LAMBDA
#define RINGKV_INLINE_LAMBDA __attribute__((always_inline))
#endif

/// f(std::integral_constant<std::size_t, heads>()) for 1 to max_scan_heads heads: one switch a
/// call, each count its own unrolled code.
template <class F>
HWY_INLINE void WithHeads(std::size_t heads, F&& f) {
  static_assert(max_scan_heads == 4);
  switch (heads) {
    case 1:
      return f(std::integral_constant<std::size_t, 1>());
    case 2:
      return f(std::integral_constant<std::size_t, 2>());
    case 3:
      return f(std::integral_constant<std::size_t, 3>());
    default:
      return f(std::integral_constant<std::size_t, 4>());
  }
}

/// slice(std::integral_constant<std::size_t, W>(), c) over [c, count) in slices of W = Width
/// while they fit, then of Width / 2, …, 1 (the widest slices first: fewest passes over rows).
template <std::size_t Width, class Slice>
HWY_INLINE void InSlices(std::size_t count, std::size_t c, Slice&& slice) {
  for (; c + Width <= count; c += Width) slice(std::integral_constant<std::size_t, Width>(), c);
  if constexpr (Width > 1) InSlices<Width / 2>(count, c, slice);
}
// Table entries are round(T / delta) in ±table_step_max, stored + table_bias (1 … 127): 7 bits,
// so two lookups add in a byte before they are widened to 16-bit sums (a third fewer
// operations a lookup, for twice the 8-bit tables' rounding). Re-measure: python3
// bench/compressed_targets.py --shapes '^64/4096/2' (speed), compressed_attention_test (error).
inline constexpr int table_step_max = 63;
inline constexpr int table_bias = 64;

// On x86 targets with AVX-512 VBMI a byte permute of two 32-byte tables (VPERMT2B) looks up 64
// entries: a 3-bit plane byte, two codes, is one lookup of their pair table (triples-inl.h).
#undef RINGKV_PAIR_LOOKUP
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
#define RINGKV_PAIR_LOOKUP 1
#endif

/// One kind of codes' lookup tables for a chunk of query heads: per head head_bytes(), each entry
/// round(T / delta) + table_bias for the table's value T; a slot's `lookups` entries sum to its
/// score / delta + table_bias · lookups. Nibble codes (1, 2, 4 bits): [heads][units][16], unit u
/// the nibble's codes' sums. 3 bits (triples-inl.h), per 16 coordinates: pair tables
/// [heads][sixteens][2][4][64] where pairs are looked up (RINGKV_PAIR_LOOKUP), else a table of
/// 16 entries a coordinate, each twice, [heads][sixteens][8][2][2][16].
struct scan_tables {
  std::uint8_t* bytes = nullptr;  // 64-byte aligned
  std::size_t units = 0;          // nibble units, or sixteens of coordinates (3 bits)
  std::size_t lookups = 0;
  unsigned bits = 0;
  float delta[max_scan_heads] = {};
  std::size_t head_bytes() const { return (bits == 3 ? 512 : 16) * units; }
};

/// Sets t's shape for `bits`-bit codes of `d` coordinates (bits 1 to 4).
HWY_INLINE void ShapeTables(scan_tables& t, std::size_t d, unsigned bits) {
  t.bits = bits;
  if (bits != 3) {
    t.units = codec::group_units(d, bits);
    t.lookups = t.units;
    return;
  }
  t.units = codec::group_sixteens(d);
#ifdef RINGKV_PAIR_LOOKUP
  t.lookups = 8 * t.units;
#else
  t.lookups = 16 * t.units;
#endif
}

/// Sets head h's delta = most / table_step_max (most: a bound on the head's |entries|, 0 for a
/// zero query) and returns 1 / delta (0 when most is 0).
HWY_INLINE float SetDelta(scan_tables& t, std::size_t h, float most) {
  t.delta[h] = most / float(table_step_max);
  return most > 0 ? float(table_step_max) / most : 0.0f;
}

/// The float table_bias, where a table's values start (they are summed into it already scaled).
HWY_INLINE VF Bias() { return hn::Set(DF(), float(table_bias)); }

/// Stores table values already scaled by 1 / delta and biased (in 1 … 127 once rounded, by
/// delta's bound; no clamp) as entries, one byte a lane.
HWY_INLINE void StoreEntries(VF v, std::uint8_t* out) {
  const hn::Rebind<std::uint8_t, DF> d8;
  hn::StoreU(hn::DemoteTo(d8, hn::NearestInt(v)), d8, out);
}

/// Head h's tables for nibble codes (1, 2, 4 bits) of query row q (d floats) and levels (2^bits,
/// symmetric): unit u's entry e = Σ_i c_i << (bits · i) is Σ_i q[coordinate u·(4 / bits) + i] ·
/// levels[c_i]. delta bounds every entry by the largest level times the sum of a unit's |q|.
HWY_INLINE void BuildNibbleTables(scan_tables& t, std::size_t h, const float* q, std::size_t d,
                                  const float* levels) {
  const DF df;
  const std::size_t N = hn::Lanes(df), per_unit = 4 / t.bits;
  const unsigned mask = (1u << t.bits) - 1;
  const float top = std::fabs(levels[0]);  // the largest |level| (levels are increasing)
  HWY_ALIGN float pattern[4][16];  // pattern[i][e]: the level of the unit's i-th code in entry e
  for (std::size_t i = 0; i < per_unit; ++i)
    for (unsigned e = 0; e < 16; ++e) pattern[i][e] = levels[(e >> (t.bits * i)) & mask];
  const auto coordinate = [&](std::size_t u, std::size_t i) {
    const std::size_t c = u * per_unit + i;
    return c < d ? q[c] : 0.0f;
  };
  float most = 0;
  for (std::size_t u = 0; u < t.units; ++u) {
    float sum = 0;
    for (std::size_t i = 0; i < per_unit; ++i) sum += std::fabs(coordinate(u, i));
    most = std::max(most, sum * top);
  }
  const float inverse = SetDelta(t, h, most);
  std::uint8_t* out = t.bytes + h * t.head_bytes();
  for (std::size_t u = 0; u < t.units; ++u, out += 16)
    for (std::size_t e = 0; e < 16; e += N) {
      VF v = Bias();
      for (std::size_t i = 0; i < per_unit; ++i)
        v = hn::MulAdd(hn::Set(df, coordinate(u, i) * inverse), hn::Load(df, pattern[i] + e), v);
      StoreEntries(v, out + e);
    }
}

/// The sum of a vector's 128-bit blocks (16-bit lanes, wrapping).
template <class D>
HWY_INLINE hn::Vec<hn::CappedTag<std::uint16_t, 8>> SumBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) > 8) {
    const hn::Half<D> dh;
    return SumBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    return v;
  }
}

/// The 16 slots' sums of one 128-bit block of accumulators: `even` holds each 16-bit lane's two
/// bytes summed as one number (wrapping), `odd` its high bytes; to out[0..16) in slot order.
HWY_INLINE void FinishBlock(hn::Vec<hn::CappedTag<std::uint16_t, 8>> even,
                            hn::Vec<hn::CappedTag<std::uint16_t, 8>> odd, std::uint16_t* out) {
  const hn::CappedTag<std::uint16_t, 8> d;
  const auto e = hn::Sub(even, hn::ShiftLeft<8>(odd));
  hn::StoreU(hn::InterleaveLower(d, e, odd), d, out);
  hn::StoreU(hn::InterleaveUpper(d, e, odd), d, out + 8);
}

/// FinishBlock of a half group's accumulators whose every block holds the same 16 slots.
HWY_INLINE void FinishHalf(V16 even, V16 odd, std::uint16_t* out) {
  FinishBlock(SumBlocks(D16(), even), SumBlocks(D16(), odd), out);
}

/// The 32 slots' sums of a group's accumulators of at least 256 bits whose byte lane i holds slot
/// i mod 32 (as FinishBlock's).
template <class D>
HWY_INLINE void FinishSlots(D d, hn::Vec<D> even, hn::Vec<D> odd, std::uint16_t* out) {
  const hn::Half<D> dh;
  if constexpr (hn::MaxLanes(D()) > 16) {
    FinishSlots(dh, hn::Add(hn::LowerHalf(dh, even), hn::UpperHalf(dh, even)),
                hn::Add(hn::LowerHalf(dh, odd), hn::UpperHalf(dh, odd)), out);
  } else {
    FinishBlock(hn::LowerHalf(dh, even), hn::LowerHalf(dh, odd), out);
    FinishBlock(hn::UpperHalf(dh, even), hn::UpperHalf(dh, odd), out + 16);
  }
}

/// Asks for the cache line at p (prefetcht0, as the f32 kernels' PrefetchLine).
HWY_INLINE void Prefetch(const std::uint8_t* p) { __builtin_prefetch(p, 0, 3); }

/// Adds one lookup's bytes (a slot a byte) to their 16-bit accumulators.
template <class V8, class VW>
HWY_INLINE void AddLookup(V8 r, VW& even, VW& odd) {
  const hn::DFromV<VW> dw;
  even = hn::Add(even, hn::BitCast(dw, r));
  odd = hn::Add(odd, hn::ShiftRight<8>(hn::BitCast(dw, r)));
}

/// sums[h][32] = per slot of the group at `codes`, the sum of head h's table entries its codes
/// look up (nibble units: bits 1, 2, 4).
template <std::size_t Heads>
HWY_INLINE void ScanNibbles(const std::uint8_t* HWY_RESTRICT codes, const std::uint8_t* next,
                            const scan_tables& t, std::uint16_t* HWY_RESTRICT sums) {
  const D8 d8;
  const D16 d16;
  const auto low = hn::Set(d8, 0x0F);
  V16 ae[Heads], ao[Heads], be[Heads], bo[Heads];
  for (std::size_t h = 0; h < Heads; ++h) ae[h] = ao[h] = be[h] = bo[h] = hn::Zero(d16);
  const std::size_t stride = t.head_bytes(), step = hn::Lanes(d8), bytes = 16 * t.units;
  std::size_t at = 0;
  for (; at + 2 * step <= bytes; at += 2 * step) {  // two steps' lookups added as bytes
    Prefetch(next + at);
    Prefetch(next + at + step);
    const auto x = hn::LoadU(d8, codes + at), y = hn::LoadU(d8, codes + at + step);
    const auto a = hn::And(x, low), c = hn::And(y, low);  // slots 0-15
    const auto b = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, x))), low);
    const auto e = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, y))), low);
    for (std::size_t h = 0; h < Heads; ++h) {
      const auto t0 = hn::Load(d8, t.bytes + h * stride + at);
      const auto t1 = hn::Load(d8, t.bytes + h * stride + at + step);
      AddLookup(hn::Add(hn::TableLookupBytes(t0, a), hn::TableLookupBytes(t1, c)), ae[h], ao[h]);
      AddLookup(hn::Add(hn::TableLookupBytes(t0, b), hn::TableLookupBytes(t1, e)), be[h], bo[h]);
    }
  }
  for (; at < bytes; at += step) {
    Prefetch(next + at);
    const auto x = hn::LoadU(d8, codes + at);
    const auto a = hn::And(x, low);  // slots 0-15
    const auto b = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, x))), low);
    for (std::size_t h = 0; h < Heads; ++h) {
      const auto table = hn::Load(d8, t.bytes + h * stride + at);
      AddLookup(hn::TableLookupBytes(table, a), ae[h], ao[h]);
      AddLookup(hn::TableLookupBytes(table, b), be[h], bo[h]);
    }
  }
  for (std::size_t h = 0; h < Heads; ++h) {
    FinishHalf(ae[h], ao[h], sums + 32 * h);
    FinishHalf(be[h], bo[h], sums + 32 * h + 16);
  }
}

/// out[0, 32) = (sums − table_bias · lookups) · delta as floats, times factors[0, 32) (a group's
/// slots).
HWY_INLINE void ScaleSums(const std::uint16_t* sums, const scan_tables& t, std::size_t h,
                          const float* factors, float* out) {
  const DF df;
  const hn::Rebind<std::int32_t, DF> di;
  const hn::Rebind<std::uint16_t, DF> du16;
  const hn::Rebind<std::uint32_t, DF> du32;
  const auto bias = hn::Set(di, std::int32_t(table_bias * t.lookups));
  const VF delta = hn::Set(df, t.delta[h]);
  for (std::size_t i = 0; i < codec::group_slots; i += hn::Lanes(df)) {
    const auto n = hn::Sub(hn::BitCast(di, hn::PromoteTo(du32, hn::LoadU(du16, sums + i))), bias);
    hn::StoreU(hn::Mul(hn::Mul(hn::ConvertTo(df, n), delta), hn::LoadU(df, factors + i)), df,
               out + i);
  }
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_SCAN_INL_H_
