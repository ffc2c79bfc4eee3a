// Per-target expansion of compressed rows stored whole (TurboQuant values, int8 keys and values)
// straight into the arithmetic: a V row's codes become f32 vectors in registers, the codebook
// held in SIMD lanes (TableLookupLanes), and are multiplied into the block's sums at once; an
// int8 key row is converted and dotted with the query. Nothing is written to a tile. A chunk of
// a row's bytes expands to a few vectors whose lanes are its coordinates in an order fixed per
// target (expansion order: 4-bit codes of a chunk give its even coordinates, then its odd ones),
// which the caller undoes once per output row.
#if defined(RINGKV_EXPAND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_EXPAND_INL_H_
#undef RINGKV_EXPAND_INL_H_
#else
#define RINGKV_EXPAND_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/dot-inl.h"
#include "kernels/rows-inl.h"
#include "kernels/quant/scan-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

using DI = hn::Rebind<std::int32_t, DF>;
using DU32 = hn::Rebind<std::uint32_t, DF>;

/// table[idx] per lane for a table of `Vectors` whole vectors (zero-padded): one TableLookupLanes
/// per table vector, chosen by idx's high bits (one lookup for 16 levels on 16-lane targets).
template <std::size_t Vectors>
HWY_INLINE VF Lookup(DF d, const float* levels, hn::Vec<DU32> idx) {
  const DI di;
  const std::size_t N = hn::Lanes(d);
  const auto i = hn::BitCast(di, idx);
  const auto lane = hn::IndicesFromVec(d, hn::And(i, hn::Set(di, std::int32_t(N - 1))));
  VF r = hn::TableLookupLanes(hn::Load(d, levels), lane);
  for (std::size_t v = 1; v < Vectors; ++v) {
    const auto upper = hn::RebindMask(d, hn::Gt(i, hn::Set(di, std::int32_t(v * N - 1))));
    r = hn::IfThenElse(upper, hn::TableLookupLanes(hn::Load(d, levels + v * N), lane), r);
  }
  return r;
}

/// Whole vectors a table of `entries` levels takes.
constexpr std::size_t TableVectors(std::size_t entries) {
  return (entries + hn::MaxLanes(DF()) - 1) / hn::MaxLanes(DF());
}

// On 16-lane x86 targets a table of 16 levels is one permute, which reads only the low four
// bits of each index: indices may keep the bits above their code (no mask), the codebooks of
// fewer levels repeated to 16 entries (lane_levels).
#undef RINGKV_PERMUTE_LOW_BITS
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define RINGKV_PERMUTE_LOW_BITS 1
#endif

/// levels[idx mod 2^Bits] per lane, `levels` the codebook repeated to 16 entries.
template <unsigned Bits>
HWY_INLINE VF LookupLevels(DF d, const float* levels, hn::Vec<DU32> idx) {
#ifdef RINGKV_PERMUTE_LOW_BITS
  return hn::TableLookupLanes(hn::Load(d, levels), hn::Indices512<float>{idx.raw});
#else
  return Lookup<TableVectors(std::size_t{1} << Bits)>(
      d, levels, hn::And(idx, hn::Set(DU32(), (1u << Bits) - 1)));
#endif
}

/// N codes of a chunk's N bytes, one a 32-bit lane.
HWY_INLINE hn::Vec<DU32> WidenBytes(const std::uint8_t* p) {
  return hn::PromoteTo(DU32(), hn::LoadU(hn::Rebind<std::uint8_t, DF>(), p));
}

// The row kinds. Each has: vectors (per chunk), coords() and bytes() (of a chunk), coordinate(e)
// (the coordinate of expansion index e: chunk e / coords(), vector, lane), and
// expand(chunk bytes, levels, out[vectors]).

