// Per-target fast scan of 3-bit TurboQuant keys (slot groups of quant_codec.h: a byte a slot, each
// plane byte two codes' 6-bit pair index). Where a byte permute reads 64 entries (VPERMT2B,
// RINGKV_PAIR_LOOKUP) a pair of coordinates is one lookup of a 64-entry table of q'_a·c[i] +
// q'_b·c[j]: four lookups for eight coordinates of 32 slots. Elsewhere each code is looked up in
// a 16-entry table (TableLookupBytes) after a mask or a shift, as the nibble scan does. Then
// ScanGroup and BuildTables, which pick the scan of a group's code width.
#if defined(RINGKV_TRIPLES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_TRIPLES_INL_H_
#undef RINGKV_TRIPLES_INL_H_
#else
#define RINGKV_TRIPLES_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/quant/scan-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

/// Head h's tables for 3-bit codes of query row q (d floats) and levels (8, symmetric), shaped as
/// scan_tables says: a pair table's entry e is q[a]·levels[e & 7] + q[a + 1]·levels[e >> 3], a
/// single code's q[c]·levels[e & 7] (an index's bit 3 belongs to another code). delta bounds
/// every entry by the largest level times the |q| a lookup covers.
HWY_INLINE void BuildTripleTables(scan_tables& t, std::size_t h, const float* q, std::size_t d,
                                  const float* levels) {
  const DF df;
  const std::size_t N = hn::Lanes(df), coordinates = 16 * t.units;
  HWY_ALIGN float low[64], high[64];  // the levels of an entry's codes: e & 7, e >> 3
  for (unsigned e = 0; e < 64; ++e) {
    low[e] = levels[e & 7];
    high[e] = levels[e >> 3];
  }
  const auto at = [&](std::size_t c) { return c < d ? q[c] : 0.0f; };
  const float top = std::fabs(levels[0]);
  std::uint8_t* out = t.bytes + h * t.head_bytes();
  float most = 0;
#ifdef RINGKV_PAIR_LOOKUP
  for (std::size_t c = 0; c < coordinates; c += 2)
    most = std::max(most, (std::fabs(at(c)) + std::fabs(at(c + 1))) * top);
  const float inverse = SetDelta(t, h, most);
  for (std::size_t c = 0; c < coordinates; c += 2, out += 64) {  // [sixteens][2][4] = pair c / 2
    const VF a = hn::Set(df, at(c) * inverse), b = hn::Set(df, at(c + 1) * inverse);
    for (std::size_t e = 0; e < 64; e += N)
      StoreEntries(
          hn::MulAdd(b, hn::Load(df, high + e), hn::MulAdd(a, hn::Load(df, low + e), Bias())),
          out + e);
  }
#else
  for (std::size_t c = 0; c < coordinates; ++c) most = std::max(most, std::fabs(at(c)) * top);
  const float inverse = SetDelta(t, h, most);
  for (std::size_t u = 0; u < t.units; ++u)
    for (std::size_t j = 0; j < 8; ++j)
      for (std::size_t s = 0; s < 2; ++s, out += 32) {  // two blocks of octet 2u + s's table j
        const VF a = hn::Set(df, at(16 * u + 8 * s + j) * inverse);
        for (std::size_t e = 0; e < 32; e += N)
          StoreEntries(hn::MulAdd(a, hn::Load(df, low + e), Bias()), out + e);
      }
#endif
}

/// The pair index of coordinates 8o + 6, 8o + 7 from an octet's three plane vectors: their bits
/// 6-7, as bits 0-1, 2-3, 4-5 (bits 6-7 of the result are left over).
template <class V>
HWY_INLINE V PairIndex(V x0, V x1, V x2) {
  const hn::DFromV<V> d;
  const hn::RepartitionToWide<decltype(d)> dw;
  const V s0 = hn::BitCast(d, hn::ShiftRight<6>(hn::BitCast(dw, x0)));
  const V s1 = hn::BitCast(d, hn::ShiftRight<4>(hn::BitCast(dw, x1)));
  const V s2 = hn::BitCast(d, hn::ShiftRight<2>(hn::BitCast(dw, x2)));
  // bitwise selects (IfVecThenElse selects whole lanes below AVX3)
  const auto select = [](V mask, V yes, V no) {
    return hn::Or(hn::And(mask, yes), hn::AndNot(mask, no));
  };
  return select(hn::Set(d, 0x03), s0, select(hn::Set(d, 0x30), s2, s1));
}

