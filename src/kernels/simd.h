// The Highway kernels' entry points, declared without Highway. Only implementation units include
// this header (docs/design.md): the module ringkv.kernels exports checked wrappers around them, so
// no consumer ever compiles a Highway header. Arguments are trusted here (checked by the caller).
//
// Arithmetic contract (the bits do not depend on the ring's phase, the chunking or the threads):
// - a score is dot(query * scale, key row) over head_dim, the same arithmetic for every row;
// - the online softmax advances one block at a time, blocks aligned on absolute multiples of
//   problem::block, decided from one kv head's bytes, the window and the GQA group (never from
//   the other heads or the threads): scores, one max and rescale, vector Exp, V rows summed;
// - decode computes a fresh partial state per segment (aligned on absolute multiples of
//   segment_positions) and merges them left to right with merge(), so threads that compute
//   segments in parallel and merge in the same order get the same bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringkv::simd {

inline constexpr std::size_t block_positions = 16;
// Blocks of a step whose kv head's K and V take at most cached_head_bytes (cached_shared_head_bytes
// when query heads share them; one head's bytes, so no head's bits depend on the others): half
// the softmax steps and folds. Re-measure: scripts/bench-targets --shapes '/256/|^64/4096/2'
inline constexpr std::size_t cached_block_positions = 32;
// Blocks, on a large_l3 or large_l2 machine (take_wide_blocks), of a step whose window holds at
// least wide_block_min_positions, whatever its bytes (a head's bits depend only on the window):
// a quarter of the softmax steps and folds of blocks of 16. Not small_l2: 64 D 128 rows of K and
// V overfill a 32 KiB L1. Re-measure: scripts/bench-targets --shapes '/256/|/32768/'
inline constexpr std::size_t wide_block_positions = 64;
inline constexpr std::size_t wide_block_min_positions = 256;
inline constexpr std::size_t max_block_positions = wide_block_positions;
inline constexpr std::size_t cached_head_bytes = std::size_t(1) << 20;
inline constexpr std::size_t cached_shared_head_bytes = std::size_t(4) << 20;
inline constexpr std::size_t segment_positions = 1024;
inline constexpr std::size_t max_runs = 4;  // as windowed_kv::max_runs
// Decode prefetches K/V rows itself only when a thread reads more than prefetch_min_bytes of
// them: below, rows are likely cached, where the hardware prefetchers keep up and software ones
// only cost issue slots. Behind an L2 of more than small_l2_bytes they keep up with rows from the
// L3 too, hence the larger threshold there.
// Re-measure: scripts/bench-targets --shapes '^128/4096/2|^64/4096/8'
inline constexpr std::size_t small_l2_prefetch_min_bytes = std::size_t(8) << 20;
inline constexpr std::size_t large_l2_prefetch_min_bytes = std::size_t(12) << 20;
// A machine whose L2 holds more than small_l2_bytes is large_l2 (unless its L3 makes it large_l3).
inline constexpr std::size_t small_l2_bytes = std::size_t(512) << 10;
// A machine whose L3 holds at least large_l3_bytes (a shared L3 of hundreds of MiB, whatever its
// L2) plans from the whole step's bytes, since where rows come from depends on what all threads
// read together, and its hardware prefetchers keep up with rows from the L3: no software prefetch
// up to large_l3_prefetch_min_bytes, no pipelined reads up to large_l3_pipelined_min_bytes
// (plan_reads_large_l3).
inline constexpr std::size_t large_l3_bytes = std::size_t(128) << 20;
inline constexpr std::size_t large_l3_prefetch_min_bytes = std::size_t(48) << 20;
inline constexpr std::size_t large_l3_pipelined_min_bytes = std::size_t(96) << 20;

// On a large_l2 machine, a GQA step whose kv head's K and V exceed wide_shared_head_max_bytes
// (rows from memory) keeps cached_block_positions where a block of 64 would exceed
// wide_shared_block_max_bytes (a 32 KiB L1, which such a block's K and V rows overfill).
// Re-measure: scripts/bench-targets --shapes 128/32768/2
inline constexpr std::size_t wide_shared_head_max_bytes = std::size_t(16) << 20;
inline constexpr std::size_t wide_shared_block_max_bytes = std::size_t(32) << 10;

