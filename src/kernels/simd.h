// The Highway kernels' entry points, declared without Highway. Only implementation units include
// this header (DESIGN §2, §5): the module ringkv.kernels exports checked wrappers around them, so
// no consumer ever compiles a Highway header. Arguments are trusted here (checked by the caller).
//
// Arithmetic contract (what makes the result independent of the ring's phase and of threads):
// - a score is dot(query * scale, key row) over head_dim, with the same per-row arithmetic for
//   every row, whichever run holds it;
// - the online softmax advances one block of window positions at a time, blocks aligned to
//   absolute multiples of the step's block (problem::block: block_positions, or
//   cached_block_positions for a step whose rows are likely in the caches, wide_block_positions
//   for any step of 256 positions or more on a large_l3 or large_l2 machine, but on a large_l2
//   one not GQA steps of wide rows past wide_shared_head_max_bytes a kv head (see there);
//   decided from one kv head's bytes, the window and the GQA group, never from the other heads
//   or the threads): the block's scores, one max and rescale per block, exp of the block's
//   scores (Highway vector Exp), the block's V rows summed, then folded into the state;
// - decode computes a fresh partial state per segment (absolute multiples of segment_positions
//   that hold window positions) and merges them left to right with merge(), so a thread pool
//   that computes segments in parallel and merges in the same order gets the same bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringkv::simd {

inline constexpr std::size_t block_positions = 16;
// A step whose kv heads' rows are likely in the caches takes blocks of this many positions:
// half the softmax steps and folds a position. Not past that, where the prefetch plan below
// was measured for blocks of 16 and 32 lost (D 64 / W 4096 and W 32768 / kv 8, session 18).
// The test is one kv head's K and V bytes, at most cached_head_bytes, or
// cached_shared_head_bytes when query heads share the rows (8 MiB in all at 8 and at 2 kv
// heads: the most a step reads without software prefetch), so a head's bits never depend on
// the other heads or the threads. Measured (release binaries alternated, fastest µs, 16 against
// 32; bench/README, session 19): D 64 / W 256 / kv 8 24.7 against 22.3, D 128 / W 256 / kv 8
// 43.9 against 39.2, D 64 / W 4096 / kv 2 213 against 193; D 128 / W 4096 / kv 2 (4 MiB a
// head) 258 against 182 on 2 threads, but 369–396 against 400–429 on 1 (8 MiB from the L3).
inline constexpr std::size_t cached_block_positions = 32;
// On a large_l3 machine (below) a step whose window holds at least wide_block_min_positions
// takes blocks of this many, whatever its bytes (so a head's bits still depend only on the
// window): half the softmax steps again. Measured there (one binary behind a temporary switch,
// fastest µs; bench/README "Tuning measured", session 23): against 32, 0.83–0.98× at W
// 256–2048 with one query head a kv head and 0.88–0.98× at W 256–4096 with GQA 4, but
// 1.03–1.10× at W 64 (a window of one or two blocks); against 16 past the bytes above, GQA 4
// 0.87–0.95× (D 64 / W 16384 and 32768, D 128 / W 8192), pipelined rows 0.84–0.96× (D 64 /
// W 32768, D 128 / W 16384 and 32768), W 4096 / kv 8 level, and 1.02–1.09× with the spaced
// walk (D 128 / W 32768 / kv 2, 64 MiB with kv 8). A large_l2 machine takes them too (see
// takes_wide_reads); not a small_l2 one (the Zen 3), whose 32 KiB L1 a block of 64 D 128 rows
// of K and V overfills.
inline constexpr std::size_t wide_block_positions = 64;
inline constexpr std::size_t wide_block_min_positions = 256;
inline constexpr std::size_t max_block_positions = wide_block_positions;
inline constexpr std::size_t cached_head_bytes = std::size_t(1) << 20;
inline constexpr std::size_t cached_shared_head_bytes = std::size_t(4) << 20;
inline constexpr std::size_t segment_positions = 1024;
inline constexpr std::size_t max_runs = 4;  // as windowed_kv::max_runs
// Decode prefetches K/V rows itself only when a thread reads more than prefetch_min_bytes of
// them: a window that small is likely still in the caches, where the hardware prefetchers keep
// up and the software ones only cost issue slots (measured in softmax-inl.h, AttendRange).
// 8 MiB where the L2 holds at most 512 KiB (the Zen 3 of sessions 1–20), 12 MiB where it holds
// more (the Zen 5 of session 21, 1 MiB; the hardware prefetchers there keep up with rows from
// the L3 that the Zen 3 needed help with). Measured on the Zen 5 (one binary behind a temporary
// switch, 2 rounds × 2, fastest / median µs, 8 MiB against 12 MiB a thread): D 128 / W 4096 /
// kv 2 (8 MiB) 217 / 233 against 156 / 174 on 1 thread, D 64 / W 4096 / kv 8 on 2 threads
// (8 MiB each) 235 / 410 against 152 / 208; the other grid shapes within the noise.
inline constexpr std::size_t small_l2_prefetch_min_bytes = std::size_t(8) << 20;
inline constexpr std::size_t large_l2_prefetch_min_bytes = std::size_t(12) << 20;
inline constexpr std::size_t small_l2_bytes = std::size_t(512) << 10;
// A machine whose L3 holds at least large_l3_bytes (the Intel Xeon of session 23: 2 MiB L2 a
// core, 480 MiB of L3 shared with the host's other guests) plans from the whole step's bytes,
// since where rows come from depends on what all threads read together, and its hardware
// prefetchers keep up with rows from the L3: no software prefetch up to
// large_l3_prefetch_min_bytes, none of the pipelined reads up to large_l3_pipelined_min_bytes
// (see plan_reads_large_l3; measured in bench/README, "Tuning measured", session 23).
inline constexpr std::size_t large_l3_bytes = std::size_t(128) << 20;
inline constexpr std::size_t large_l3_prefetch_min_bytes = std::size_t(48) << 20;
inline constexpr std::size_t large_l3_pipelined_min_bytes = std::size_t(96) << 20;

