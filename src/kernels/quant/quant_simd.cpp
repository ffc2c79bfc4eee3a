// The compressed-window decode kernel (see quant_simd.h). Per chunk of a kv head's query heads
// and per segment of absolute positions: every key of the segment scored first (TurboQuant keys
// by the fast scan of their slot groups, scan-inl.h; int8 keys in integers, expand-inl.h), then
// block by block the online softmax step of the f32 kernels (softmax-inl.h) and the block's V
// rows expanded in registers into its weighted sums (expand-inl.h).
// foreach_target.h compiles this file once per target; HWY_DYNAMIC_DISPATCH picks one per call.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant_simd.h"

// Also compiled for AVX3_DL (Highway builds it only on request), whose byte permutes look up two
// 3-bit codes at once (triples-inl.h; measured in bench/README, "Decisions").
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quant/quant_simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "kernels/decode-inl.h"
#include "kernels/quant/expand-inl.h"
#include "kernels/quant/triples-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv::simd::HWY_NAMESPACE {

inline constexpr std::size_t max_dim = max_compressed_head_dim;
// Positions a softmax block covers: the largest of the f32 kernels' (fewer softmax steps; a
// position's lane in its block is its absolute position's, so the bits do not depend on where
// the window starts).
inline constexpr std::size_t compressed_block = max_block_positions;
inline constexpr std::size_t segment_blocks = segment_positions / compressed_block;
// Floats of a head's state and output rows: head_dim rounded up to whole chunks of any row kind.
inline constexpr std::size_t max_padded = max_dim + 4 * hn::MaxLanes(DF());
// Table bytes of one query head: 3-bit codes take 32 a coordinate (4-bit 16, 1- and 2-bit fewer),
// rounded up to whole units.
inline constexpr std::size_t max_table_bytes = 32 * (max_dim + 16);

/// The softmax step's exponential here: e^x for x ≤ 0 (−inf gives 0; every argument is a score
/// minus a running max) as 2^n · 2^f, t = x·log2 e clamped to −127 (2^−127 taken as 0),
/// n = round(t), 2^f for |f| ≤ 1/2 by Cephes' exp2f polynomial: relative error under 3e-7 where
/// a weight is above 1e-9 (0.02 % of the 4-bit codebook's own error; the f32 kernels keep
/// Highway's Exp). About half of Exp's operations (measured in bench/README, "Decisions").
struct fast_exp {
  template <class D, class V>
  static HWY_INLINE V exp(D d, V x) {
    const hn::RebindToSigned<D> di;
    const V t = hn::Max(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, -127.0f));
    const auto n = hn::NearestInt(t);
    const V f = hn::Sub(t, hn::ConvertTo(d, n));
    V p = hn::Set(d, 1.535336188319500e-4f);
    p = hn::MulAdd(p, f, hn::Set(d, 1.339887440266574e-3f));
    p = hn::MulAdd(p, f, hn::Set(d, 9.618437357674640e-3f));
    p = hn::MulAdd(p, f, hn::Set(d, 5.550332471162809e-2f));
    p = hn::MulAdd(p, f, hn::Set(d, 2.402264791363012e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 6.931472028550421e-1f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
    const V scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(n, hn::Set(di, 127))));
    return hn::Mul(p, scale);
  }
};

/// A codebook of 2^bits levels repeated to 16 entries, as whole vectors (see LookupLevels).
struct lane_table {
  HWY_ALIGN float levels[16 + hn::MaxLanes(DF())] = {};
  void set(const float* values, unsigned bits) {
    for (std::size_t e = 0; e < 16; ++e) levels[e] = values[e % (std::size_t{1} << bits)];
  }
};

/// The window's positions only (no rows): what the block and segment walks need.
HWY_INLINE window PositionsOf(const code_window& w) {
  window out;
  for (std::size_t r = 0; r < w.run_count; ++r)
    out.runs[r] = {nullptr, 0, 0, w.runs[r].first, w.runs[r].count};
  out.run_count = w.run_count;
  return out;
}

