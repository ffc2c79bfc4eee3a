// Per-target helpers for reading a window's rows: partial vectors for a head_dim that is not a
// whole number of vectors, the row loader (the one place an element type is read), and the walk
// from absolute positions to rows across the window's runs.
// Included once per Highway target by foreach_target.h (hence the toggling guard).
#if defined(RINGKV_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RINGKV_ROWS_INL_H_
#undef RINGKV_ROWS_INL_H_
#else
#define RINGKV_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "simd.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

/// The first n (< Lanes) floats at p in the low lanes, zeros above; reads only those n floats.
HWY_INLINE VF LoadPartial(DF d, const float* p, std::size_t n) {
  HWY_ALIGN float lanes[hn::MaxLanes(DF())] = {};
  std::memcpy(lanes, p, n * sizeof(float));
  return hn::Load(d, lanes);
}

/// Writes the low n (< Lanes) lanes of v to p; touches nothing past p + n.
HWY_INLINE void StorePartial(DF d, VF v, float* p, std::size_t n) {
  HWY_ALIGN float lanes[hn::MaxLanes(DF())];
  hn::Store(v, d, lanes);
  std::memcpy(p, lanes, n * sizeof(float));
}

/// Reads K/V rows stored as T as f32 vectors. Kernels only ever read rows through this, so f16
/// and bf16 rows are specialisations (a half-width load promoted to f32), with f32 accumulation
/// unchanged.
template <class T>
struct row_loader;

template <>
struct row_loader<float> {
  using type = float;
  /// Lanes(d) floats of `row` from element i.
  static HWY_INLINE VF load(DF d, const std::byte* row, std::size_t i) {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + i);
  }
  /// The row's last n (< Lanes) floats from element i, zeros above.
  static HWY_INLINE VF load_tail(DF d, const std::byte* row, std::size_t i, std::size_t n) {
    return LoadPartial(d, reinterpret_cast<const float*>(row) + i, n);
  }
};

using DU16 = hn::Rebind<std::uint16_t, DF>;  // the bits of Lanes(DF) f16/bf16 elements

/// bf16 bits as f32 (exact): widened to u32 and shifted left 16 (as Highway's x86 PromoteTo
/// does; written once so every target, EMU128 included, does the same).
HWY_INLINE VF PromoteBF16(DF d, hn::Vec<DU16> bits) {
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, bits)));
}

/// f16 bits as f32, exact for every value (±0, subnormals, normals, ±Inf, NaN). F16C on x86
/// from AVX2 up. Elsewhere integer arithmetic of our own, not Highway 1.0.3's emulation: that
/// reads the all-ones exponent (±Inf, NaN) as a finite 2^16-scale number, but an f16 store
/// keeps ±Inf for a finite input too large for f16 (README "NaN and Inf") and every target must
/// read it as read_keys does.
HWY_INLINE VF PromoteF16(DF d, hn::Vec<DU16> bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  return hn::PromoteTo(d, hn::BitCast(hn::Rebind<hwy::float16_t, DF>(), bits));
#else
  const hn::RebindToSigned<DF> di;
  const auto wide = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), bits));
  const auto magnitude = hn::And(wide, hn::Set(di, 0x7fff));  // exponent and mantissa
  // Normal: the exponent rebiased (15 → 127) above the mantissa moved to the top of f32's.
  const auto normal = hn::Add(hn::ShiftLeft<13>(magnitude), hn::Set(di, (127 - 15) << 23));
  // Exponent 0 (zero or subnormal): mantissa · 2^-24, exact in f32.
  const auto tiny = hn::BitCast(di, hn::Mul(hn::ConvertTo(d, magnitude), hn::Set(d, 0x1p-24f)));
  // Exponent all ones (±Inf, NaN): all ones in f32 too, the mantissa kept.
  const auto special = hn::Or(normal, hn::Set(di, 0x7f800000));
  auto r = hn::IfThenElse(hn::Lt(magnitude, hn::Set(di, 0x0400)), tiny, normal);
  r = hn::IfThenElse(hn::Gt(magnitude, hn::Set(di, 0x7bff)), special, r);
  return hn::BitCast(d, hn::Or(r, hn::ShiftLeft<16>(hn::And(wide, hn::Set(di, 0x8000)))));