/// Which of the limits here plan_reads applies: the L2 up to small_l2_bytes, a larger L2, or an
/// L3 of at least large_l3_bytes.
enum class cache_kind : std::uint8_t { small_l2, large_l2, large_l3 };
/// This machine's kind (its caches read once, by cache_bytes), or the one a test set; O(1).
cache_kind this_cache_kind();
/// Bytes of cpu0's level-`level` data or unified cache as the sysfs directory `dir` lists it
/// (Linux: /sys/devices/system/cpu/cpu0/cache), 0 where it does not; reads a few small files.
std::size_t sysfs_cache_bytes(const std::string& dir, int level);
/// Bytes of this machine's level-`level` (1–3) data or unified cache: sysfs's, else sysconf's,
/// else 0; reads a few small files.
std::size_t cache_bytes(int level);
/// Tests only: plan every later step as on a machine of kind `k` (so every read path runs on
/// any machine); null restores this machine's own. Not thread-safe against running steps.
void set_cache_kind_for_test(const cache_kind* k);
/// The threshold above for a machine of kind `k` (large_l3: large_l3_prefetch_min_bytes); O(1).
inline std::size_t prefetch_min_bytes(cache_kind k) {
  return k == cache_kind::small_l2   ? small_l2_prefetch_min_bytes
         : k == cache_kind::large_l3 ? large_l3_prefetch_min_bytes
                                     : large_l2_prefetch_min_bytes;
}
// ... except that a step whose query heads share each kv row (GQA) and whose threads read at
// least prefetch_min_bytes each but less than this (rows likely in the L3: 32 MiB here, shared
// with other work) prefetches with the cheaper, dense walk (see line_feed).
inline constexpr std::size_t dense_prefetch_max_bytes = std::size_t(16) << 20;
// ... and whose block of one kv head's K and V rows takes at most this (half the L1): the dense
// walk asks for this block's V rows while its scores are computed and the next block's K rows
// while its V rows are summed, so larger blocks overfill the L1.
// Re-measure: scripts/bench-targets --shapes 128/4096/2
inline constexpr std::size_t dense_prefetch_block_bytes = std::size_t(16) << 10;
// A step with one query head per kv head (GQA 1) takes this many kv heads side by side (see
// AttendSpread in softmax-inl.h): always when it does not prefetch; when it does, only if their
// block of K and V rows fits the L1 (side_by_side_l1_bytes: rows of at most 256 bytes) and each
// thread reads prefetch_min_bytes to dense_prefetch_max_bytes (rows likely in the L3).
inline constexpr std::size_t side_by_side_heads = 4;
inline constexpr std::size_t side_by_side_l1_bytes = std::size_t(32) << 10;
// With one query head per kv head, f32 rows of at least this many bytes and at least
// prefetch_min_bytes a thread (rows from the L3 or memory), a chunk reads its rows pipelined
// (PipelineBlocks) instead of in blocks with software prefetch: two steady streams the hardware
// prefetchers follow (f16/bf16 rows: half_pipelined_min_bytes).
// Re-measure: scripts/bench-targets --shapes 32768/8
inline constexpr std::size_t pipelined_min_row_bytes = 512;
// ... and f32 rows of at least this many bytes (D 64) once a thread reads more than
// dense_prefetch_max_bytes (rows mostly from memory, where the two streams pay for shorter rows).
// Re-measure: scripts/bench-targets --shapes ^64/32768/8
inline constexpr std::size_t pipelined_min_short_row_bytes = 256;
// The kernels work on a stack scratch of this many floats: per query head of a chunk, its
// scaled query, a block of scores and a segment accumulator. The head_dim limit keeps one head.
inline constexpr std::size_t scratch_floats = 8192;
inline constexpr std::size_t max_head_dim = 2048;

/// How decode prefetches a step's rows (see line_feed): not at all, lines back to back (rows
/// from the L3), or spaced out by a per-row walk (rows from memory).
enum class prefetch_walk : std::uint8_t { none, dense, spaced };

/// Element type of K/V rows (f16, bf16 and fp8 E4M3FN are promoted to f32 in registers; f32
/// accumulation).
enum class element : std::uint8_t { f32, f16, bf16, fp8_e4m3 };

/// An fp8 E4M3FN element's bits: the type fp8 rows are loaded as (rows-inl.h's row_loader).
struct fp8_e4m3 {
  std::uint8_t bits;
};

/// Window positions [first, first + count), rows of every head. Strides are in bytes.
struct run {
  const std::byte* data = nullptr;  // row (head 0, position first)
  std::size_t head_stride = 0;      // bytes from a head's row to the next head's, same position
  std::size_t position_stride = 0;  // bytes from a position's row to the next position's
  std::size_t first = 0;            // absolute position of the first row
  std::size_t count = 0;
};