/// 4-bit codes, two a byte. On 16-lane targets a chunk is 32 bytes, 64 coordinates: each 16-bit
/// pair of bytes widened to a lane holds four codes, taken by shifts (the permute reads an
/// index's low four bits), vector m holding coordinates 4k + m: one widening for four vectors
/// (a shuffle fewer than two widenings of 16 bytes). Elsewhere a chunk of N bytes is 2N
/// coordinates, its even ones then its odd.
struct nibble_rows {
  static constexpr std::size_t lanes = hn::MaxLanes(DF());
  static constexpr std::size_t vectors = lanes == 16 ? 4 : 2;
  static constexpr std::size_t coords() { return vectors * lanes; }
  static constexpr std::size_t bytes() { return coords() / 2; }
  static std::size_t coordinate(std::size_t e) {
    const std::size_t N = hn::Lanes(DF()), r = e % coords();
    return e - r + vectors * (r % N) + r / N;
  }
  static HWY_INLINE void expand(const std::uint8_t* p, const float* levels, VF* out) {
    const DF d;
    if constexpr (lanes == 16) {
      std::uint16_t pairs[16];  // the bytes as 16-bit pairs (little-endian)
      std::memcpy(pairs, p, sizeof(pairs));
      const auto x = hn::PromoteTo(DU32(), hn::LoadU(hn::Rebind<std::uint16_t, DF>(), pairs));
      out[0] = LookupLevels<4>(d, levels, x);
      out[1] = LookupLevels<4>(d, levels, hn::ShiftRight<4>(x));
      out[2] = LookupLevels<4>(d, levels, hn::ShiftRight<8>(x));
      out[3] = LookupLevels<4>(d, levels, hn::ShiftRight<12>(x));
    } else {
      const auto x = WidenBytes(p);
      out[0] = LookupLevels<4>(d, levels, x);
      out[1] = LookupLevels<4>(d, levels, hn::ShiftRight<4>(x));
    }
  }
};

/// 2-bit codes, four a byte: a chunk of N bytes is 4N coordinates, by their position in a byte.
struct crumb_rows {
  static constexpr std::size_t vectors = 4;
  static constexpr std::size_t coords() { return 4 * hn::MaxLanes(DF()); }
  static constexpr std::size_t bytes() { return hn::MaxLanes(DF()); }
  static std::size_t coordinate(std::size_t e) {
    const std::size_t N = hn::Lanes(DF()), r = e % (4 * N);
    return e - r + 4 * (r % N) + r / N;
  }
  static HWY_INLINE void expand(const std::uint8_t* p, const float* levels, VF* out) {
    const DF d;
    const auto x = WidenBytes(p);
    out[0] = LookupLevels<2>(d, levels, x);
    out[1] = LookupLevels<2>(d, levels, hn::ShiftRight<2>(x));
    out[2] = LookupLevels<2>(d, levels, hn::ShiftRight<4>(x));
    out[3] = LookupLevels<2>(d, levels, hn::ShiftRight<6>(x));
  }
};

