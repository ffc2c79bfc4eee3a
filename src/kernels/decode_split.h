// A decode step split into tasks for a thread pool, Highway-free (it calls the dispatched entry
// points of simd.h). Two shapes of split, both with decode()'s bits:
// - by kv heads: a task runs decode() on a contiguous range of kv heads (their query-head groups
//   are independent, so the heads' rows come out exactly as in one call);
// - by (kv head, segment): a task computes one kv head's partial state over one segment of
//   absolute positions into scratch (a cleared state continued by attend(), as decode() does),
//   and finish_split() merges the segments left to right (log-sum-exp, natural log) and
//   normalises, as decode() does per chunk.
// The plan depends on the thread count, the bits never do.
#pragma once
#include <cstddef>

#include "simd.h"

namespace ringkv::simd {

/// Contiguous ranges of segment numbers (absolute position / segment_positions) that hold
/// window positions, in increasing order; each run of the window gives at most one.
struct segment_ranges {
  std::size_t first[max_runs] = {};
  std::size_t count[max_runs] = {};
  std::size_t ranges = 0;
  std::size_t total = 0;  // segments in all
};

/// Below this many multiply-adds (query heads × window positions × head_dim) a step runs on the
/// caller: handing it to the pool costs about as much (a few µs).
inline constexpr std::size_t min_split_work = std::size_t(1) << 15;

/// How one decode step is split; tasks == 1 means: call decode() inline.
struct split_plan {
  segment_ranges segments;
  std::size_t tasks = 1;
  std::size_t head_chunks = 1;  // by kv heads: tasks == head_chunks
  bool by_segment = false;      // by (kv head, segment): tasks == kv_heads · segments.total
};

/// The segments of `w` that hold positions; O(runs).
segment_ranges segments_of(const window& w);

/// The split for `threads` threads: none below min_split_work; by kv heads when they divide
/// evenly among the threads, the window is one segment, or its segments' partial states would
/// not fit `scratch_floats` (at most min(kv_heads, threads) tasks); else by (kv head, segment).
/// O(runs).
split_plan plan_split(const problem& p, std::size_t threads, std::size_t scratch_floats);

/// Floats of scratch a plan may need for `positions` window positions in any phase and runs
/// (at most positions / segment_positions + 3 segments, × q_heads · (head_dim + 2)); O(1).
std::size_t split_scratch_floats(std::size_t q_heads, std::size_t head_dim, std::size_t positions);

/// Runs task `task` of the plan: by kv heads, writes its heads' rows of `out`; by segment,
/// writes its partial state into `scratch`. Tasks touch disjoint memory, so any threads may
/// run them in any order. O(its positions · group · head_dim).
void run_split_task(const problem& p, const split_plan& plan, std::size_t task, const float* sinks,
                    float* out, float* scratch);

/// After every task: for a split by segment, merges the partial states left to right and
/// normalises into `out`; nothing for a split by kv heads. O(segments · q_heads · head_dim).
void finish_split(const problem& p, const split_plan& plan, const float* sinks, float* out,
                  float* scratch);

}  // namespace ringkv::simd