/// A window [heads, positions, head_dim] as up to max_runs runs in increasing position order.
struct window {
  run runs[max_runs];
  std::size_t run_count = 0;
  element type = element::f32;
};

/// How many positions the window's runs hold; O(runs).
inline std::size_t position_count(const window& w) {
  std::size_t positions = 0;
  for (std::size_t r = 0; r < w.run_count; ++r) positions += w.runs[r].count;
  return positions;
}

/// One decode problem. Query head q reads kv head q / (q_heads / kv_heads).
struct problem {
  const float* query = nullptr;  // [q_heads, head_dim]
  window keys;                   // [kv_heads, positions, head_dim]
  window values;                 // [kv_heads, positions, head_dim], the same positions as keys
  std::size_t q_heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;  // resolved (finite, > 0)
  // How decode prefetches rows itself (see prefetch_walk_for, and pipelined_prefetch for a step
  // read pipelined, whose reads take spaced or none): decided once for the whole step
  // (from its bytes, and those of each of its threads), and kept when a split hands a thread
  // part of it.
  prefetch_walk prefetch = prefetch_walk::none;
  // Whether a step with one query head per kv head takes side_by_side_heads kv heads at a time
  // (see plan_reads); decided with `prefetch`.
  bool side_by_side = false;
  // Whether a one-query-head chunk reads its rows software-pipelined (PipelineBlocks: the next
  // block's K rows between this block's V rows) instead of block by block (see plan_reads).
  bool pipelined = false;
  // Positions a block of the online softmax covers (block_positions, cached_block_positions or
  // wide_block_positions, see plan_reads): the arithmetic's unit, so decided from what every
  // head of the step shares (its window, head_dim, element type and GQA group), kept when a
  // split hands a thread part.
  std::size_t block = block_positions;
};

/// Bytes of one element of a row of type `type`; O(1).
inline std::size_t element_bytes(element type) {
  switch (type) {
    case element::f32:
      return 4;
    case element::f16:
    case element::bf16:
      return 2;
    case element::fp8_e4m3:
      return 1;
  }
  return 4;  // unreachable: every element type has its case
}

/// Bytes of one K or V row of `p` (one head, one position); O(1).
inline std::size_t row_bytes(const problem& p) { return p.head_dim * element_bytes(p.keys.type); }

/// Bytes of K and V rows a step over `p` reads (every kv head, both windows); O(runs).
inline std::size_t step_bytes(const problem& p) {
  return 2 * position_count(p.keys) * p.kv_heads * row_bytes(p);
}

/// Bytes of one block of one kv head's K and V rows of `p` (p.block positions); O(1).
inline std::size_t block_bytes(const problem& p) { return p.block * 2 * row_bytes(p); }

/// How a step over `p` (p.block set) whose threads read `per_thread` bytes of K and V rows each
/// should prefetch, given prefetch_min_bytes as `least`; O(1).
inline prefetch_walk prefetch_walk_for(const problem& p, std::size_t per_thread,
                                       std::size_t least) {
  if (p.q_heads >= 2 * p.kv_heads && per_thread >= least && per_thread < dense_prefetch_max_bytes &&
      block_bytes(p) <= dense_prefetch_block_bytes)
    return prefetch_walk::dense;
  return per_thread > least ? prefetch_walk::spaced : prefetch_walk::none;
}

// On a large_l2 machine, a step with one query head per kv head (GQA 1) prefetches only once a
// thread reads more than dense_prefetch_max_bytes: up to that its rows are in the L3 (32 MiB),
// where the spaced walk costs more issue slots than it saves (a small_l2 machine's prefetchers do
// not keep up there). Re-measure: scripts/bench-targets --shapes ^64/4096/8
/// The least bytes a thread reads (exclusive) before a step with one query head per kv head
/// prefetches on a machine of kind `k`: dense_prefetch_max_bytes on a large_l2 one (above),
/// else prefetch_min_bytes; O(1).
inline std::size_t unshared_prefetch_min_bytes(cache_kind k) {
  return k == cache_kind::large_l2 ? dense_prefetch_max_bytes : prefetch_min_bytes(k);
}

/// Whether every run of `w` has the same bytes between kv heads' rows of a position (so one
/// head's row pointers, moved by that, give any head's: AttendSpread); O(runs).
inline bool uniform_head_stride(const window& w) {
  for (std::size_t r = 1; r < w.run_count; ++r)
    if (w.runs[r].head_stride != w.runs[0].head_stride) return false;
  return w.run_count != 0;
}