#endif
}

// On targets that emulate vectors (EMU128, SCALAR) a half row's load stays out of line: inlined
// into every tile it makes EMU128 alone compile several times as long, and those targets are
// fallbacks.
#undef RINGKV_HALF_LOAD
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
#define RINGKV_HALF_LOAD HWY_NOINLINE
#else
#define RINGKV_HALF_LOAD HWY_INLINE
#endif

/// f16 and bf16 rows: a half-width load of the elements' bits, promoted to f32 in registers
/// (exact: every f16 and bf16 value is an f32), so the arithmetic after the load is the f32
/// path's.
template <class T>
struct half_row_loader {
  using type = T;

  static HWY_INLINE VF promote(DF d, hn::Vec<DU16> bits) {
    if constexpr (std::is_same_v<T, hwy::bfloat16_t>)
      return PromoteBF16(d, bits);
    else
      return PromoteF16(d, bits);
  }
  /// Lanes(d) elements of `row` from element i, as f32.
  static RINGKV_HALF_LOAD VF load(DF d, const std::byte* row, std::size_t i) {
    return promote(d, hn::LoadU(DU16(), reinterpret_cast<const std::uint16_t*>(row) + i));
  }
  /// The row's last n (< Lanes) elements from element i, zeros above; reads only those n.
  static RINGKV_HALF_LOAD VF load_tail(DF d, const std::byte* row, std::size_t i, std::size_t n) {
    HWY_ALIGN std::uint16_t lanes[hn::MaxLanes(DU16())] = {};
    std::memcpy(lanes, row + i * sizeof(std::uint16_t), n * sizeof(std::uint16_t));
    return promote(d, hn::Load(DU16(), lanes));
  }
};

template <>
struct row_loader<hwy::float16_t> : half_row_loader<hwy::float16_t> {};
template <>
struct row_loader<hwy::bfloat16_t> : half_row_loader<hwy::bfloat16_t> {};

using DU8 = hn::Rebind<std::uint8_t, DF>;  // the bits of Lanes(DF) fp8 elements

/// fp8 E4M3FN bits as f32, exact for every value a store holds (0x7f, NaN, it never holds).
/// With F16C (x86 from AVX2 up): the byte sign-extended to 16 bits and shifted left 7 puts the
/// sign, exponent and mantissa on f16's (bit 14, filled by the sign, is cleared), an f16 of 2^-8
/// the fp8 value, subnormals included; converted in hardware and scaled by 2^8, exactly. Four
/// operations and the conversion a vector. Elsewhere integer arithmetic lane by lane: the
/// exponent rebiased (7 → 127), exponent 0 as mantissa · 2^-9.
HWY_INLINE VF PromoteFP8(DF d, hn::Vec<DU8> bits) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  const hn::Rebind<std::int16_t, DF> d16;
  const auto shifted =
      hn::ShiftLeft<7>(hn::PromoteTo(d16, hn::BitCast(hn::Rebind<std::int8_t, DF>(), bits)));
  const auto half = hn::And(shifted, hn::Set(d16, std::int16_t(0xbfff)));
  return hn::Mul(hn::PromoteTo(d, hn::BitCast(hn::Rebind<hwy::float16_t, DF>(), half)),
                 hn::Set(d, 256.0f));
#else
  const hn::RebindToSigned<DF> di;
  const auto wide = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), bits));
  const auto magnitude = hn::And(wide, hn::Set(di, 0x7f));
  const auto normal = hn::Add(hn::ShiftLeft<20>(magnitude), hn::Set(di, (127 - 7) << 23));
  const auto tiny = hn::BitCast(di, hn::Mul(hn::ConvertTo(d, magnitude), hn::Set(d, 0x1p-9f)));
  const auto r = hn::IfThenElse(hn::Lt(magnitude, hn::Set(di, 0x08)), tiny, normal);
  return hn::BitCast(d, hn::Or(r, hn::ShiftLeft<24>(hn::And(wide, hn::Set(di, 0x80)))));