/// The 32 bits at p (little-endian).
HWY_INLINE std::uint32_t Word32(const std::uint8_t* p) {
  std::uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

/// 3-bit codes, an LSB-first stream. On 16-lane x86 targets a chunk is 64 coordinates (24
/// bytes): one 16-bit permute gives lane i the 32 bits from the even byte at or below bit 12i,
/// so its four codes sit at constant shifts (vector m holds coordinates 4i + m) — two operations
/// a vector, as the 4-bit rows; Highway has no 16-bit permute, hence the intrinsic. Elsewhere a
/// chunk is 16 coordinates in order (6 bytes), a lane's code taken out of a 32-bit word holding
/// it whole. Both read up to 8 bytes past a chunk (the store keeps value_code_padding bytes
/// after its last row).
struct triple_rows {
  static constexpr std::size_t lanes = hn::MaxLanes(DF());
#ifdef RINGKV_PERMUTE_LOW_BITS
  static constexpr std::size_t vectors = 4;
  static constexpr std::size_t coords() { return 64; }
  static constexpr std::size_t bytes() { return 24; }
  static std::size_t coordinate(std::size_t e) {
    const std::size_t r = e % 64;
    return e - r + 4 * (r % 16) + r / 16;
  }
  static HWY_INLINE void expand(const std::uint8_t* p, const float* levels, VF* out) {
    const DF d;
    const DU32 du;
    const hn::Repartition<std::uint16_t, DF> d16;
    // lane i: 16-bit words w and w + 1, w = ⌊⌊1.5 i⌋ / 2⌋; its codes from bit 12i − 16w up
    alignas(64) static constexpr std::uint16_t words[32] = {0, 1, 0, 1,  1, 2,  2,  3,  3,  4, 3,
                                                            4, 4, 5, 5,  6, 6,  7,  6,  7,  7, 8,
                                                            8, 9, 9, 10, 9, 10, 10, 11, 11, 12};
    alignas(64) static constexpr std::uint32_t shifts[16] = {0, 12, 8, 4, 0, 12, 8, 4,
                                                             0, 12, 8, 4, 0, 12, 8, 4};
    const auto raw = hn::ZeroExtendVector(
        d16, hn::LoadU(hn::Half<decltype(d16)>(), reinterpret_cast<const std::uint16_t*>(p)));
    const auto x = hn::BitCast(
        du, hn::Vec<decltype(d16)>{_mm512_permutexvar_epi16(hn::Load(d16, words).raw, raw.raw)});
    const auto s = hn::Load(du, shifts);
    for (std::uint32_t m = 0; m < 4; ++m)
      out[m] = LookupLevels<3>(d, levels, hn::Shr(x, hn::Add(s, hn::Set(du, 3 * m))));
  }
#else
  static constexpr std::size_t vectors = lanes >= 16 ? 1 : 16 / lanes;
  static constexpr std::size_t coords() { return 16; }
  static constexpr std::size_t bytes() { return 6; }
  static std::size_t coordinate(std::size_t e) { return e; }
  static HWY_INLINE void expand(const std::uint8_t* p, const float* levels, VF* out) {
    const DF d;
    const DU32 du;
    const auto iota = hn::Mul(hn::Iota(du, 0), hn::Set(du, 3));
    if constexpr (lanes >= 16) {
      // lanes 0-7: bits 3k of the word at byte 0; lanes 8-15: bits 3k - 16 of the one at byte 2
      const auto second = hn::Not(hn::FirstN(du, 8));
      const auto shifts = hn::IfThenElse(second, hn::Sub(iota, hn::Set(du, 16)), iota);
      const auto words = hn::IfThenElse(second, hn::Set(du, Word32(p + 2)), hn::Set(du, Word32(p)));
      out[0] = LookupLevels<3>(d, levels, hn::Shr(words, shifts));
    } else {
      for (std::size_t v = 0; v < vectors; ++v) {
        const std::size_t first = 3 * v * lanes, byte = first / 8;
        const auto shifts = hn::Add(iota, hn::Set(du, std::uint32_t(first - 8 * byte)));
        out[v] = LookupLevels<3>(d, levels, hn::Shr(hn::Set(du, Word32(p + byte)), shifts));
      }
    }
  }
#endif
};

// On x86 targets with AVX-512 VBMI a byte permute (VPERMB) moves any of 64 bytes to any lane.
#undef RINGKV_BYTE_PERMUTE
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
#define RINGKV_BYTE_PERMUTE 1

/// 3-bit codes, 128 coordinates (48 bytes) a chunk, for rows of whole chunks that one query head
/// reads (a GQA group's heads would hold more sums than registers): a byte permute gives lane i
/// the 32 bits from byte 3i, whose codes 8i … 8i + 7 start at bit 0, so vector m (coordinates
/// 8i + m) is a constant shift and the codebook permute, as for 4-bit rows (the 64-coordinate
/// chunks' lanes start at four shifts, one more operation a vector). Reads 16 bytes past a
/// chunk (value_code_padding).
struct wide_triple_rows {
  static constexpr std::size_t vectors = 8;
  static constexpr std::size_t coords() { return 128; }
  static constexpr std::size_t bytes() { return 48; }
  static std::size_t coordinate(std::size_t e) {
    const std::size_t r = e % 128;
    return e - r + 8 * (r % 16) + r / 16;
  }
  template <int M>
  static HWY_INLINE void expand_from(hn::Vec<DU32> x, const float* levels, VF* out) {
    out[M] = LookupLevels<3>(DF(), levels, hn::ShiftRight<3 * M>(x));
    if constexpr (M + 1 < int(vectors)) expand_from<M + 1>(x, levels, out);
  }
  static HWY_INLINE void expand(const std::uint8_t* p, const float* levels, VF* out) {
    const hn::Repartition<std::uint8_t, DF> d8;
    alignas(64) static constexpr std::uint8_t
        from[64] =
            {
                0,  1,  2,  3,  3,  4,  5,  6,  6,  7,  8,  9,  9,  10, 11, 12, 12,
                13, 14, 15, 15, 16, 17, 18, 18, 19, 20, 21, 21, 22, 23, 24, 24, 25,
                26, 27, 27, 28, 29, 30, 30, 31, 32, 33, 33, 34, 35, 36, 36, 37, 38,
                39, 39, 40, 41, 42, 42, 43, 44, 45, 45, 46, 47, 48};  // lane i: bytes 3i … 3i + 3
    const auto x = hn::Vec<decltype(d8)>{
        _mm512_permutexvar_epi8(hn::Load(d8, from).raw, hn::LoadU(d8, p).raw)};
    expand_from<0>(hn::BitCast(DU32(), x), levels, out);
  }
};
#endif

/// int8 codes: a chunk of N bytes is N coordinates in order, converted exactly.
struct int8_rows {
  static constexpr std::size_t vectors = 1;
  static constexpr std::size_t coords() { return hn::MaxLanes(DF()); }
  static constexpr std::size_t bytes() { return hn::MaxLanes(DF()); }
  static std::size_t coordinate(std::size_t e) { return e; }
  static HWY_INLINE void expand(const std::uint8_t* p, const float*, VF* out) {
    const hn::Rebind<std::int8_t, DF> d8;
    out[0] = hn::ConvertTo(
        DF(), hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(p))));
  }
};

