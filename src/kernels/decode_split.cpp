// A decode step split into tasks (see decode_split.h): the plan, one task, and the final merge.
#include "decode_split.h"

#include <algorithm>
#include <cstddef>
#include <limits>

namespace ringkv::simd {
namespace {

/// The problem restricted to kv heads [k0, k0 + count) and their query-head groups.
problem heads_of(const problem& p, std::size_t k0, std::size_t count) {
  problem s = p;
  const std::size_t group = p.q_heads / p.kv_heads;
  s.query = p.query + k0 * group * p.head_dim;
  s.q_heads = count * group;
  s.kv_heads = count;
  for (window* w : {&s.keys, &s.values})
    for (std::size_t r = 0; r < w->run_count; ++r) w->runs[r].data += k0 * w->runs[r].head_stride;
  return s;
}

/// Segment number of the i-th segment that holds window positions.
std::size_t segment_number(const segment_ranges& s, std::size_t i) {
  std::size_t r = 0;
  for (; i >= s.count[r]; ++r) i -= s.count[r];
  return s.first[r] + i;
}

std::size_t state_floats(const problem& p) { return p.q_heads * (p.head_dim + 2); }

/// Segment i's partial state in the scratch: max [q_heads], sum [q_heads], acc [q_heads, dim].
state segment_state(const problem& p, float* scratch, std::size_t i) {
  float* base = scratch + i * state_floats(p);
  return {base, base + p.q_heads, base + 2 * p.q_heads};
}

}  // namespace

segment_ranges segments_of(const window& w) {
  segment_ranges s;
  for (std::size_t r = 0; r < w.run_count; ++r) {
    const run& ru = w.runs[r];
    if (ru.count == 0) continue;
    const std::size_t a = ru.first / segment_positions;
    const std::size_t b = (ru.first + ru.count - 1) / segment_positions;
    const std::size_t last = s.ranges ? s.first[s.ranges - 1] + s.count[s.ranges - 1] - 1 : 0;
    if (s.ranges > 0 && a <= last + 1) {  // shares or continues the previous range
      s.total += std::max(b, last) - last;
      s.count[s.ranges - 1] = std::max(b, last) + 1 - s.first[s.ranges - 1];
    } else {
      s.first[s.ranges] = a;
      s.count[s.ranges++] = b + 1 - a;
      s.total += b + 1 - a;
    }
  }
  return s;
}

split_plan plan_split(const problem& p, std::size_t threads, std::size_t scratch_floats) {
  split_plan plan;
  plan.segments = segments_of(p.keys);
  if (threads <= 1 || p.q_heads * position_count(p.keys) * p.head_dim < min_split_work) return plan;
  // split_scratch_floats covers windows with at most one gap (after pinned sinks); a window
  // with more may need more, and then splits by kv heads instead (the same bits either way).
  const bool fits = plan.segments.total * state_floats(p) <= scratch_floats;
  if (p.kv_heads % threads == 0 || plan.segments.total <= 1 || !fits) {
    plan.head_chunks = std::min(p.kv_heads, threads);
    plan.tasks = plan.head_chunks;
  } else {
    plan.by_segment = true;
    plan.tasks = p.kv_heads * plan.segments.total;
  }
  return plan;
}

std::size_t split_scratch_floats(std::size_t q_heads, std::size_t head_dim, std::size_t positions) {
  // A pinned run and a main run: ceil(S / seg) + ceil((W − S) / seg) + 1 ≤ W / seg + 3.
  return (positions / segment_positions + 3) * q_heads * (head_dim + 2);
}

void run_split_task(const problem& p, const split_plan& plan, std::size_t task, const float* sinks,
                    float* out, float* scratch) {
  const std::size_t group = p.q_heads / p.kv_heads;
  if (!plan.by_segment) {
    const std::size_t k0 = task * p.kv_heads / plan.head_chunks;
    const std::size_t k1 = (task + 1) * p.kv_heads / plan.head_chunks;
    const std::size_t q0 = k0 * group;
    decode(heads_of(p, k0, k1 - k0), sinks ? sinks + q0 : nullptr, out + q0 * p.head_dim);
    return;
  }
  const std::size_t kv = task % p.kv_heads, i = task / p.kv_heads, q0 = kv * group;
  const state all = segment_state(p, scratch, i);
  const state rows{all.max + q0, all.sum + q0, all.acc + q0 * p.head_dim};
  std::fill(rows.max, rows.max + group, -std::numeric_limits<float>::infinity());
  std::fill(rows.sum, rows.sum + group, 0.0f);
  std::fill(rows.acc, rows.acc + group * p.head_dim, 0.0f);
  const std::size_t begin = segment_number(plan.segments, i) * segment_positions;
  attend(heads_of(p, kv, 1), begin, begin + segment_positions, rows);
}

void finish_split(const problem& p, const split_plan& plan, const float* sinks, float* out,
                  float* scratch) {
  if (!plan.by_segment) return;
  const state first = segment_state(p, scratch, 0);
  for (std::size_t i = 1; i < plan.segments.total; ++i)
    merge(p.q_heads, p.head_dim, first, segment_state(p, scratch, i));
  finish(p.q_heads, p.head_dim, first, sinks, out);
}

}  // namespace ringkv::simd