/// The window positions of `w` in [lo, hi) as at most max_runs pieces, each consecutive
/// positions of one run: its first position's offset from lo, how many, and its first row's
/// index (h · head_stride + slot) for kv head h, and the run. Returns how many pieces.
struct piece {
  std::size_t offset = 0, count = 0, row = 0, run = 0;
};
HWY_INLINE std::size_t PiecesOf(const code_window& w, std::size_t h, std::size_t lo, std::size_t hi,
                                piece* out) {
  std::size_t n = 0;
  for (std::size_t r = 0; r < w.run_count; ++r) {
    const codec::rows_run& run = w.runs[r];
    const std::size_t b = std::max(lo, run.first), e = std::min(hi, run.first + run.count);
    if (b < e) out[n++] = {b - lo, e - b, h * run.head_stride + run.slot + (b - run.first), r};
  }
  return n;
}

/// Writes the row pointers of piece pc of `w` to rows[0, pc.count) and returns its scales.
HWY_INLINE const float* PieceRows(const code_window& w, const piece& pc, const std::byte** rows) {
  const std::byte* row = w.runs[pc.run].codes + pc.row * w.format.code_bytes;
  for (std::size_t j = 0; j < pc.count; ++j) rows[j] = row + j * w.format.code_bytes;
  return w.runs[pc.run].scales + pc.row;
}

/// How V rows expand (expand-inl.h): int8 (in 16-bit integer multiply-adds where the target has
/// AVX-512 VNNI), 2-, 3- (128 coordinates a chunk where the target has a byte permute and one
/// query head reads whole chunks of them) or 4-bit codes.
enum class value_kind : std::uint8_t { int8, crumb, triple, wide_triple, nibble };

HWY_INLINE value_kind ValueKindOf(const codec::rows_format& f, std::size_t group) {
  if (f.int8) return value_kind::int8;
  if (f.bits == 2) return value_kind::crumb;
  if (f.bits != 3) return value_kind::nibble;
#ifdef RINGKV_BYTE_PERMUTE
  if (group == 1 && f.head_dim % wide_triple_rows::coords() == 0) return value_kind::wide_triple;
#endif
  return value_kind::triple;
}

/// f(Kind()) for the row kind k.
template <class F>
HWY_INLINE auto VisitValueKind(value_kind k, F&& f) {
  switch (k) {
    case value_kind::int8:
#ifdef RINGKV_VNNI
      return f(int8_pair_rows());
#else
      return f(int8_rows());
#endif
    case value_kind::crumb:
      return f(crumb_rows());
    case value_kind::wide_triple:
#ifdef RINGKV_BYTE_PERMUTE
      return f(wide_triple_rows());
#else
      [[fallthrough]];  // chosen only where the byte permute exists
#endif
    case value_kind::triple:
      return f(triple_rows());
    case value_kind::nibble:
      break;
  }
  return f(nibble_rows());
}

/// What one chunk of query heads works with: its rotated queries and lookup tables, the
/// segment's scores and the block weights, on the stack (about 76 KB at head_dim 256).
struct chunk_work {
  HWY_ALIGN float q[max_scan_heads * max_padded];   // [heads][max_padded] scale·Π·q, zero-padded
  HWY_ALIGN float sq[max_scan_heads * max_padded];  // [heads][max_padded] QJL's S·q, scaled
  HWY_ALIGN std::int16_t q16[max_scan_heads * max_padded];  // int8 keys: q rounded, zero-padded
  float q_scale[max_scan_heads];                            // q ≈ q16 · q_scale
  HWY_ALIGN std::uint8_t code_bytes[max_scan_heads * max_table_bytes];
  HWY_ALIGN std::uint8_t sign_bytes[max_scan_heads * max_table_bytes / 8];
  scan_tables codes, signs;
  std::size_t code_group = 0, sign_group = 0;  // bytes of a group of codes, of signs
  // [segment_blocks][heads][compressed_block]: a segment's scores, then its weights
  HWY_ALIGN float scores[segment_blocks * max_scan_heads * compressed_block];
  float rescale[segment_blocks * max_scan_heads];
  HWY_ALIGN float weights[max_scan_heads * compressed_block];      // [heads][block] weight · scale
  HWY_ALIGN float group[2 * max_scan_heads * codec::group_slots];  // [2][heads][32]
  HWY_ALIGN std::uint16_t sums[max_scan_heads * codec::group_slots];
  HWY_ALIGN float factors[codec::group_slots];
  const std::byte* rows[compressed_block];
  lane_table values;
  row_chunks key_chunks, value_chunks;
  value_kind values_kind = value_kind::nibble;
};