// Independent multiply-adds a head's row keeps in flight (two pipes × four cycles of latency):
// with one query head per kv head, rows of fewer vectors are summed in more chains (RowChains);
// a GQA group's heads are chains enough.
inline constexpr std::size_t row_accumulators = 8;
// Accumulators a slice of V chunks keeps in registers (two thirds of them on 32-register targets).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t slice_accumulators = 16;
#else
inline constexpr std::size_t slice_accumulators = 8;
#endif

/// Chains a head's sums of `Kind` rows of `chunks` chunks take in a step whose query heads share
/// each kv head `group` at a time: with GQA one, else as many as fill row_accumulators, up to 4.
/// Decided by the step's shape alone, never by the heads a call takes.
template <class Kind>
HWY_INLINE std::size_t RowChains(std::size_t chunks, std::size_t group) {
  const std::size_t vectors = chunks * Kind::vectors;
  if (group > 1 || vectors >= row_accumulators) return 1;
  return vectors * 2 >= row_accumulators ? 2 : 4;
}

/// A row's chunks: chunk c of a row starts c · bytes() in, except that the last one, when the
/// row ends inside it, is read from a zero-padded copy of the row's tail (made for a block's rows
/// by copy_tails, before the loops that read them: no call inside those).
struct row_chunks {
  static constexpr std::size_t max_rows = max_block_positions;
  std::size_t count = 0, row_bytes = 0, chunk_bytes = 0, chains = 1;
  std::size_t partial = ~std::size_t{0};  // index of a chunk the row ends inside, if any
  // a chunk is at most two bytes a lane of a 16-lane vector (int8_pairs)
  static constexpr std::size_t max_chunk_bytes = 32;
  static_assert(2 * hn::MaxLanes(DF()) <= max_chunk_bytes, "a chunk's bytes fit a tail");
  HWY_ALIGN std::uint8_t tails[max_rows][max_chunk_bytes] = {};  // zero past each row's end
  template <class Kind>
  void set(std::size_t d, std::size_t row, std::size_t group) {
    count = (d + Kind::coords() - 1) / Kind::coords();
    chains = RowChains<Kind>(count, group);
    row_bytes = row;
    chunk_bytes = Kind::bytes();
    partial = count * chunk_bytes > row ? count - 1 : ~std::size_t{0};
  }
  /// Copies the partial chunk of rows [0, n) (n ≤ max_rows), if the rows have one.
  void copy_tails(const std::byte* const* rows, std::size_t n) {
    if (partial == ~std::size_t{0}) return;
    for (std::size_t j = 0; j < n; ++j)
      std::memcpy(tails[j], rows[j] + partial * chunk_bytes, row_bytes - partial * chunk_bytes);
  }
  /// Chunk c of row j (at `row`) of `Kind`.
  template <class Kind>
  HWY_INLINE const std::uint8_t* at(const std::byte* row, std::size_t j, std::size_t c) const {
    return c == partial ? tails[j] : reinterpret_cast<const std::uint8_t*>(row) + c * Kind::bytes();
  }
};

/// a[h][·] += w[h · w_stride + j] · row j's chunks [c0, c0 + Chunks) for `Heads` heads (an
/// always-inlined function, not a lambda: a lambda's captures kept a[] in memory).
template <class Kind, std::size_t Heads, std::size_t Chunks>
HWY_INLINE void AccumulateRow(VF (&a)[Heads][Kind::vectors * Chunks], const std::byte* const* rows,
                              std::size_t j, const float* w, std::size_t w_stride, std::size_t c0,
                              const row_chunks& chunks, const float* levels) {
  const DF d;
  VF wh[Heads];
  for (std::size_t h = 0; h < Heads; ++h) wh[h] = hn::Set(d, w[h * w_stride + j]);
  const std::byte* row = rows[j];
  // Each chunk used at once: few vectors live.
  HWY_UNROLL(8)
  for (std::size_t c = 0; c < Chunks; ++c) {
    VF e[Kind::vectors];
    Kind::expand(chunks.at<Kind>(row, j, c0 + c), levels, e);
    for (std::size_t h = 0; h < Heads; ++h)
      for (std::size_t v = 0; v < Kind::vectors; ++v)
        a[h][c * Kind::vectors + v] = hn::MulAdd(wh[h], e[v], a[h][c * Kind::vectors + v]);
  }
}