/// Whether a step over `p` may take side_by_side_heads kv heads at a time (one query head per kv
/// head, every run's heads equally spaced, not pipelined: set p.pipelined first); O(runs).
inline bool may_go_side_by_side(const problem& p) {
  return !p.pipelined && p.q_heads == p.kv_heads && uniform_head_stride(p.keys) &&
         uniform_head_stride(p.values);
}

/// Whether a step over `p` could read its rows pipelined at all (PipelineBlocks: one query head
/// per kv head, f32 rows); plan_reads adds the bytes; O(1).
inline bool may_pipeline(const problem& p) {
  return p.q_heads == p.kv_heads && p.keys.type == element::f32;
}

// On a large_l2 machine (takes_wide_reads), a step with one query head per kv head reads f16 or
// bf16 rows of at least half_pipelined_min_row_bytes pipelined too from half_pipelined_min_bytes
// a thread (rows mostly from memory); not on small_l2, where (with AVX2) the promotion makes a
// pipelined row too long. Re-measure: scripts/bench-targets --shapes 32768/8
inline constexpr std::size_t half_pipelined_min_bytes = std::size_t(16) << 20;
inline constexpr std::size_t half_pipelined_min_row_bytes = 128;

/// Whether a step over `p` could read f16 or bf16 rows pipelined on a large_l2 machine (one
/// query head per kv head, rows of at least half_pipelined_min_row_bytes); O(1).
inline bool may_pipeline_half_rows(const problem& p) {
  return p.q_heads == p.kv_heads && p.keys.type != element::f32 &&
         row_bytes(p) >= half_pipelined_min_row_bytes;
}

/// p.block ← wide_block_positions if the window holds at least wide_block_min_positions: the
/// rule large_l3 and large_l2 machines share; O(runs).
inline void take_wide_blocks(problem& p) {
  if (position_count(p.keys) >= wide_block_min_positions) p.block = wide_block_positions;
}

/// plan_reads' prefetch, pipelined and side_by_side on a large_l3 machine, from the step's
/// `bytes` (all threads'): where rows come from depends on what all threads read together;
/// O(1). Re-measure: scripts/bench-targets --shapes '4096/8|32768'
inline void plan_reads_large_l3(problem& p, std::size_t bytes) {
  p.prefetch = bytes > large_l3_prefetch_min_bytes ? prefetch_walk::spaced : prefetch_walk::none;
  p.pipelined = may_pipeline(p) && row_bytes(p) >= pipelined_min_short_row_bytes &&
                bytes > large_l3_pipelined_min_bytes;
  p.side_by_side = may_go_side_by_side(p) && p.prefetch == prefetch_walk::none;
  take_wide_blocks(p);
}

/// Whether a machine of kind `k` takes take_wide_blocks and the pipelined f16/bf16 reads
/// (may_pipeline_half_rows): a large_l2 one, not small_l2 (see half_pipelined_min_bytes); O(1).
/// Re-measure: scripts/bench-targets
inline bool takes_wide_reads(cache_kind k) { return k == cache_kind::large_l2; }

// A step read pipelined (PipelineBlocks) prefetches, between two rows, a row of the next block's
// V and of the K of the block after it (p.prefetch spaced, whatever prefetch_walk_for said),
// except on a large_l2 machine for f16 or bf16 rows under pipelined_min_short_row_bytes (D 64),
// where software prefetch only takes issue slots and miss buffers; longer rows need it.
// Re-measure: scripts/bench-targets --shapes ^64/32768/8

/// The prefetch of a step over `p` read pipelined (p.pipelined set) on a machine of kind `k`:
/// spaced, or none (above); O(1).
inline prefetch_walk pipelined_prefetch(const problem& p, cache_kind k) {
  const bool short_half_rows =
      p.keys.type != element::f32 && row_bytes(p) < pipelined_min_short_row_bytes;
  return k == cache_kind::large_l2 && short_half_rows ? prefetch_walk::none : prefetch_walk::spaced;
}

