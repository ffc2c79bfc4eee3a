// Per-target fast scan of TurboQuant keys in slot groups (quant_codec.h): the score of a key is
// norm × Σᵢ q'ᵢ·c[codeᵢ] for the query q' rotated into the kv head's frame, so per query head a
// table of 16 bytes a unit (the 7-bit rounded q'ᵢ·c of each nibble's codes) turns a group's
// codes into scores with byte shuffles (TableLookupBytes): one shuffle looks up one unit's
// codes of 16 slots, a vector of 16 bytes a unit at a time (the "fast scan" of product
// quantization: André, Kermarrec, Le Scouarnec, VLDB 2015). The lookups are summed in 16-bit
// lanes, exactly, so a slot's score does not depend on which slots, groups or vectors shared
// its arithmetic: the bits are those of any ring phase, split or target.
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

#include "hwy/highway.h"
#include "kernels/rows-inl.h"
#include "quant_codec.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

using D8 = hn::ScalableTag<std::uint8_t>;
using D16 = hn::ScalableTag<std::uint16_t>;
using V16 = hn::Vec<D16>;

/// Query heads a scan takes at once (their 16-bit sums stay in registers).
inline constexpr std::size_t max_scan_heads = 4;
// Table entries are round(T / delta) in ±table_step_max, stored + table_bias (1 … 127): 7 bits,
// so two lookups add in a byte before they are widened to 16-bit sums (a third fewer
// operations a lookup, twice the 8-bit tables' rounding: Zen 4, tq4 ÷ f16 0.82 -> 0.77 at
// D 64 / W 4096 / kv 2, output error against f32 x1.005-1.04 the exact codebook's at 4 bits,
// from x1.005-1.015; re-measure: python3 bench/compressed_targets.py and compressed_attention_test).
inline constexpr int table_step_max = 63;
inline constexpr int table_bias = 64;

/// One plane set's lookup tables for a chunk of query heads: per head `kinds` tables of `units`
/// units of 16 bytes, [heads][kinds][units][16], each entry round(T / delta) + table_bias for
/// the table's value T; a slot's `lookups` entries sum to its score / delta + table_bias ·
/// lookups.
struct scan_tables {
  std::uint8_t* bytes = nullptr;  // 64-byte aligned
  std::size_t units = 0, kinds = 1, lookups = 0;
  unsigned bits = 0;  // of the codes: 1, 2, 4 (a nibble of codes a unit) or 3 (three planes)
  // 3 bits: kind k < 3 looks up coordinate 4u + k, kind 3 coordinate 4u + 3, whose index holds
  // its code's bits 0, 1, 2 at bits 3, 2, 1 (quant_codec.h)
  float delta[max_scan_heads] = {};
  std::size_t head_bytes() const { return 16 * kinds * units; }
};

/// Sets t's shape for `bits`-bit codes of `d` coordinates (bits 1 to 4).
HWY_INLINE void ShapeTables(scan_tables& t, std::size_t d, unsigned bits) {
  t.bits = bits;
  t.units = codec::group_units(d, bits);
  t.kinds = bits == 3 ? 4 : 1;
  t.lookups = bits == 3 ? 4 * t.units : t.units;
}

/// Coordinate of lookup (kind, unit, position t within the nibble) of t's shape.
HWY_INLINE std::size_t TableCoordinate(const scan_tables& t, std::size_t kind, std::size_t u,
                                       std::size_t i) {
  if (t.bits == 3) return 4 * u + kind;
  return u * (4 / t.bits) + i;
}