#endif
}

/// fp8 rows: a quarter-width load of the elements' bits, promoted to f32 in registers (exact),
/// so the arithmetic after the load is the f32 path's.
template <>
struct row_loader<fp8_e4m3> {
  using type = fp8_e4m3;
  /// Lanes(d) elements of `row` from element i, as f32.
  static RINGKV_HALF_LOAD VF load(DF d, const std::byte* row, std::size_t i) {
    return PromoteFP8(d, hn::LoadU(DU8(), reinterpret_cast<const std::uint8_t*>(row) + i));
  }
  /// The row's last n (< Lanes) elements from element i, zeros above; reads only those n.
  static RINGKV_HALF_LOAD VF load_tail(DF d, const std::byte* row, std::size_t i, std::size_t n) {
    HWY_ALIGN std::uint8_t lanes[hn::MaxLanes(DU8())] = {};
    std::memcpy(lanes, row + i, n);
    return PromoteFP8(d, hn::Load(DU8(), lanes));
  }
};

/// Reads a whole vector of a row from element i (a functor, so tile code is written once for
/// whole vectors and for the partial last one).
template <class Loader>
struct vector_at {
  DF d;
  std::size_t i;
  HWY_INLINE VF operator()(const std::byte* row) const { return Loader::load(d, row, i); }
};

/// Reads the row's last n (< Lanes) elements from element i, zeros above.
template <class Loader>
struct tail_at {
  DF d;
  std::size_t i, n;
  HWY_INLINE VF operator()(const std::byte* row) const { return Loader::load_tail(d, row, i, n); }
};

/// a_k += x · y_k and b_k += z · y_k for k = 0 … 3: two rows of a tile sharing four loaded
/// vectors (K for two query heads' scores, V for two heads' weighted sums).
HWY_INLINE void OuterStep2x4(VF x, VF z, VF y0, VF y1, VF y2, VF y3, VF& a0, VF& a1, VF& a2, VF& a3,
                             VF& b0, VF& b1, VF& b2, VF& b3) {
  a0 = hn::MulAdd(x, y0, a0);
  b0 = hn::MulAdd(z, y0, b0);
  a1 = hn::MulAdd(x, y1, a1);
  b1 = hn::MulAdd(z, y1, b1);
  a2 = hn::MulAdd(x, y2, a2);
  b2 = hn::MulAdd(z, y2, b2);
  a3 = hn::MulAdd(x, y3, a3);
  b3 = hn::MulAdd(z, y3, b3);
}

// Where the target has 32 vector registers (x86's 512-bit targets), tiles of four query heads
// × four vectors: sixteen chains in flight, and each K or V vector loaded once for four heads
// (AVX2's 16 registers hold the pairs' eight chains, not sixteen).
// Re-measure: scripts/bench-targets --shapes '/2$'
#undef RINGKV_WIDE_TILES
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define RINGKV_WIDE_TILES 1
/// a_k += w · y_k, b_k += x · y_k, c_k += z · y_k, e_k += u · y_k for k = 0 … 3: four rows of a
/// tile sharing four loaded vectors (K for four query heads' scores, V for four heads' sums).
HWY_INLINE void OuterStep4x4(VF w, VF x, VF z, VF u, VF y0, VF y1, VF y2, VF y3, VF* a, VF* b,
                             VF* c, VF* e) {
  OuterStep2x4(w, x, y0, y1, y2, y3, a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
  OuterStep2x4(z, u, y0, y1, y2, y3, c[0], c[1], c[2], c[3], e[0], e[1], e[2], e[3]);
}
#endif

/// How many groups of four heads the wide tiles take out of `heads` (0 without them), leaving
/// in `heads` the rest for the pairs and a lone head (ScoreTiles and AccumulateTiles count so).
HWY_INLINE std::size_t TakeWideGroups(std::size_t& heads) {
#ifdef RINGKV_WIDE_TILES
  const std::size_t groups = heads / 4;
  heads %= 4;
  return groups;
#else
  (void)heads;
  return 0;
#endif
}

/// Asks for the cache line at `address` with prefetcht0, the hint every prefetch here uses: some
/// cores drop t1 requests at times, and no other hint reads faster.
/// Re-measure: scripts/bench-targets
HWY_INLINE void PrefetchLine(std::uintptr_t address) {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): line_feed walks addresses as integers.
  __builtin_prefetch(reinterpret_cast<const void*>(address), 0, 3);
}