/// acc[h][·] ← acc[h][·] · rescale[h] + Σ_j w[h][j] · row_j (expansion order) for `Heads` heads
/// (weights w + h · w_stride, accumulators acc + h · padded) over chunks [c0, c0 + Chunks): per
/// element `Chains` chains in registers from zero, chain k over the rows j ≡ k (mod Chains), added
/// pairwise in a fixed order, then one fused fold. The rows are a block's window positions, so
/// neither the ring's phase nor a split changes the sum.
template <class Kind, std::size_t Heads, std::size_t Chunks, std::size_t Chains>
HWY_INLINE void AccumulateSlice(const std::byte* const* rows, std::size_t n, const float* w,
                                std::size_t w_stride, const float* rescale, float* acc,
                                std::size_t padded, std::size_t c0, const row_chunks& chunks,
                                const float* levels) {
  const DF d;
  const std::size_t N = hn::Lanes(d);
  constexpr std::size_t V = Kind::vectors * Chunks;
  VF a[Chains][Heads][V];
  for (std::size_t k = 0; k < Chains; ++k)
    for (std::size_t h = 0; h < Heads; ++h)
      for (std::size_t v = 0; v < V; ++v) a[k][h][v] = hn::Zero(d);
  std::size_t j = 0;
  for (; j + Chains <= n; j += Chains)
    for (std::size_t k = 0; k < Chains; ++k)
      AccumulateRow<Kind, Heads, Chunks>(a[k], rows, j + k, w, w_stride, c0, chunks, levels);
  for (std::size_t k = 0; k < Chains; ++k)  // k a constant once unrolled
    if (j + k < n)
      AccumulateRow<Kind, Heads, Chunks>(a[k], rows, j + k, w, w_stride, c0, chunks, levels);
  for (std::size_t width = Chains / 2; width > 0; width /= 2)
    for (std::size_t k = 0; k < width; ++k)
      for (std::size_t h = 0; h < Heads; ++h)
        for (std::size_t v = 0; v < V; ++v) a[k][h][v] = hn::Add(a[k][h][v], a[k + width][h][v]);
  for (std::size_t h = 0; h < Heads; ++h) {
    const VF r = hn::Set(d, rescale[h]);
    float* out = acc + h * padded + c0 * Kind::coords();
    for (std::size_t v = 0; v < V; ++v)
      hn::StoreU(hn::MulAdd(hn::LoadU(d, out + v * N), r, a[0][h][v]), d, out + v * N);
  }
}

/// The widest slice: as many chunks as keep a slice's accumulators within slice_accumulators
/// (a power of two).
template <class Kind, std::size_t Heads, std::size_t Chains>
constexpr std::size_t SliceChunks() {
  std::size_t width = 1;
  while (2 * width * Kind::vectors * Heads * Chains <= slice_accumulators) width *= 2;
  return width;
}

/// AccumulateSlice over all chunks in the row's chains, the widest slices first.
template <class Kind, std::size_t Heads>
HWY_INLINE void AccumulateRowsOf(const std::byte* const* rows, std::size_t n, const float* w,
                                 std::size_t w_stride, const float* rescale, float* acc,
                                 std::size_t padded, const row_chunks& chunks,
                                 const float* levels) {
  const auto in_chains = [&](auto chains) RINGKV_INLINE_LAMBDA {
    constexpr std::size_t C = decltype(chains)::value;
    InSlices<SliceChunks<Kind, Heads, C>()>(
        chunks.count, 0, [&](auto width, std::size_t c) RINGKV_INLINE_LAMBDA {
          AccumulateSlice<Kind, Heads, decltype(width)::value, C>(rows, n, w, w_stride, rescale,
                                                                  acc, padded, c, chunks, levels);
        });
  };
  switch (chunks.chains) {
    case 1:
      return in_chains(std::integral_constant<std::size_t, 1>());
    case 2:
      return in_chains(std::integral_constant<std::size_t, 2>());
    default:
      return in_chains(std::integral_constant<std::size_t, 4>());
  }
}

/// AccumulateRowsOf for 1 to 4 heads.
template <class Kind>
HWY_INLINE void AccumulateRows(std::size_t heads, const std::byte* const* rows, std::size_t n,
                               const float* w, std::size_t w_stride, const float* rescale,
                               float* acc, std::size_t padded, const row_chunks& chunks,
                               const float* levels) {
  WithHeads(heads, [&](auto h) RINGKV_INLINE_LAMBDA {
    AccumulateRowsOf<Kind, decltype(h)::value>(rows, n, w, w_stride, rescale, acc, padded, chunks,
                                               levels);
  });
}