/// Sets how a step over the whole of `p`, split over `threads` threads, reads its rows:
/// p.block, p.prefetch (prefetch_walk_for), p.side_by_side and p.pipelined; O(runs).
inline void plan_reads(problem& p, std::size_t threads) {
  const std::size_t bytes = step_bytes(p), per_thread = bytes / (threads == 0 ? 1 : threads);
  const std::size_t row = row_bytes(p);
  const std::size_t head_bytes = bytes / p.kv_heads;  // one kv head's K and V rows
  const bool shared = p.q_heads > p.kv_heads;
  p.block = head_bytes <= (shared ? cached_shared_head_bytes : cached_head_bytes)
                ? cached_block_positions
                : block_positions;
  const cache_kind kind = this_cache_kind();
  if (kind == cache_kind::large_l3) return plan_reads_large_l3(p, bytes);
  const std::size_t least = prefetch_min_bytes(kind);
  p.prefetch = prefetch_walk_for(p, per_thread, shared ? least : unshared_prefetch_min_bytes(kind));
  const bool fits_l1 = side_by_side_heads * block_bytes(p) <= side_by_side_l1_bytes;
  const bool pipelined_rows =
      row >= pipelined_min_row_bytes
          ? per_thread >= least
          : row >= pipelined_min_short_row_bytes && per_thread > dense_prefetch_max_bytes;
  p.pipelined =
      (may_pipeline(p) && pipelined_rows) || (takes_wide_reads(kind) && may_pipeline_half_rows(p) &&
                                              per_thread >= half_pipelined_min_bytes);
  if (p.pipelined) p.prefetch = pipelined_prefetch(p, kind);
  p.side_by_side = may_go_side_by_side(p) &&
                   (p.prefetch == prefetch_walk::none ||
                    (fits_l1 && per_thread >= least && per_thread <= dense_prefetch_max_bytes));
  // Last, so the reads above (block_bytes feeds prefetch_walk_for and fits_l1) stay those
  // measured with blocks of 16 and 32.
  if (!takes_wide_reads(kind)) return;
  take_wide_blocks(p);
  if (shared && head_bytes > wide_shared_head_max_bytes && p.block == wide_block_positions &&
      block_bytes(p) > wide_shared_block_max_bytes)
    p.block = cached_block_positions;
}

/// A partial online-softmax state, natural log: for each query head, `max` of the scaled scores
/// seen (−inf when none), `sum` = Σ exp(s − max), `acc` = Σ exp(s − max) · v. Its log-sum-exp is
/// max + log(sum).
struct state {
  float* max = nullptr;  // [q_heads]
  float* sum = nullptr;  // [q_heads]
  float* acc = nullptr;  // [q_heads, head_dim]
};

/// A chunk of prefill queries for the tiled kernel (prefill.cpp): `tokens` queries at the
/// consecutive positions first, first + 1, …, each seeing the positions of step.keys in
/// [0, min(keep, p + 1)) ∪ [prefill_from(p), p + 1): decode's window for the token at p.
struct prefill_problem {
  problem step;  // query [tokens, q_heads, head_dim]; keys/values: every position a query sees
  std::size_t tokens = 0, first = 0, window = 0, keep = 0;
};

/// First position of the rolling part of the window of the query at `position` (as
/// detail::window_from: 0 while the query sees every position); O(1).
inline std::size_t prefill_from(const prefill_problem& p, std::size_t position) {
  return position + 1 > p.window ? position + 1 - (p.window - p.keep) : 0;
}

/// The block a decode of the query at `position` alone takes: plan_reads' over a window of its
/// length, min(position + 1, window) (the block depends on nothing else of the window); O(1).
inline std::size_t prefill_block(const prefill_problem& p, std::size_t position) {
  problem q = p.step;
  const std::size_t positions = position + 1 < p.window ? position + 1 : p.window;
  for (window* w : {&q.keys, &q.values}) {
    w->runs[0].first = 0;
    w->runs[0].count = positions;
    w->run_count = 1;
  }
  plan_reads(q, 1);
  return q.block;
}

// A prefill tile takes queries until their query heads (of one kv head) reach prefill_tile_heads:
// each block of K and V rows is loaded once for all of them (more heads: twice the scratch for no
// gain). Re-measure: build/release/bench/prefill_bench --benchmark_filter=threads:1 with the
// constant changed.
inline constexpr std::size_t prefill_tile_heads = 64;

/// Queries [first, first + count) of a prefill chunk (indices into it) decoded with one block.
struct prefill_tile {
  std::size_t first = 0, count = 0, block = 0;
};

/// A prefill chunk cut into tiles: `ranges` of queries of one block size each (a query's block
/// depends only on its window's length, which grows by one a query up to the window, so there
/// are few), each cut into tiles of up to tile_queries queries.
struct prefill_plan {
  static constexpr std::size_t max_ranges = 16;
  prefill_tile ranges[max_ranges];
  std::size_t range_count = 0;
  std::size_t tile_queries = 1;
  std::size_t tiles = 0;  // in all ranges
};