// On a large_l2 machine a step whose window holds at least wide_block_min_positions takes
// wide_block_positions, as on the large_l3 Xeon (take_wide_blocks, takes_wide_reads). Measured
// first on the Intel Xeon of sessions 26–29 (2 MiB L2 and 48 KiB L1 a core, 105 MiB of L3; its
// own kind, wide_l2, until session 37) with one binary behind a temporary switch, processes
// alternated, µs, 64 against the block it had before (bench/README, sessions 27 and 29):
// - against 32 (rows likely cached), session 27, 8 rounds × 3, median: 0.90–0.97× in all 12
//   cells that change (D 64 / W 256 / kv 8 and 2, D 128 / W 256 / kv 2, D 64 / W 4096 / kv 2;
//   f32 on 1 and 2 threads, f16), the unchanged D 128 / W 4096 / kv 8 cells 0.99–1.03×;
// - against 16 (past the cached bytes), session 29, 8 rounds × 3: every cell at W 4096 / kv 8
//   and W 32768 (D 64 and 128, kv 8 and 2, f32 on 1 and 2 threads, f16) 0.67–1.02× at the
//   median (23 of 24 under 1) and 0.56–1.00× at the fastest; two earlier runs of 4 and 6 rounds
//   × 3 agreed at D 64 / W 32768 and D 128 / W 32768 / kv 8, were level at D 128 / W 32768 /
//   kv 2, and put the cells that did not change anywhere in 0.79–1.28× (this machine's noise).
// plan_reads widens the block last, so the reads it plans from the block stay those of 16 or 32.
// ... except that a step whose query heads share each kv row (GQA) and whose kv head's K and V
// take more than wide_shared_head_max_bytes (rows from memory) keeps cached_block_positions
// where a block of wide_block_positions rows would take more than wide_shared_block_max_bytes
// (the L1 of the Zen 4 and the Zen 3; rows of more than 256 bytes). Measured on the Zen 4
// (session 37, one binary behind a temporary switch, processes rotated, 6 rounds × 3, × roof
// at the median, 32 against 64): f32 D 128 / W 32768 / kv 2 (32 MiB a kv head) 1.81 against
// 2.16 and 1.61 against 2.07 on 1 thread, 1.31 against 1.59 and 1.35 against 1.78 on 2; level
// at 16 MiB a kv head (W 16384: 2.08 against 2.20, 1.96 against 2.01); slower with rows of
// 256 bytes (D 64 / W 32768 / kv 2, f16 D 128 / W 32768 / kv 2: 1.02–1.10×).
inline constexpr std::size_t wide_shared_head_max_bytes = std::size_t(16) << 20;
inline constexpr std::size_t wide_shared_block_max_bytes = std::size_t(32) << 10;