#ifdef RINGKV_PAIR_LOOKUP
/// The 64-entry table at t (two 32-byte halves) at the low six bits of each byte of idx.
HWY_INLINE hn::Vec<hn::Full256<std::uint8_t>> LookupPair(const std::uint8_t* t,
                                                         hn::Vec<hn::Full256<std::uint8_t>> idx) {
  const hn::Full256<std::uint8_t> d;
  return hn::Vec<hn::Full256<std::uint8_t>>{
      _mm256_permutex2var_epi8(hn::Load(d, t).raw, idx.raw, hn::Load(d, t + 32).raw)};
}

/// sums[h][32] = per slot of the group at `codes`, the sum of head h's pair entries its codes
/// look up: per 16 coordinates six plane vectors of 32 slots, each one lookup a head, and the
/// two pair indices of coordinates 6 and 7 of each octet. 256-bit vectors: a VPERMT2B of 32 bytes
/// costs a 64-byte VPSHUFB's half on Zen 4 (and a whole one where 512-bit shuffles are native).
template <std::size_t Heads>
HWY_INLINE void ScanTriples(const std::uint8_t* HWY_RESTRICT codes, const std::uint8_t* next,
                            const scan_tables& t, std::uint16_t* HWY_RESTRICT sums) {
  const hn::Full256<std::uint8_t> d8;
  const hn::Full256<std::uint16_t> d16;
  hn::Vec<decltype(d16)> even[Heads], odd[Heads];
  for (std::size_t h = 0; h < Heads; ++h) even[h] = odd[h] = hn::Zero(d16);
  const std::size_t stride = t.head_bytes();
  for (std::size_t u = 0; u < t.units; ++u) {
    const std::uint8_t* c = codes + 192 * u;
    for (std::size_t p = 0; p < 3; ++p) Prefetch(next + 192 * u + 64 * p);
    // plane p of octets 2u (a) and 2u + 1 (b)
    const auto a0 = hn::LoadU(d8, c), b0 = hn::LoadU(d8, c + 32);
    const auto a1 = hn::LoadU(d8, c + 64), b1 = hn::LoadU(d8, c + 96);
    const auto a2 = hn::LoadU(d8, c + 128), b2 = hn::LoadU(d8, c + 160);
    const auto a3 = PairIndex(a0, a1, a2), b3 = PairIndex(b0, b1, b2);
    for (std::size_t h = 0; h < Heads; ++h) {
      const std::uint8_t* ta = t.bytes + h * stride + 512 * u;  // [2][4][64]
      const std::uint8_t* tb = ta + 256;
      AddLookup(hn::Add(LookupPair(ta, a0), LookupPair(ta + 64, a1)), even[h], odd[h]);
      AddLookup(hn::Add(LookupPair(ta + 128, a2), LookupPair(ta + 192, a3)), even[h], odd[h]);
      AddLookup(hn::Add(LookupPair(tb, b0), LookupPair(tb + 64, b1)), even[h], odd[h]);
      AddLookup(hn::Add(LookupPair(tb + 128, b2), LookupPair(tb + 192, b3)), even[h], odd[h]);
    }
  }
  for (std::size_t h = 0; h < Heads; ++h) FinishSlots(d16, even[h], odd[h], sums + 32 * h);
}
#else
/// As the pair scan with a 16-entry lookup a code: a plane byte's codes are its bits 0-3 and
/// 3-6 (bit 3 and 6 another code's, read by entries repeated in the table's upper half); a
/// vector of codes is 64 bytes of one plane of 16 coordinates or a part of it (64-byte vectors:
/// both octets; 32: one; 16: half of one's slots, so two accumulators).
template <std::size_t Heads>
HWY_INLINE void ScanTriples(const std::uint8_t* HWY_RESTRICT codes, const std::uint8_t* next,
                            const scan_tables& t, std::uint16_t* HWY_RESTRICT sums) {
  const D8 d8;
  const D16 d16;
  const std::size_t N = hn::Lanes(d8), halves = N < 32 ? 2 : 1;
  const auto low4 = hn::Set(d8, 0x0F);
  const auto right3 = [&](hn::Vec<D8> v) {
    return hn::And(hn::BitCast(d8, hn::ShiftRight<3>(hn::BitCast(d16, v))), low4);
  };
  V16 even[Heads][2], odd[Heads][2];
  for (std::size_t h = 0; h < Heads; ++h)
    even[h][0] = odd[h][0] = even[h][1] = odd[h][1] = hn::Zero(d16);
  const std::size_t stride = t.head_bytes();
  for (std::size_t u = 0; u < t.units; ++u) {
    for (std::size_t p = 0; p < 3; ++p) Prefetch(next + 192 * u + 64 * p);
    for (std::size_t at = 0; at < 64; at += N) {
      const std::size_t k = at / 16 % halves;  // slots 16k … 16k + 15 (16-byte vectors)
      const std::uint8_t* c = codes + 192 * u + at;
      const auto x0 = hn::LoadU(d8, c), x1 = hn::LoadU(d8, c + 64), x2 = hn::LoadU(d8, c + 128);
      const auto x3 = PairIndex(x0, x1, x2);
      const auto l0 = hn::And(x0, low4), h0 = right3(x0), l1 = hn::And(x1, low4), h1 = right3(x1);
      const auto l2 = hn::And(x2, low4), h2 = right3(x2), l3 = hn::And(x3, low4), h3 = right3(x3);
      for (std::size_t h = 0; h < Heads; ++h) {
        const std::uint8_t* tj = t.bytes + h * stride + 512 * u + at;  // [8][64]
        const auto lookup = [&](std::size_t j, hn::Vec<D8> idx) {
          return hn::TableLookupBytes(hn::Load(d8, tj + 64 * j), idx);
        };
        AddLookup(hn::Add(lookup(0, l0), lookup(1, h0)), even[h][k], odd[h][k]);
        AddLookup(hn::Add(lookup(2, l1), lookup(3, h1)), even[h][k], odd[h][k]);
        AddLookup(hn::Add(lookup(4, l2), lookup(5, h2)), even[h][k], odd[h][k]);
        AddLookup(hn::Add(lookup(6, l3), lookup(7, h3)), even[h][k], odd[h][k]);
      }
    }
  }
  for (std::size_t h = 0; h < Heads; ++h) {
    if constexpr (hn::MaxLanes(D16()) > 8) {
      FinishSlots(d16, even[h][0], odd[h][0], sums + 32 * h);
    } else {
      FinishBlock(even[h][0], odd[h][0], sums + 32 * h);
      FinishBlock(even[h][1], odd[h][1], sums + 32 * h + 16);
    }
  }
}
#endif

/// Head h's tables for query row q of t's shape (see scan_tables).
HWY_INLINE void BuildTables(scan_tables& t, std::size_t h, const float* q, std::size_t d,
                            const float* levels) {
  if (t.bits == 3) return BuildTripleTables(t, h, q, d, levels);
  BuildNibbleTables(t, h, q, d, levels);
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
  WithHeads(heads, [&](auto h) RINGKV_INLINE_LAMBDA {
    constexpr std::size_t H = decltype(h)::value;
    return triples ? ScanTriples<H>(c, n, t, sums) : ScanNibbles<H>(c, n, t, sums);
  });
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_TRIPLES_INL_H_