/// Offsets (in floats, each a multiple of 16) of one task's prefill scratch for tiles of
/// `heads` query heads of head_dim elements, and its size.
struct prefill_layout {
  std::size_t q = 0;        // [heads, padded head_dim] the tile's queries · scale
  std::size_t scores = 0;   // [heads, max_block_positions] a block's scores, then weights
  std::size_t rescale = 0;  // [heads]
  std::size_t run = 0;      // max [heads], sum [heads], acc [heads, head_dim]: the whole window
  std::size_t segment = 0;  // the same, for the current segment
  std::size_t rows = 0;     // [2, max_block_positions, padded head_dim] a block's K and V as f32
  std::size_t floats = 0;
};

/// The layout above; O(1).
inline prefill_layout prefill_layout_of(std::size_t heads, std::size_t head_dim) {
  const auto up = [](std::size_t n) { return (n + 15) / 16 * 16; };
  const std::size_t padded = up(head_dim), state = 2 * up(heads) + up(heads * head_dim);
  prefill_layout l;
  l.scores = l.q + heads * padded;
  l.rescale = l.scores + heads * max_block_positions;
  l.run = l.rescale + up(heads);
  l.segment = l.run + state;
  l.rows = l.segment + state;
  l.floats = l.rows + 2 * max_block_positions * padded;
  return l;
}

/// The tiles of a chunk: ranges of one block size, cut into tiles of at most
/// prefill_tile_heads query heads (at least one query); O(tokens).
prefill_plan plan_prefill(const prefill_problem& p);
/// Tile `t` (< plan.tiles) of the plan, in query order; O(ranges).
prefill_tile tile_of(const prefill_plan& plan, std::size_t t);
/// Floats of scratch one prefill task needs (prefill_layout_of for the plan's tiles); O(1).
std::size_t prefill_task_floats(const prefill_problem& p);
/// The queries of tile `t`, for the query heads of kv head `kv_head`: each block of that kv
/// head's rows (the union of what the tile's queries see) loaded once (f16/bf16 promoted once)
/// and scored for every query that sees it, each query's online softmax, segments, merge and
/// finish exactly decode's over its own window; writes those heads' rows of `out`
/// [tokens, q_heads, head_dim]. `scratch` holds prefill_task_floats floats, 64-byte aligned.
/// O(tile queries · window · group · head_dim), no allocation.
void attend_tile(const prefill_problem& p, const prefill_tile& t, std::size_t kv_head,
                 const float* sinks, float* out, float* scratch);

/// Name of the target HWY_DYNAMIC_DISPATCH picks now ("AVX2", ...); O(1).
const char* target_name();
/// The Highway targets these kernels were compiled for (HWY_TARGETS' bits; without EMU128 when
/// built with RINGKV_NO_EMU128), so tests run exactly those; O(1).
std::int64_t compiled_targets();
/// Σ a[i]·b[i] in f32; O(n).
float dot(const float* a, const float* b, std::size_t n);
/// Whether p[0, n) holds no NaN and no ±Inf; O(n), one vector test per Lanes floats.
bool all_finite(const float* p, std::size_t n);
/// Whether every |p[i]| of p[0, n) is below `limit` (NaN counts as below); O(n), vector tests.
bool all_below(const float* p, std::size_t n, float limit);
/// Continues `s` over the window positions in [from, to) (blocks cut at `from`/`to` if they are
/// not block-aligned); O(positions · q_heads · head_dim).
void attend(const problem& p, std::size_t from, std::size_t to, const state& s);
/// `into` ← the log-sum-exp merge of `into` (the earlier positions) and `from`; an empty side
/// leaves the other unchanged bit for bit; O(q_heads · head_dim).
void merge(std::size_t q_heads, std::size_t head_dim, const state& into, const state& from);
/// out = acc / (sum + exp(sink − max)) per head (sinks may be null); zeros for a head that saw
/// no position; O(q_heads · head_dim). `out` may be `s.acc`.
void finish(std::size_t q_heads, std::size_t head_dim, const state& s, const float* sinks,
            float* out);
/// The whole decode step: per segment partial states merged left to right, normalised into
/// `out` [q_heads, head_dim], which is also the running accumulator; O(window · q_heads ·
/// head_dim), no allocation (stack scratch).
void decode(const problem& p, const float* sinks, float* out);

}  // namespace ringkv::simd