/// Which of the limits here plan_reads applies: the L2 up to small_l2_bytes, a larger L2, or an
/// L3 of at least large_l3_bytes. (wide_l2, an L2 of at least 2 MiB, planned as large_l2 from
/// session 36 and was merged into it in session 37.)
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
// ... and whose block of one kv head's K and V rows takes at most this (half the L1 of either
// machine): the dense walk asks for this block's V rows while its scores are computed, and the
// next block's K rows while its V rows are summed, so with larger blocks the lines asked for
// and those in use overfill the L1. Blocks of 32 positions of 512-byte rows (32 KiB) came with
// session 19, after the walk was measured with blocks of 16; on the Zen 3 (session 22, one
// binary behind a temporary switch, fastest / median µs, D 128 / W 4096 / kv 2, 1 thread,
// 8 MiB) the dense walk against none: 375 / 422 against 360 / 386 (5 rounds × 3), 426 / 480
// against 368 / 472 (6 × 3), 425 / 620 against 366 / 607 (12 × 2; the spaced walk 421 / 781).
inline constexpr std::size_t dense_prefetch_block_bytes = std::size_t(16) << 10;
// A step with one query head per kv head (GQA 1) takes this many kv heads side by side (see
// AttendSpread in softmax-inl.h): always when it does not prefetch; when it does, only if their
// block of K and V rows fits the L1 (side_by_side_l1_bytes: rows of at most 256 bytes) and each
// thread reads prefetch_min_bytes to dense_prefetch_max_bytes (rows likely in the L3).
inline constexpr std::size_t side_by_side_heads = 4;
inline constexpr std::size_t side_by_side_l1_bytes = std::size_t(32) << 10;
// With one query head per kv head, f32 rows of at least this many bytes and at least
// prefetch_min_bytes a thread (rows from the L3 or memory), a chunk reads its rows pipelined
// (PipelineBlocks) instead of in blocks with software prefetch. Measured in one binary (10
// interleaved repetitions, fastest / median µs, D 128 / kv 8): W 2048 (16 MiB) 411 / 459
// against 475 / 496, on 2 threads 198 / 224 against 249 / 274; W 4096 1,250 / 1,572 against
// 1,140 / 1,508, on 2 threads 623 / 742 against 665 / 762; W 8192 2,932 / 3,136 against
// 3,460 / 4,233; W 32768 13,041 / 13,885 against 15,019 / 18,506. Not at D 64 (W 4096 549 / 619
// against 549 / 570, W 32768 6,999 / 7,205 against 6,858 / 7,316), nor for f16 rows, whose
// promotion makes a row's work longer (D 128 / W 4096 785 / 833 against 648 / 673, D 64 /
// W 4096 479 / 487 against 257 / 272; on the Zen 3: a large_l2 machine pipelines them, see
// half_pipelined_min_bytes), nor in the caches (D 128 / W 256 ~49 against ~41).
inline constexpr std::size_t pipelined_min_row_bytes = 512;
// ... and f32 rows of at least this many bytes (D 64) once a thread reads more than
// dense_prefetch_max_bytes (rows mostly from memory). Level on the Zen 3 (above); on the Zen 5
// (session 21, one binary behind a temporary switch, 2 rounds × 3, fastest / median µs, blocks
// against pipelined, D 64 / kv 8): W 8192 (32 MiB) 1,270 / 1,332 against 931 / 970, W 16384
// 2,838 / 2,875 against 2,036 / 2,208 (2 threads 1,961 / 2,089 against 1,381 / 1,613), W 32768
// 6,162 / 6,855 against 3,889 / 4,754 (2 threads 4,329 / 4,414 against 3,732 / 3,932); not at
// 16 MiB a thread (W 4096 365 / 437 against 406 / 455, W 8192 on 2 threads 518 / 681 against
// 563 / 651).
inline constexpr std::size_t pipelined_min_short_row_bytes = 256;
// The kernels work on a stack scratch of this many floats: per query head of a chunk, its
// scaled query, a block of scores and a segment accumulator. The head_dim limit keeps one head.
inline constexpr std::size_t scratch_floats = 8192;
inline constexpr std::size_t max_head_dim = 2048;