/// int8 key rows as 16-bit integers: a chunk is 2N codes (one 16-bit vector), in order.
struct int8_pairs {
  static constexpr std::size_t vectors = 1;
  static constexpr std::size_t coords() { return 2 * hn::MaxLanes(DF()); }
  static constexpr std::size_t bytes() { return 2 * hn::MaxLanes(DF()); }
};

#undef RINGKV_VNNI
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
#define RINGKV_VNNI 1
/// sum + a · b, the products of 16-bit lanes summed in pairs into 32-bit ones (VPDPWSSD, exact).
/// Inline assembly: this Highway's AVX3_DL compiles for AVX-VNNI, not AVX-512 VNNI, so the
/// intrinsic is refused (every CPU of the target has it).
HWY_INLINE hn::Vec<DI> DotPairs(hn::Vec<DI> sum, hn::Vec<hn::Repartition<std::int16_t, DF>> a,
                                hn::Vec<hn::Repartition<std::int16_t, DF>> b) {
  asm("vpdpwssd %[b], %[a], %[sum]" : [sum] "+v"(sum.raw) : [a] "v"(a.raw), [b] "v"(b.raw));
  return sum;
}
#endif

/// sum + the products of a and b's 16-bit lanes summed in pairs (as ReorderWidenMulAccumulate,
/// the same lanes and the same exact integers): one VPDPWSSD where the target has AVX-512 VNNI
/// (Highway's is a multiply-add of pairs and an add).
template <class V16>
HWY_INLINE hn::Vec<DI> MulAddPairs(DI di, V16 a, V16 b, hn::Vec<DI> sum, hn::Vec<DI>& odd) {
#ifdef RINGKV_VNNI
  (void)di;
  (void)odd;
  return DotPairs(sum, a, b);
#else
  return hn::ReorderWidenMulAccumulate(di, a, b, sum, odd);
#endif
}

#ifdef RINGKV_VNNI
/// int8 V rows in 16-bit integer multiply-adds: a chunk is 32 coordinates; two rows' codes,
/// interleaved a coordinate at a time (per 128-bit block), meet their two weights in one
/// VPDPWSSD, vector 0 holding coordinates 8L + k (block L, k < 4), vector 1 8L + 4 + k.
struct int8_pair_rows {
  static constexpr std::size_t vectors = 2;
  static constexpr std::size_t coords() { return 32; }
  static constexpr std::size_t bytes() { return 32; }
  static std::size_t coordinate(std::size_t e) {
    const std::size_t r = e % 32, lane = r % 16;
    return e - r + 8 * (lane / 4) + 4 * (r / 16) + lane % 4;
  }
};

/// acc[h][·] ← acc[h][·] · rescale[h] + Σ_j w[h][j] · row_j over chunks [c0, c0 + Chunks) of
/// int8 rows, the weights as 16-bit integers of `unit[h]` (w16 + h · w_stride, one past n zero):
/// per chunk and head two 32-bit sums, exact, so their bits do not depend on how rows are paired
/// or split into chains; Chains of them in flight for one head's few sums.
template <std::size_t Heads, std::size_t Chunks, std::size_t Chains>
HWY_INLINE void AccumulateInt8Slice(const std::byte* const* rows, std::size_t n,
                                    const std::int16_t* w16, std::size_t w_stride,
                                    const float* unit, const float* rescale, float* acc,
                                    std::size_t padded, std::size_t c0, const row_chunks& chunks) {
  const DF df;
  const DI di;
  const hn::Repartition<std::int16_t, DF> d16;
  const hn::Rebind<std::int8_t, decltype(d16)> d8;
  constexpr std::size_t V = 2 * Chunks;
  hn::Vec<DI> a[Chains][Heads][V];
  for (std::size_t k = 0; k < Chains; ++k)
    for (std::size_t h = 0; h < Heads; ++h)
      for (std::size_t v = 0; v < V; ++v) a[k][h][v] = hn::Zero(di);
  for (std::size_t j = 0; j < n; j += 2 * Chains)
    for (std::size_t k = 0; k < Chains && j + 2 * k < n; ++k) {
      const std::size_t j0 = j + 2 * k, j1 = std::min(j0 + 1, n - 1);  // j1's weight 0 past n
      hn::Vec<DI> wp[Heads];
      for (std::size_t h = 0; h < Heads; ++h) {
        std::int32_t pair;  // rows j0 and j0 + 1's weights (little-endian)
        std::memcpy(&pair, w16 + h * w_stride + j0, sizeof(pair));
        wp[h] = hn::Set(di, pair);
      }
      for (std::size_t c = 0; c < Chunks; ++c) {
        const auto load = [&](std::size_t r) {
          const auto* p =
              reinterpret_cast<const std::int8_t*>(chunks.at<int8_pair_rows>(rows[r], r, c0 + c));
          return hn::PromoteTo(d16, hn::LoadU(d8, p));
        };
        const auto x0 = load(j0), x1 = load(j1);
        const auto lo = hn::InterleaveLower(d16, x0, x1), hi = hn::InterleaveUpper(d16, x0, x1);
        for (std::size_t h = 0; h < Heads; ++h) {
          a[k][h][2 * c] = DotPairs(a[k][h][2 * c], lo, hn::BitCast(d16, wp[h]));
          a[k][h][2 * c + 1] = DotPairs(a[k][h][2 * c + 1], hi, hn::BitCast(d16, wp[h]));
        }
      }
    }
  for (std::size_t k = 1; k < Chains; ++k)
    for (std::size_t h = 0; h < Heads; ++h)
      for (std::size_t v = 0; v < V; ++v) a[0][h][v] = hn::Add(a[0][h][v], a[k][h][v]);
  const std::size_t N = hn::Lanes(df);
  for (std::size_t h = 0; h < Heads; ++h) {
    const VF r = hn::Set(df, rescale[h]), u = hn::Set(df, unit[h]);
    float* out = acc + h * padded + c0 * int8_pair_rows::coords();
    for (std::size_t v = 0; v < V; ++v)
      hn::StoreU(
          hn::MulAdd(hn::ConvertTo(df, a[0][h][v]), u, hn::Mul(hn::LoadU(df, out + v * N), r)), df,
          out + v * N);
  }
}