/// Scales and rotates the chunk's queries into the keys' frame (TurboQuant: q' = scale·Π·q) and
/// builds their tables; with QJL also sq = scale·sqrt(π/2)/d · S·q (unrotated) and its tables.
HWY_INLINE void PrepareQueries(const compressed_problem& cp, std::size_t kv, std::size_t q0,
                               std::size_t count, chunk_work& w) {
  const codec::rows_format& f = cp.keys.format;
  const std::size_t d = cp.head_dim;
  std::fill(w.q, w.q + count * max_padded, 0.0f);
  HWY_ALIGN float scaled[max_dim];
  for (std::size_t h = 0; h < count; ++h) {
    const float* in = cp.query + (q0 + h) * d;
    for (std::size_t i = 0; i < d; ++i) scaled[i] = in[i] * cp.scale;
    if (f.int8)
      std::copy(scaled, scaled + d, w.q + h * max_padded);
    else
      codec::rotate(f.rotations + kv * f.rotation_floats, f.hadamard, d, scaled,
                    w.q + h * max_padded);
  }
  if (f.int8) {
    // q16 = round(q / q_scale), q_scale = max |q| / 32767 (0 for a zero query).
    std::fill(w.q16, w.q16 + count * max_padded, std::int16_t{0});
    for (std::size_t h = 0; h < count; ++h) {
      const float* q = w.q + h * max_padded;
      float most = 0;
      for (std::size_t i = 0; i < d; ++i) most = std::max(most, std::fabs(q[i]));
      w.q_scale[h] = most / 32767.0f;
      const float inverse = most > 0 ? 32767.0f / most : 0.0f;
      for (std::size_t i = 0; i < d; ++i)
        w.q16[h * max_padded + i] =
            std::int16_t(std::lrint(std::clamp(q[i] * inverse, -32767.0f, 32767.0f)));
    }
    return;
  }
  ShapeTables(w.codes, d, f.bits);
  w.codes.bytes = w.code_bytes;
  w.code_group = codec::group_bytes(d, f.bits);
  w.sign_group = codec::group_bytes(d, 1);
  for (std::size_t h = 0; h < count; ++h)
    BuildTables(w.codes, h, w.q + h * max_padded, d, f.centroids);
  if (!f.qjl) return;
  const float* s = f.projections + kv * d * d;
  const float g = cp.scale * float(codec::qjl_scale(d));
  for (std::size_t h = 0; h < count; ++h) {
    const float* q = cp.query + (q0 + h) * d;
    for (std::size_t i = 0; i < d; ++i) w.sq[h * max_padded + i] = g * Dot(DF(), s + i * d, q, d);
  }
  ShapeTables(w.signs, d, 1);
  w.signs.bytes = w.sign_bytes;
  const float plus_minus[2] = {-1.0f, 1.0f};
  for (std::size_t h = 0; h < count; ++h)
    BuildTables(w.signs, h, w.sq + h * max_padded, d, plus_minus);
}