/// How decode prefetches a step's rows (see line_feed): not at all, lines back to back (rows
/// from the L3), or spaced out by a per-row walk (rows from memory).
enum class prefetch_walk : std::uint8_t { none, dense, spaced };

/// Element type of K/V rows (f16/bf16 are promoted to f32 in registers; f32 accumulation).
enum class element : std::uint8_t { f32, f16, bf16 };

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
  float scale = 1.0f;            // resolved (finite, > 0)
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
  // Positions a block of the online softmax covers (block_positions or cached_block_positions,
  // see plan_reads): the arithmetic's unit, so decided from what every head of the step shares
  // (its window, head_dim, element type and GQA group), kept when a split hands a thread part.
  std::size_t block = block_positions;
};

/// Bytes of one element of a row of type `type`; O(1).
inline std::size_t element_bytes(element type) { return type == element::f32 ? 4 : 2; }

/// Bytes of one K or V row of `p` (one head, one position); O(1).
inline std::size_t row_bytes(const problem& p) { return p.head_dim * element_bytes(p.keys.type); }

/// Bytes of K and V rows a step over `p` reads (every kv head, both windows); O(runs).
inline std::size_t step_bytes(const problem& p) {
  return 2 * position_count(p.keys) * p.kv_heads * row_bytes(p);
}

/// Bytes of one block of one kv head's K and V rows of `p` (p.block positions); O(1).
inline std::size_t block_bytes(const problem& p) {
  return p.block * 2 * row_bytes(p);
}

/// How a step over `p` (p.block set) whose threads read `per_thread` bytes of K and V rows each
/// should prefetch, given prefetch_min_bytes as `least`; O(1).
inline prefetch_walk prefetch_walk_for(const problem& p, std::size_t per_thread,
                                       std::size_t least) {
  if (p.q_heads >= 2 * p.kv_heads && per_thread >= least &&
      per_thread < dense_prefetch_max_bytes && block_bytes(p) <= dense_prefetch_block_bytes)
    return prefetch_walk::dense;
  return per_thread > least ? prefetch_walk::spaced : prefetch_walk::none;
}

// On a large_l2 machine, a step with one query head per kv head (GQA 1) prefetches only once a
// thread reads more than dense_prefetch_max_bytes: up to that its rows are in the L3 (32 MiB),
// where the spaced walk costs more issue slots than it saves.
// Measured on the Zen 4 (session 37, one binary behind a temporary switch, processes rotated,
// 6–8 rounds × 3, × roof at the median, no prefetch against the spaced walk, 1 thread, four
// kv heads side by side): f32 D 64 / kv 8 at W 3200 (12.5 MiB) 1.32 against 2.02, W 3584
// (14 MiB) 1.40 against 1.94, W 4096 (16 MiB) 1.35 against 1.96 and 1.46 against 1.99; f16
// D 128 / W 3584 (14 MiB) 1.86 against 2.60, D 64 / W 7168 (14 MiB) 2.20 against 2.59. Level
// past it: W 5120 (20 MiB) 1.66 against 1.64, W 6144 (24 MiB) 1.47 against 1.47. Not on the
// Zen 3 (small_l2), where no prefetch at 16 MiB was slower (see AttendSpread).
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