/// AccumulateRows for int8 rows in integers: per head the weights w[h · w_stride + j] rounded to
/// 16 bits of their largest (a rounding of 2^-16 of it), then AccumulateInt8Slice over all chunks.
template <std::size_t Heads>
HWY_INLINE void AccumulateInt8Of(const std::byte* const* rows, std::size_t n, const float* w,
                                 std::size_t w_stride, const float* rescale, float* acc,
                                 std::size_t padded, const row_chunks& chunks) {
  const DF df;
  const hn::Rebind<std::int16_t, DF> d16;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t stride = row_chunks::max_rows + hn::MaxLanes(DF());
  HWY_ALIGN std::int16_t w16[Heads * stride];  // [heads][rows] weights / unit, 0 past n
  float unit[Heads];
  for (std::size_t h = 0; h < Heads; ++h) {
    const float* wh = w + h * w_stride;  // w_stride ≥ max_rows: whole vectors are in bounds
    VF most = hn::Zero(df);
    for (std::size_t j = 0; j < n; j += N)
      most =
          hn::Max(most, hn::IfThenElseZero(hn::FirstN(df, n - j), hn::Abs(hn::LoadU(df, wh + j))));
    const float m = hn::GetLane(hn::MaxOfLanes(df, most));
    unit[h] = m / 32767.0f;
    const VF inverse = hn::Set(df, m > 0 ? 32767.0f / m : 0.0f);
    for (std::size_t j = 0; j < n; j += N) {
      const VF v =
          hn::IfThenElseZero(hn::FirstN(df, n - j), hn::Mul(hn::LoadU(df, wh + j), inverse));
      hn::StoreU(hn::DemoteTo(d16, hn::NearestInt(v)), d16, w16 + h * stride + j);
    }
    w16[h * stride + n] = 0;  // the partner of an odd count's last row
  }
  constexpr std::size_t widest = 8 / Heads >= 8 ? 8 : 8 / Heads >= 4 ? 4 : 2;  // 16 sums at most
  InSlices<widest>(chunks.count, 0, [&](auto width, std::size_t c) RINGKV_INLINE_LAMBDA {
    constexpr std::size_t W = decltype(width)::value;
    constexpr std::size_t chains = 2 * Heads * W <= 4 ? 2 : 1;  // sums in flight: 4 at least
    AccumulateInt8Slice<Heads, W, chains>(rows, n, w16, stride, unit, rescale, acc, padded, c,
                                          chunks);
  });
}

/// AccumulateInt8Of for 1 to 4 heads.
HWY_INLINE void AccumulateInt8(std::size_t heads, const std::byte* const* rows, std::size_t n,
                               const float* w, std::size_t w_stride, const float* rescale,
                               float* acc, std::size_t padded, const row_chunks& chunks) {
  WithHeads(heads, [&](auto h) RINGKV_INLINE_LAMBDA {
    AccumulateInt8Of<decltype(h)::value>(rows, n, w, w_stride, rescale, acc, padded, chunks);
  });
}
#endif