/// Writes the scores of kv head kv's positions [a, b) of run `run` (grouped TurboQuant keys) to
/// w.scores (position p at block (p − from) / B, lane (p − from) % B): every group the run's
/// slots touch is scanned whole, its slots outside the run left out.
HWY_INLINE void ScanRun(const compressed_problem& cp, const codec::rows_run& run, std::size_t kv,
                        std::size_t count, std::size_t from, std::size_t a, std::size_t b,
                        chunk_work& w) {
  const codec::rows_format& f = cp.keys.format;
  const DF df;
  const std::size_t d = cp.head_dim, slot_a = run.slot + (a - run.first);
  const std::size_t slot_b = slot_a + (b - a), slots = codec::group_slots;
  float* signed_part = w.group + max_scan_heads * slots;
  for (std::size_t g = slot_a / slots; g * slots < slot_b; ++g) {
    const std::size_t first = kv * run.head_stride + g * slots;  // the group's index (head kv)
    // The next group of the run (or past its end: a prefetch never faults).
    const std::size_t next = (first + slots) / slots;
    ScanGroup(run.codes + first / slots * w.code_group, run.codes + next * w.code_group, w.codes,
              count, w.sums);
    for (std::size_t h = 0; h < count; ++h)
      ScaleSums(w.sums + h * slots, w.codes, h, run.scales + first, w.group + h * slots);
    if (f.qjl) {
      ScanGroup(run.signs + first / slots * w.sign_group, run.signs + next * w.sign_group, w.signs,
                count, w.sums);
      for (std::size_t i = 0; i < slots; i += hn::Lanes(df))
        hn::Store(hn::Mul(hn::LoadU(df, run.scales + first + i),
                          hn::LoadU(df, run.residual_norms + first + i)),
                  df, w.factors + i);
      for (std::size_t h = 0; h < count; ++h) {
        ScaleSums(w.sums + h * slots, w.signs, h, w.factors, signed_part + h * slots);
        for (std::size_t i = 0; i < slots; i += hn::Lanes(df))
          hn::Store(hn::Add(hn::Load(df, w.group + h * slots + i),
                            hn::Load(df, signed_part + h * slots + i)),
                    df, w.group + h * slots + i);
      }
    }
    // The group's slots in the run are consecutive positions: copied a block's part at a time.
    const std::size_t lo = std::max(slot_a, g * slots), hi = std::min(slot_b, g * slots + slots);
    for (std::size_t slot = lo; slot < hi;) {
      const std::size_t off = a + (slot - slot_a) - from, in = off % compressed_block;
      const std::size_t take = std::min(hi - slot, compressed_block - in);
      float* to = w.scores + off / compressed_block * count * compressed_block + in;
      for (std::size_t h = 0; h < count; ++h)
        std::copy_n(w.group + h * slots + (slot - g * slots), take, to + h * compressed_block);
      slot += take;
    }
  }
}

/// The slot groups (codes, scales) of kv head kv's window positions in [lo, hi), asked for a
/// segment block's share at a time: the next segment's keys, requested while this segment's V
/// rows are summed, so the scan finds them cached instead of stalling on its loads.
/// Re-measure: python3 bench/compressed_targets.py --shapes '/32768/8' --variants '^tq'
struct key_prefetch {
  static constexpr std::size_t max_ranges = 4 * max_runs;  // codes, scales, signs, norms a run
  const std::uint8_t* line[max_ranges] = {};               // a range's first cache line
  std::size_t lines[max_ranges] = {};                      // and how many it takes
  std::size_t ranges = 0, at = 0, done = 0, share = 0;
  HWY_INLINE void add(const void* first, std::size_t bytes) {
    const auto* p = static_cast<const std::uint8_t*>(first);
    const std::size_t offset = reinterpret_cast<std::uintptr_t>(p) % 64;
    line[ranges] = p - offset;
    lines[ranges] = (offset + bytes + 63) / 64;
    share += lines[ranges++];
  }
  HWY_INLINE void set(const code_window& k, std::size_t kv, std::size_t lo, std::size_t hi,
                      const chunk_work& w) {
    ranges = at = done = share = 0;
    if (!k.format.grouped) return;  // int8 rows: the hardware prefetchers keep up
    for (std::size_t r = 0; r < k.run_count; ++r) {
      const codec::rows_run& run = k.runs[r];
      const std::size_t a = std::max(lo, run.first), b = std::min(hi, run.first + run.count);
      if (a >= b) continue;
      const std::size_t first = kv * run.head_stride + run.slot + (a - run.first), n = b - a;
      const std::size_t g0 = first / codec::group_slots;
      const std::size_t groups = (first + n + codec::group_slots - 1) / codec::group_slots - g0;
      add(run.codes + g0 * w.code_group, groups * w.code_group);
      add(run.scales + first, n * sizeof(float));
      if (!k.format.qjl) continue;
      add(run.signs + g0 * w.sign_group, groups * w.sign_group);
      add(run.residual_norms + first, n * sizeof(float));
    }
    share = (share + segment_blocks - 1) / segment_blocks;
  }
  /// Asks for the next share of the lines.
  HWY_INLINE void advance() {
    for (std::size_t left = share; at < ranges; ++at, done = 0)
      for (; done < lines[at]; ++done) {
        if (left-- == 0) return;
        Prefetch(line[at] + 64 * done);
      }
  }
};