/// Cache lines to prefetch a few at a time, between the tiles of a block: a burst of a block's
/// worth of prefetches stalls on the L1's miss buffers, a trickle keeps them busy without
/// stalling. step() works on copies in registers: walking the members would keep them in
/// memory, a store-forward a line.
/// Two walks (prefetch_walk). Dense: the rows merged into contiguous byte ranges (a block's rows
/// of one kv head are one or two), their lines asked for back to back, four per turn: a fifth of
/// the spaced walk's instructions a line, which counts when rows come from the L3 and the step is
/// compute-bound. Spaced: row by row, one line per turn with its row pointer reloaded; those ~2
/// cycles a line space the lines out when they come from memory, where lines asked for back to
/// back wait on the miss buffers and hold up the tiles' loads.
/// Re-measure: scripts/bench-targets --shapes 128/4096
struct line_feed {
  std::size_t per_step = 0;  // lines a step() asks for; 0 until started
  bool dense = false;
  // Spaced walk: the caller's row pointers (alive until the feed is drained), for each of
  // `heads` kv heads head_bytes apart; the next line is `offset` bytes past pointer `row`, in
  // the rows of head `head`, which lie head_base bytes past the pointers.
  const std::byte* const* rows = nullptr;
  std::size_t n = 0, row_bytes = 0, row = 0, offset = 0;
  std::size_t heads = 0, head_bytes = 0, head = 0, head_base = 0;
  // Dense walk: byte ranges [begin, end) from line boundaries, the next line of range `range`
  // (addresses as integers: the last line of a range may start past its end, and past its
  // buffer, which a pointer may not).
  std::uintptr_t begin[max_block_positions];
  std::uintptr_t end[max_block_positions];
  std::size_t range = 0, ranges = 0;
  std::uintptr_t line = 0;

  /// Feeds the lines of rows_in[0, rows_n) over about `steps` calls of step(), walked as `walk`
  /// says (not none); O(rows_n). The dense walk takes one block's rows of one kv head (at most
  /// max_block_positions ranges: AttendRange's); the spaced walk those rows and the same rows of
  /// the next kv_heads − 1 kv heads, kv_head_bytes apart (AttendSpread's heads), head by head.
  HWY_INLINE void start(prefetch_walk walk, const std::byte* const* rows_in, std::size_t rows_n,
                        std::size_t bytes, std::size_t steps, std::size_t kv_heads = 1,
                        std::size_t kv_head_bytes = 0) {
    dense = walk == prefetch_walk::dense;
    std::size_t lines = 0;
    if (dense) {
      HWY_DASSERT(rows_n <= max_block_positions);
      ranges = 0;
      for (std::size_t i = 0; i < rows_n; ++i) {
        const std::uintptr_t r = reinterpret_cast<std::uintptr_t>(rows_in[i]);
        if (ranges != 0 && r == end[ranges - 1]) {
          end[ranges - 1] = r + bytes;
          continue;
        }
        begin[ranges] = r / 64 * 64;
        end[ranges++] = r + bytes;
      }
      for (std::size_t i = 0; i < ranges; ++i) lines += (end[i] - begin[i] + 63) / 64;
      range = 0;
      line = ranges != 0 ? begin[0] : 0;
    } else {
      HWY_DASSERT(kv_heads >= 1);
      rows = rows_in;
      n = rows_n;
      row_bytes = bytes;
      heads = kv_heads;
      head_bytes = kv_head_bytes;
      row = offset = head = head_base = 0;
      lines = heads * n * ((bytes + 63) / 64);
    }
    per_step = (lines + steps - 1) / std::max<std::size_t>(steps, 1);
  }