/// Scores of int8 key rows for `Heads` query heads, the queries rounded to 16-bit integers
/// (q16 + h · q_stride, natural order, zero padded; q ≈ q16 · q_scale[h], a rounding of 2^-16 of
/// the largest |q|): per row and head the exact integer sum of q16 · code (pairs of products
/// summed by one multiply-add of 16-bit lanes into 32-bit ones, half the operations of f32
/// products), its lanes converted and summed eight (row, head) chains at a time (Sum8, a chain's
/// sum that of Sum4: the same in any tile), times q_scale[h] and the row's scale; to
/// out[h · out_stride + j]. A tile is 4 rows of each head.
template <std::size_t Heads>
HWY_INLINE void ScoreInt8Of(const std::byte* const* rows, const float* scales, std::size_t n,
                            const std::int16_t* q16, std::size_t q_stride, const float* q_scale,
                            const row_chunks& chunks, float* out, std::size_t out_stride) {
  constexpr std::size_t R = 4;  // rows a tile (also for one head: 8 are slower)
  const DF d;
  const DI di;
  const hn::Repartition<std::int16_t, DF> d16;
  const hn::Rebind<std::int8_t, decltype(d16)> d8;
  const hn::CappedTag<float, 4> d4;
  const std::size_t N16 = hn::Lanes(d16);
  HWY_ALIGN float sums[Heads * R];  // [heads][R]
  for (std::size_t j0 = 0; j0 < n; j0 += R) {
    std::size_t r[R];  // the tile's rows (the last one again past n)
    for (std::size_t k = 0; k < R; ++k) r[k] = std::min(j0 + k, n - 1);
    hn::Vec<DI> a[Heads][R], odd[Heads][R];
    for (std::size_t h = 0; h < Heads; ++h)
      for (std::size_t k = 0; k < R; ++k) a[h][k] = odd[h][k] = hn::Zero(di);
    for (std::size_t c = 0; c < chunks.count; ++c) {
      hn::Vec<decltype(d16)> x[R];
      for (std::size_t k = 0; k < R; ++k) {
        const auto* p =
            reinterpret_cast<const std::int8_t*>(chunks.at<int8_pairs>(rows[r[k]], r[k], c));
        x[k] = hn::PromoteTo(d16, hn::LoadU(d8, p));
      }
      for (std::size_t h = 0; h < Heads; ++h) {
        const auto qv = hn::Load(d16, q16 + h * q_stride + c * N16);
        for (std::size_t k = 0; k < R; ++k) a[h][k] = MulAddPairs(di, qv, x[k], a[h][k], odd[h][k]);
      }
    }
    VF f[Heads * R];  // chain h · R + k: row k of head h
    for (std::size_t h = 0; h < Heads; ++h)
      for (std::size_t k = 0; k < R; ++k)
        f[h * R + k] = hn::ConvertTo(d, hn::RearrangeToOddPlusEven(a[h][k], odd[h][k]));
    std::size_t e = 0;
    for (; e + 8 <= Heads * R; e += 8)
      Sum8(d, f[e], f[e + 1], f[e + 2], f[e + 3], f[e + 4], f[e + 5], f[e + 6], f[e + 7], sums + e);
    if (e < Heads * R) Sum4(d, f[e], f[e + 1], f[e + 2], f[e + 3], sums + e);
    for (std::size_t h = 0; h < Heads; ++h) {
      const float* sh = sums + h * R;
      float* to = out + h * out_stride + j0;
      const auto q = hn::Set(d4, q_scale[h]);
      std::size_t k = 0;
      for (; k + 4 <= R && j0 + k + 4 <= n; k += 4)
        hn::StoreU(hn::Mul(hn::Mul(hn::Load(d4, sh + k), q), hn::LoadU(d4, scales + j0 + k)), d4,
                   to + k);
      for (; k < R && j0 + k < n; ++k) to[k] = sh[k] * q_scale[h] * scales[j0 + k];
    }
  }
}

/// ScoreInt8Of for 1 to 4 heads.
HWY_INLINE void ScoreInt8(std::size_t heads, const std::byte* const* rows, const float* scales,
                          std::size_t n, const std::int16_t* q16, std::size_t q_stride,
                          const float* q_scale, const row_chunks& chunks, float* out,
                          std::size_t out_stride) {
  WithHeads(heads, [&](auto h) RINGKV_INLINE_LAMBDA {
    ScoreInt8Of<decltype(h)::value>(rows, scales, n, q16, q_stride, q_scale, chunks, out,
                                    out_stride);
  });
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_EXPAND_INL_H_