/// The scores of every window position in [from, hi) (a segment's) for the chunk's heads.
HWY_INLINE void ScoreSegment(const compressed_problem& cp, std::size_t kv, std::size_t count,
                             std::size_t from, std::size_t hi, chunk_work& w) {
  const code_window& k = cp.keys;
  if (!k.format.int8) {
    for (std::size_t r = 0; r < k.run_count; ++r) {
      const codec::rows_run& run = k.runs[r];
      const std::size_t a = std::max(from, run.first), b = std::min(hi, run.first + run.count);
      if (a < b) ScanRun(cp, run, kv, count, from, a, b, w);
    }
    return;
  }
  // int8 keys: a piece's rows are scored straight into their block's positions
  for (std::size_t pos = from; pos < hi; pos += compressed_block) {
    piece pieces[max_runs];
    const std::size_t m = PiecesOf(k, kv, pos, std::min(pos + compressed_block, hi), pieces);
    float* block = w.scores + (pos - from) / compressed_block * count * compressed_block;
    for (std::size_t i = 0; i < m; ++i) {
      const float* scales = PieceRows(k, pieces[i], w.rows);
      w.key_chunks.copy_tails(w.rows, pieces[i].count);
      ScoreInt8(count, w.rows, scales, pieces[i].count, w.q16, max_padded, w.q_scale, w.key_chunks,
                block + pieces[i].offset, compressed_block);
    }
  }
}

/// The block's V rows of kv head kv, [pos, end), weighted by the block's exp'd scores times each
/// row's scale, folded into s.acc (rows of `padded` floats, expansion order).
HWY_INLINE void AccumulateBlock(const compressed_problem& cp, std::size_t kv, std::size_t count,
                                std::size_t pos, std::size_t end, const float* p,
                                const float* rescale, const state& s, std::size_t padded,
                                chunk_work& w) {
  const code_window& v = cp.values;
  const DF df;
  const std::size_t N = hn::Lanes(df), start = pos / compressed_block * compressed_block;
  piece pieces[max_runs];
  const std::size_t count_pieces = PiecesOf(v, kv, start, end, pieces);
  std::size_t n = 0;
  for (std::size_t i = 0; i < count_pieces; ++i) {
    const piece& pc = pieces[i];
    const float* scales = PieceRows(v, pc, w.rows + n);
    for (std::size_t h = 0; h < count; ++h) {
      const float* ph = p + h * compressed_block + pc.offset;
      float* wh = w.weights + h * compressed_block + n;
      std::size_t j = 0;
      for (; j + N <= pc.count; j += N)
        hn::StoreU(hn::Mul(hn::LoadU(df, ph + j), hn::LoadU(df, scales + j)), df, wh + j);
      for (; j < pc.count; ++j) wh[j] = ph[j] * scales[j];
    }
    n += pc.count;
  }
  w.value_chunks.copy_tails(w.rows, n);
  VisitValueKind(w.values_kind, [&](auto kind) {
#ifdef RINGKV_VNNI
    if constexpr (std::is_same_v<decltype(kind), int8_pair_rows>) {
      AccumulateInt8(count, w.rows, n, w.weights, compressed_block, rescale, s.acc, padded,
                     w.value_chunks);
      return;
    } else
#endif
      AccumulateRows<decltype(kind)>(count, w.rows, n, w.weights, compressed_block, rescale, s.acc,
                                     padded, w.value_chunks, w.values.levels);
  });
}