/// Head h's tables for query row q (d floats) and levels (2^bits, symmetric): unit u of kind k
/// looks up entry e = Σ_i c_i << (bits · i) as Σ_i q[coordinate i] · levels[c_i] (3 bits: one
/// coordinate: c = e mod 8, for kind 3 e's bits 3, 2, 1). delta = max |entry| / table_step_max
/// bounds every entry by the largest level times the sum of a unit's |q| (0 for a zero query),
/// so the stored entries lie in 1..127.
HWY_INLINE void BuildTables(scan_tables& t, std::size_t h, const float* q, std::size_t d,
                            const float* levels) {
  const DF df;
  const hn::Rebind<std::int32_t, DF> di;
  const hn::Rebind<std::uint8_t, DF> d8;
  const std::size_t N = hn::Lanes(df), per_unit = t.bits == 3 ? 1 : 4 / t.bits;
  const unsigned mask = t.bits == 3 ? 7u : (1u << t.bits) - 1;
  const float top = std::fabs(levels[0]);  // the largest |level| (levels are increasing)
  // pattern[i][e]: the level of the unit's i-th coordinate in entry e; 3 bits: pattern[0] for
  // kinds 0-2 (an index's bit 3 is another code's), pattern[1] for kind 3.
  HWY_ALIGN float pattern[4][16];
  for (std::size_t i = 0; i < per_unit; ++i)
    for (unsigned e = 0; e < 16; ++e) pattern[i][e] = levels[(e >> (t.bits * i)) & mask];
  if (t.bits == 3)
    for (unsigned e = 0; e < 16; ++e)
      pattern[1][e] = levels[(e >> 3 & 1) | (e >> 1 & 2) | (e << 1 & 4)];
  const auto coordinate = [&](std::size_t k, std::size_t u, std::size_t i) {
    const std::size_t c = TableCoordinate(t, k, u, i);
    return c < d ? q[c] : 0.0f;
  };
  float most = 0;
  for (std::size_t k = 0; k < t.kinds; ++k)
    for (std::size_t u = 0; u < t.units; ++u) {
      float sum = 0;
      for (std::size_t i = 0; i < per_unit; ++i) sum += std::fabs(coordinate(k, u, i));
      most = std::max(most, sum * top);
    }
  t.delta[h] = most / float(table_step_max);
  const VF inverse = hn::Set(df, most > 0 ? float(table_step_max) / most : 0.0f);
  const auto low = hn::Set(di, -table_step_max), high = hn::Set(di, table_step_max);
  const auto bias = hn::Set(di, table_bias);
  std::uint8_t* out = t.bytes + h * t.head_bytes();
  for (std::size_t k = 0; k < t.kinds; ++k)
    for (std::size_t u = 0; u < t.units; ++u, out += 16)
      for (std::size_t e = 0; e < 16; e += N) {
        const float* first = pattern[t.bits == 3 && k == 3 ? 1 : 0] + e;
        VF v = hn::Mul(hn::Set(df, coordinate(k, u, 0)), hn::Load(df, first));
        for (std::size_t i = 1; i < per_unit; ++i)
          v = hn::MulAdd(hn::Set(df, coordinate(k, u, i)), hn::Load(df, pattern[i] + e), v);
        const auto r = hn::Min(hn::Max(hn::NearestInt(hn::Mul(v, inverse)), low), high);
        hn::StoreU(hn::DemoteTo(d8, hn::Add(r, bias)), d8, out + e);
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

/// The 16 slots' sums of a half group from its accumulators: `even` holds each 16-bit lane's two
/// bytes summed as one number (wrapping), `odd` its high bytes; to out[0..16) in slot order.
HWY_INLINE void FinishHalf(V16 even, V16 odd, std::uint16_t* out) {
  const hn::CappedTag<std::uint16_t, 8> d;
  const auto o = SumBlocks(D16(), odd);
  const auto e = hn::Sub(SumBlocks(D16(), even), hn::ShiftLeft<8>(o));
  hn::StoreU(hn::InterleaveLower(d, e, o), d, out);
  hn::StoreU(hn::InterleaveUpper(d, e, o), d, out + 8);
}

/// Asks for the cache line at p (prefetcht0, as the f32 kernels' PrefetchLine).
HWY_INLINE void Prefetch(const std::uint8_t* p) { __builtin_prefetch(p, 0, 3); }

/// Adds one shuffle's looked-up bytes (16 slots a block) to a half group's accumulators.
HWY_INLINE void AddLookup(hn::Vec<D8> r, V16& even, V16& odd) {
  const D16 d16;
  even = hn::Add(even, hn::BitCast(d16, r));
  odd = hn::Add(odd, hn::ShiftRight<8>(hn::BitCast(d16, r)));
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

/// As ScanNibbles for 3-bit codes: per unit step the three planes x, y, z; the codes of
/// coordinate 4u + p are plane p's nibbles' low three bits (an index: the nibble; its bit 3,
/// another code's, reads an entry repeated in the table's upper half), those of 4u + 3 the
/// nibbles' top bits, gathered into one byte whose nibbles are both halves' indices. Eight
/// lookups a unit from 17 operations on the codes (32 with each code's bits apart).
template <std::size_t Heads>
HWY_INLINE void ScanTriples(const std::uint8_t* HWY_RESTRICT codes, const std::uint8_t* next,
                            const scan_tables& t, std::uint16_t* HWY_RESTRICT sums) {
  const D8 d8;
  const D16 d16;
  const auto shift = [&](auto v, auto by) { return hn::BitCast(d8, by(hn::BitCast(d16, v))); };
  const auto right2 = [](V16 v) { return hn::ShiftRight<2>(v); };
  const auto right4 = [](V16 v) { return hn::ShiftRight<4>(v); };
  const auto right1 = [](V16 v) { return hn::ShiftRight<1>(v); };
  const auto low4 = hn::Set(d8, 0x0F);
  V16 ae[Heads], ao[Heads], be[Heads], bo[Heads];
  for (std::size_t h = 0; h < Heads; ++h) ae[h] = ao[h] = be[h] = bo[h] = hn::Zero(d16);
  const std::size_t plane = 16 * t.units, stride = t.head_bytes();
  for (std::size_t at = 0; at < plane; at += hn::Lanes(d8)) {
    for (std::size_t p = 0; p < 3; ++p) Prefetch(next + p * plane + at);
    const auto x = hn::LoadU(d8, codes + at), y = hn::LoadU(d8, codes + plane + at),
               z = hn::LoadU(d8, codes + 2 * plane + at);
    // slots 0-15 (a) and 16-31 (b) of coordinates 4u + 0 … 3
    const auto a0 = hn::And(x, low4), b0 = hn::And(shift(x, right4), low4);
    const auto a1 = hn::And(y, low4), b1 = hn::And(shift(y, right4), low4);
    const auto a2 = hn::And(z, low4), b2 = hn::And(shift(z, right4), low4);
    // r: bits 3, 2, 1 the top bits of x, y, z's low nibbles, bits 7, 6, 5 of their high ones
    const auto r =
        hn::OrAnd(hn::OrAnd(hn::And(x, hn::Set(d8, 0x88)), shift(y, right1), hn::Set(d8, 0x44)),
                  shift(z, right2), hn::Set(d8, 0x22));
    const auto a3 = hn::And(r, low4), b3 = hn::And(shift(r, right4), low4);
    for (std::size_t h = 0; h < Heads; ++h) {
      const std::uint8_t* tables = t.bytes + h * stride + at;
      const auto t0 = hn::Load(d8, tables), t1 = hn::Load(d8, tables + plane),
                 t2 = hn::Load(d8, tables + 2 * plane), t3 = hn::Load(d8, tables + 3 * plane);
      AddLookup(hn::Add(hn::TableLookupBytes(t0, a0), hn::TableLookupBytes(t1, a1)), ae[h], ao[h]);
      AddLookup(hn::Add(hn::TableLookupBytes(t2, a2), hn::TableLookupBytes(t3, a3)), ae[h], ao[h]);
      AddLookup(hn::Add(hn::TableLookupBytes(t0, b0), hn::TableLookupBytes(t1, b1)), be[h], bo[h]);
      AddLookup(hn::Add(hn::TableLookupBytes(t2, b2), hn::TableLookupBytes(t3, b3)), be[h], bo[h]);
    }
  }
  for (std::size_t h = 0; h < Heads; ++h) {
    FinishHalf(ae[h], ao[h], sums + 32 * h);
    FinishHalf(be[h], bo[h], sums + 32 * h + 16);
  }
}

/// sums[h][32] for the first `heads` (≤ max_scan_heads) tables of t over the group at `codes`,
/// asking for the group at `next` meanwhile (a line a vector of codes read: groups come from the
/// L3 or memory, and a segment's scan alternates with its V rows, which restarts the hardware's
/// streams).
HWY_INLINE void ScanGroup(const std::byte* codes, const std::byte* next, const scan_tables& t,
                          std::size_t heads, std::uint16_t* sums) {
  const auto* c = reinterpret_cast<const std::uint8_t*>(codes);
  const auto* n = reinterpret_cast<const std::uint8_t*>(next);
  const bool triples = t.bits == 3;
  switch (heads) {
    case 1:
      return triples ? ScanTriples<1>(c, n, t, sums) : ScanNibbles<1>(c, n, t, sums);
    case 2:
      return triples ? ScanTriples<2>(c, n, t, sums) : ScanNibbles<2>(c, n, t, sums);
    case 3:
      return triples ? ScanTriples<3>(c, n, t, sums) : ScanNibbles<3>(c, n, t, sums);
    default:
      return triples ? ScanTriples<4>(c, n, t, sums) : ScanNibbles<4>(c, n, t, sums);
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