  HWY_INLINE void step() {
    if (per_step == 0) return;
    if (dense)
      StepDense();
    else
      StepSpaced();
  }

  /// Asks for every line not asked for yet.
  HWY_INLINE void drain() {
    if (per_step == 0) return;  // never started, or nothing to ask for
    per_step = ~std::size_t(0);
    step();
    per_step = 0;
  }

 private:
  HWY_INLINE void StepDense() {
    std::size_t k = per_step;
    std::uintptr_t l = line, e = end[range];
    for (;;) {
      for (; k >= 4 && l + 256 <= e; k -= 4, l += 256) {
        PrefetchLine(l);
        PrefetchLine(l + 64);
        PrefetchLine(l + 128);
        PrefetchLine(l + 192);
      }
      for (; k != 0 && l < e; --k, l += 64) PrefetchLine(l);
      if (k == 0 || range + 1 >= ranges) break;
      l = begin[++range];
      e = end[range];
    }
    line = l;
  }

  HWY_INLINE void StepSpaced() {
    const std::byte* const* rs = rows;
    const std::size_t nn = n;
    // off counts from the pointers (head_base past them for head `head`), so a line costs what
    // it did with one head: a prefetch, an add and a compare.
    std::size_t r = row, off = offset, hd = head, base = head_base, lim = base + row_bytes;
    for (std::size_t k = per_step; k != 0 && r < nn; --k) {
      PrefetchLine(reinterpret_cast<std::uintptr_t>(rs[r] + off));
      off += 64;
      if (off >= lim) {
        if (++r == nn && ++hd < heads) {
          r = 0;
          base += head_bytes;
          lim = base + row_bytes;
        }
        off = base;
      }
    }
    row = r;
    offset = off;
    head = hd;
    head_base = base;
  }
};

/// Asks for every cache line of the `bytes` bytes at `row`, back to back.
HWY_INLINE void PrefetchRow(const std::byte* row, std::size_t bytes) {
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(row);
  for (std::uintptr_t line = begin / 64 * 64; line < begin + bytes; line += 64) PrefetchLine(line);
}

/// One past the last position of the block of `block` absolute positions that holds `pos`, at
/// most hi.
HWY_INLINE std::size_t BlockEnd(std::size_t pos, std::size_t hi, std::size_t block) {
  return std::min(pos / block * block + block, hi);
}

/// One past the newest position of the window.
HWY_INLINE std::size_t WindowEnd(const window& w) {
  return w.run_count ? w.runs[w.run_count - 1].first + w.runs[w.run_count - 1].count : 0;
}

/// The smallest window position >= p, or WindowEnd(w) when there is none (skips the gap after
/// pinned positions without walking it); O(runs).
HWY_INLINE std::size_t NextPosition(const window& w, std::size_t p) {
  for (std::size_t r = 0; r < w.run_count; ++r)
    if (p < w.runs[r].first + w.runs[r].count) return std::max(p, w.runs[r].first);
  return WindowEnd(w);
}

/// Writes to rows[] the row of kv head h for each window position in [lo, hi), in position
/// order, whichever run holds it; returns how many; O(runs + rows).
HWY_INLINE std::size_t CollectRows(const window& w, std::size_t h, std::size_t lo, std::size_t hi,
                                   const std::byte** rows) {
  std::size_t n = 0;
  for (std::size_t r = 0; r < w.run_count; ++r) {
    const run& ru = w.runs[r];
    const std::size_t b = std::max(lo, ru.first), e = std::min(hi, ru.first + ru.count);
    const std::byte* head = ru.data + h * ru.head_stride;
    for (std::size_t p = b; p < e; ++p) rows[n++] = head + (p - ru.first) * ru.position_stride;
  }
  return n;
}

}  // namespace ringkv::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // RINGKV_ROWS_INL_H_