// On a wide-L2 Xeon, a step with one query head per kv head whose rows are f16 or bf16 (at
// least half_pipelined_min_row_bytes) reads them pipelined too once a thread reads at least
// half_pipelined_min_bytes (rows mostly from memory). Measured there (session 32, one binary
// behind a temporary switch, processes alternated, pipelined ÷ in blocks, fastest (median),
// 5–6 rounds × 3, f16 and bf16): D 128 / W 32768 / kv 8 (128 MiB) 0.69–0.71 (0.71–0.85), on
// 2 threads 0.79–0.80 (0.75–0.80); D 64 / W 32768 / kv 8 (64 MiB) 0.77–0.88 (0.73–0.81), on
// 2 threads 0.69–0.78 (0.79–0.81); D 128 / W 4096 / kv 8 (16 MiB) 0.76–0.83 (0.88–0.97);
// D 64 / W 8192 (16 MiB) 0.88–0.98 (1.05). Not below: 12 MiB (D 64 / W 6144, D 128 /
// W 3072) 0.89–1.48 (1.01–1.33), 8 MiB a thread (D 128 / W 4096 on 2 threads) 0.92–0.96
// (1.04–1.05), D 64 / W 4096 (8 MiB) 1.13–1.23 (1.30–1.41). On the Zen 3 (AVX2) the promotion
// made a pipelined row's work too long (see pipelined_min_row_bytes): only a large_l2 machine
// takes it (takes_wide_reads).
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
/// `bytes` (all threads'). Measured there (one binary behind a temporary switch, fastest µs,
/// bench/README "Tuning measured", session 23): with one query head per kv head, rows read
/// without prefetch or pipelining were 4–16 % faster than the plan of a large_l2 machine up to
/// 64 MiB, pipelined 12–35 % faster from 128 MiB; with GQA 4 the spaced walk was 6 % faster at
/// 64 MiB and 2–9 % slower at 32 MiB and less.
inline void plan_reads_large_l3(problem& p, std::size_t bytes) {
  p.prefetch = bytes > large_l3_prefetch_min_bytes ? prefetch_walk::spaced : prefetch_walk::none;
  p.pipelined = may_pipeline(p) && row_bytes(p) >= pipelined_min_short_row_bytes &&
                bytes > large_l3_pipelined_min_bytes;
  p.side_by_side = may_go_side_by_side(p) && p.prefetch == prefetch_walk::none;
  take_wide_blocks(p);
}

/// Whether a machine of kind `k` takes take_wide_blocks and the pipelined f16/bf16 reads
/// (may_pipeline_half_rows): a large_l2 one (from session 36; before, only a 2 MiB L2's). Measured
/// on the Zen 4 (1 MiB L2, 32 MiB L3, AVX3; a temporary switch forcing the kind, 3 rounds × 3 of
/// the decode grid, f32 and f16, 1 and 2 threads, × roof at the median): these reads ÷ without
/// 0.92 in geometric mean over the 48 cells, faster in 34 (W 256 and kv 2 cells 0.93–0.97,
/// f16 D 64 / W 32768 / kv 8 on 2 threads 1.15 against 2.66), slower in 4 (f32 D 128 / W 4096 /
/// kv 8 1.61 against 1.48, D 128 / W 32768 / kv 8 on 2 threads 1.46 against 1.13). The Zen 5
/// of session 21 (the same caches) was not measured with it. Not small_l2 (see
/// half_pipelined_min_bytes).
inline bool takes_wide_reads(cache_kind k) { return k == cache_kind::large_l2; }