/// Chunks of the values' row kind and their coordinates (the padded accumulator rows).
HWY_INLINE std::size_t ValueChunks(const codec::rows_format& f, value_kind k, std::size_t group,
                                   row_chunks& c) {
  return VisitValueKind(k, [&](auto kind) {
    using Kind = decltype(kind);
    c.set<Kind>(f.head_dim, f.code_bytes, group);
    return c.count * Kind::coords();
  });
}

HWY_NOINLINE void CompressedDecodeImpl(const compressed_problem& cp, const float* sinks,
                                       float* out) {
  chunk_work w;
  const codec::rows_format &kf = cp.keys.format, &vf = cp.values.format;
  const std::size_t d = cp.head_dim, group = cp.q_heads / cp.kv_heads;
  if (!vf.int8) w.values.set(vf.centroids, vf.bits);
  w.values_kind = ValueKindOf(vf, group);
  const std::size_t padded = ValueChunks(vf, w.values_kind, group, w.value_chunks);
  if (kf.int8) w.key_chunks.set<int8_pairs>(d, kf.code_bytes, group);
  const window positions = PositionsOf(cp.keys);
  // [2][heads] the running max and sum, [2][heads] a segment's, then its [heads][padded] sums
  HWY_ALIGN float states[4 * max_scan_heads + max_scan_heads * max_padded];
  HWY_ALIGN float running[max_scan_heads * max_padded];  // [heads][padded] the running sums
  HWY_ALIGN float tmp[max_dim];
  for (std::size_t kv = cp.q_first / group; kv * group < cp.q_last; ++kv)
    for (std::size_t q0 = std::max(kv * group, cp.q_first),
                     q_end = std::min((kv + 1) * group, cp.q_last);
         q0 < q_end; q0 += max_scan_heads) {
      const std::size_t count = std::min(max_scan_heads, q_end - q0);
      PrepareQueries(cp, kv, q0, count, w);
      chunk c;  // the softmax step's view: scores and rescales of one block at a time
      c.count = count;
      c.block = compressed_block;
      DecodeSegments(
          positions, padded, c, states, sinks ? sinks + q0 : nullptr, running,
          [&](std::size_t from, std::size_t to, const state& s) {
            const std::size_t hi = std::min(to, WindowEnd(positions));
            const std::size_t blocks = (hi - from + compressed_block - 1) / compressed_block;
            std::fill(w.scores, w.scores + blocks * count * compressed_block, minus_infinity);
            ScoreSegment(cp, kv, count, from, hi, w);
            key_prefetch next;
            next.set(cp.keys, kv, to, std::min(to + segment_positions, WindowEnd(positions)), w);
            for (std::size_t pos = NextPosition(positions, from); pos < hi;) {
              next.advance();
              const std::size_t end = BlockEnd(pos, hi, compressed_block);
              const std::size_t k = (pos - from) / compressed_block;
              chunk b = c;
              b.scores = w.scores + k * count * compressed_block;
              b.rescale = w.rescale + k * count;
              ExpBlockWith<fast_exp>(b, s);
              AccumulateBlock(cp, kv, count, pos, end, b.scores, b.rescale, s, padded, w);
              pos = NextPosition(positions, end);
            }
          });
      // The normalised rows, from expansion order to coordinates, rotated back (Πᵀ).
      const float* state_v = vf.int8 ? nullptr : vf.rotations + kv * vf.rotation_floats;
      for (std::size_t h = 0; h < count; ++h) {
        const float* row = running + h * padded;
        VisitValueKind(w.values_kind, [&](auto kind) {
          for (std::size_t e = 0; e < padded; ++e) {
            const std::size_t i = decltype(kind)::coordinate(e);
            if (i < d) tmp[i] = row[e];
          }
        });
        float* o = out + (q0 + h) * d;
        if (vf.int8)
          std::copy(tmp, tmp + d, o);
        else
          codec::rotate_back(state_v, vf.hadamard, d, tmp, o);
      }
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

std::int64_t compressed_targets() { return HWY_TARGETS; }

}  // namespace ringkv::simd
#endif  // HWY_ONCE