// A step read pipelined (PipelineBlocks) prefetches a row of the next block's V and of the K
// of the block after it between two rows; its p.prefetch says spaced, whatever
// prefetch_walk_for said (the pipelined read has that one walk) ... except on a large_l2
// machine with f16 or bf16 rows of less than pipelined_min_short_row_bytes (D 64: the only ones
// pipelined are 128 bytes, from 16 MiB a thread), where the software prefetch only takes issue
// slots and miss buffers: no prefetch. Measured on the Zen 4 (one binary behind a temporary
// switch, processes rotated, 4–6 rounds × 3, × roof at the median, without ÷ with): f16 D 64 /
// kv 8, session 38, 1 thread W 8192 (16 MiB) 0.91, W 16384 0.91 and 0.91, W 32768 0.84, 0.94
// and 1.04; 2 threads W 16384 0.82 and 0.82, W 32768 0.92, 0.93 and 0.54; session 39, W 32768
// 1.02 (1 thread) and 1.04 (2 threads). bf16 rows take the same reads and a cheaper promotion;
// not measured.
// Measured, not kept: no prefetch for f32 rows of 512 bytes or more past 32 MiB a thread (rows
// from memory, two steady streams the hardware prefetchers follow). f32 D 128 / kv 8, without ÷
// with: session 38, 1 thread W 8192 (64 MiB) 0.87, W 16384 0.82, W 32768 0.81 and 0.82; 2
// threads 0.97–1.01. Session 39 (the same machine type, another day), 1 thread W 8192 1.32,
// W 16384 1.24, W 32768 1.16 and 1.16; 2 threads W 16384 1.21, W 32768 1.40 and 1.44. Nor for
// f16 rows of 256 bytes (D 128 / kv 8 1.13–1.33× the time without, session 38) or f32 rows of
// 256 bytes (D 64 / kv 8 on 1 thread, session 38: W 8192 1.32×, W 16384 1.14× and 1.21×,
// W 32768 0.89–0.98×).

/// The prefetch of a step over `p` read pipelined (p.pipelined set) on a machine of kind `k`:
/// spaced, or none (above); O(1).
inline prefetch_walk pipelined_prefetch(const problem& p, cache_kind k) {
  const bool short_half_rows =
      p.keys.type != element::f32 && row_bytes(p) < pipelined_min_short_row_bytes;
  return k == cache_kind::large_l2 && short_half_rows ? prefetch_walk::none
                                                      : prefetch_walk::spaced;
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
  p.prefetch =
      prefetch_walk_for(p, per_thread, shared ? least : unshared_prefetch_min_bytes(kind));
  const bool fits_l1 = side_by_side_heads * block_bytes(p) <= side_by_side_l1_bytes;
  const bool pipelined_rows =
      row >= pipelined_min_row_bytes
          ? per_thread >= least
          : row >= pipelined_min_short_row_bytes && per_thread > dense_prefetch_max_bytes;
  p.pipelined = (may_pipeline(p) && pipelined_rows) ||
                (takes_wide_reads(kind) && may_pipeline_half_rows(p) &&
                 per_thread >= half_pipelined_min_bytes);
  if (p.pipelined) p.prefetch = pipelined_prefetch(p, kind);
  p.side_by_side = may_go_side_by_side(p) &&
                   (p.prefetch == prefetch_walk::none ||
                    (fits_l1 && per_thread >= least &&
                     per_thread <= dense_prefetch_max_bytes));
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

/// Name of the target HWY_DYNAMIC_DISPATCH picks now ("AVX2", ...); O(1).
const char* target_name();
/// The Highway targets these kernels were compiled for (HWY_TARGETS' bits; without EMU128 when
/// built with RINGKV_NO_EMU128), so tests run exactly those; O(1).
std::int64_t compiled_targets();
/// Σ a[i]·b[i] in f32; O(n).
float dot(const float* a, const float* b, std::size_t n);
/// Whether p[0, n) holds no NaN and no ±Inf; O(n), one vector test per Lanes floats.
bool all_finite(const float* p, std::size_t n);
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
