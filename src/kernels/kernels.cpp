// ringkv.kernels: checks the arguments, describes windows to the Highway entry points (simd.h)
// and calls them. All checks happen before any output is written.
module;
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "decode_split.h"
#include "simd.h"
module ringkv.kernels;

namespace ringkv::kernels {

// The exported constants describe the kernels' arithmetic; they must be the kernels' own.
static_assert(block_positions == simd::max_block_positions &&
              block_positions % simd::block_positions == 0);
static_assert(segment_positions == simd::segment_positions);
static_assert(min_split_work == simd::min_split_work);
static_assert(max_head_dim == simd::max_head_dim);
static_assert(windowed_kv::max_runs == simd::max_runs);

namespace {

[[noreturn]] void refuse(std::string_view caller, const std::string& what) {
  throw std::invalid_argument(std::string(caller) + ": " + what);
}

std::string str(std::size_t n) { return std::to_string(n); }

/// The window's positions as maximal intervals [first, end): adjacent runs joined, so a window
/// and its wrapped or gathered copy compare equal.
struct intervals {
  std::array<std::pair<std::size_t, std::size_t>, windowed_kv::max_runs> at{};
  std::size_t count = 0;
  bool operator==(const intervals& o) const {
    return count == o.count && std::equal(at.begin(), at.begin() + count, o.at.begin());
  }
};

intervals positions_of(const windowed_kv& w) {
  intervals out;
  for (std::size_t i = 0; i < w.run_count(); ++i) {
    const std::size_t first = w.run_first_position(i), end = first + w.run_positions(i);
    if (out.count > 0 && out.at[out.count - 1].second == first)
      out.at[out.count - 1].second = end;
    else
      out.at[out.count++] = {first, end};
  }
  return out;
}

std::string describe(const intervals& iv) {
  std::string s;
  for (std::size_t i = 0; i < iv.count; ++i)
    s += (i ? " + [" : "[") + str(iv.at[i].first) + ", " + str(iv.at[i].second) + ")";
  return s;
}

/// Keys and values describe the same positions with the same geometry and dtype.
void check_windows(std::string_view caller, const windowed_kv& keys, const windowed_kv& values) {
  for (const auto& [name, w] : {std::pair{"keys", &keys}, std::pair{"values", &values}})
    if (w->family() != kernel_family::elements)
      refuse(caller, std::string(name) + " are " + std::string(traits_of(w->encoding()).name) +
                         " codes; these kernels read element rows (the elements kernel family): "
                         "compressed_kv_attention (or windowed_attention) attends codes");
  if (keys.length() != values.length())
    refuse(caller, "keys hold " + str(keys.length()) + " positions but values hold " +
                       str(values.length()));
  if (keys.empty()) return;
  if (keys.heads() != values.heads() || keys.head_dim() != values.head_dim())
    refuse(caller, "keys are [" + str(keys.heads()) + " heads, head_dim " + str(keys.head_dim()) +
                       "] but values are [" + str(values.heads()) + " heads, head_dim " +
                       str(values.head_dim()) + "]");
  if (keys.type() != values.type())
    refuse(caller, "keys are " + std::string(name_of(keys.type())) + " but values are " +
                       std::string(name_of(values.type())));
  if (keys.first_position() != values.first_position())
    refuse(caller, "keys start at position " + str(keys.first_position()) +
                       " but values start at " + str(values.first_position()));
  const intervals kp = positions_of(keys), vp = positions_of(values);
  if (!(kp == vp))
    refuse(caller, "keys cover positions " + describe(kp) + " but values cover " + describe(vp));
  if (keys.head_dim() > max_head_dim)
    refuse(caller,
           "head_dim " + str(keys.head_dim()) + " exceeds max_head_dim " + str(max_head_dim));
}

/// q_heads after checking query against kv_heads and head_dim of a non-empty window.
std::size_t check_query(std::string_view caller, std::span<const float> query, std::size_t kv_heads,
                        std::size_t dim) {
  if (query.empty() || query.size() % dim != 0)
    refuse(caller, "query has " + str(query.size()) +
                       " floats, not a positive multiple of head_dim " + str(dim));
  const std::size_t q_heads = query.size() / dim;
  if (q_heads % kv_heads != 0)
    refuse(caller, "q_heads " + str(q_heads) + " (query " + str(query.size()) + " / head_dim " +
                       str(dim) + ") is not a multiple of kv_heads " + str(kv_heads));
  return q_heads;
}

/// head_dim of a state after checking that its spans agree (0 for a state of no heads).
std::size_t check_state(std::string_view caller, std::string_view name, const softmax_state& s) {
  const std::size_t heads = s.max.size();
  if (s.sum.size() != heads || (heads == 0 ? !s.acc.empty() : s.acc.size() % heads != 0))
    refuse(caller, std::string(name) + " has max[" + str(heads) + "], sum[" + str(s.sum.size()) +
                       "], acc[" + str(s.acc.size()) +
                       "]; expected [q_heads], [q_heads], [q_heads * head_dim]");
  return heads == 0 ? 0 : s.acc.size() / heads;
}

/// The kernels' element type of `t` (the element family's row loader, rows-inl.h).
simd::element element_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32:
      return simd::element::f32;
    case dtype::f16:
      return simd::element::f16;
    case dtype::bf16:
      return simd::element::bf16;
    case dtype::fp8_e4m3:
      return simd::element::fp8_e4m3;
  }
  return simd::element::f32;  // unreachable: every dtype has its case
}

simd::window window_of(const windowed_kv& w) {
  simd::window out;
  out.type = element_of(w.type());
  for (std::size_t i = 0; i < w.runs().size(); ++i) {
    const tensor_view& v = w.runs()[i];
    out.runs[i] = {v.data(), v.head_stride() * v.element_bytes(),
                   v.position_stride() * v.element_bytes(), w.run_first_position(i), v.positions()};
  }
  out.run_count = w.runs().size();
  return out;
}

/// The kernels' view of a step, how its rows are read not yet planned (plan_reads); O(runs).
simd::problem view_of(std::span<const float> query, const windowed_kv& keys,
                      const windowed_kv& values, float scale) {
  simd::problem p;
  p.query = query.data();
  p.keys = window_of(keys);
  p.values = window_of(values);
  p.head_dim = keys.head_dim();
  p.kv_heads = keys.heads();
  p.q_heads = query.size() / p.head_dim;
  p.scale = scale;
  return p;
}

/// view_of with its reads planned for one thread (a step the caller's thread runs); O(runs).
simd::problem problem_of(std::span<const float> query, const windowed_kv& keys,
                         const windowed_kv& values, float scale) {
  simd::problem p = view_of(query, keys, values, scale);
  simd::plan_reads(p, 1);
  return p;
}

simd::state state_of(const softmax_state& s) { return {s.max.data(), s.sum.data(), s.acc.data()}; }

}  // namespace

float check_scale(std::string_view caller, float scale, std::size_t head_dim) {
  if (!std::isfinite(scale) || scale < 0.0f)
    refuse(caller, "scale " + std::to_string(scale) +
                       " must be finite and >= 0 (0 means 1/sqrt(head_dim))");
  return scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(head_dim)) : scale;
}

void check_sinks(std::string_view caller, std::span<const float> sinks, std::size_t q_heads) {
  if (!sinks.empty() && sinks.size() != q_heads)
    refuse(caller, "sinks has " + str(sinks.size()) +
                       " values; expected none or q_heads = " + str(q_heads));
  for (std::size_t i = 0; i < sinks.size(); ++i)
    if (std::isnan(sinks[i])) refuse(caller, "sinks[" + str(i) + "] is NaN");
}

std::string_view target_name() { return simd::target_name(); }

float dot(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    refuse("ringkv::kernels::dot", "a has " + str(a.size()) + " floats but b has " + str(b.size()));
  return simd::dot(a.data(), b.data(), a.size());
}

float check_decode(std::string_view caller, std::span<const float> query, const windowed_kv& keys,
                   const windowed_kv& values, std::span<const float> out, float scale,
                   std::span<const float> sinks) {
  if (keys.empty() && values.empty())
    refuse(caller, "the window is empty (a decode step attends at least one position)");
  check_windows(caller, keys, values);
  return check_step(caller, query, keys.heads(), keys.head_dim(), out, scale, sinks);
}

float check_step(std::string_view caller, std::span<const float> query, std::size_t kv_heads,
                 std::size_t head_dim, std::span<const float> out, float scale,
                 std::span<const float> sinks) {
  const std::size_t q_heads = check_query(caller, query, kv_heads, head_dim);
  if (out.size() != query.size())
    refuse(caller, "out has " + str(out.size()) + " floats but query has " + str(query.size()) +
                       " (q_heads * head_dim)");
  if (overlaps(out, query)) refuse(caller, "out overlaps query");
  if (overlaps(out, sinks)) refuse(caller, "out overlaps sinks");
  check_sinks(caller, sinks, q_heads);
  return check_scale(caller, scale, head_dim);
}

void decode(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
            std::span<float> out, float scale, std::span<const float> sinks) {
  const float s = check_decode("ringkv::kernels::decode", query, keys, values, out, scale, sinks);
  simd::decode(problem_of(query, keys, values, s), sinks.empty() ? nullptr : sinks.data(),
               out.data());
}

std::size_t split_scratch_floats(std::size_t q_heads, std::size_t head_dim,
                                 std::size_t positions) noexcept {
  return simd::split_scratch_floats(q_heads, head_dim, positions);
}

void decode(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
            std::span<float> out, float scale, std::span<const float> sinks, thread_pool& pool,
            std::span<float> scratch) {
  constexpr std::string_view caller = "ringkv::kernels::decode";
  const float s = check_decode(caller, query, keys, values, out, scale, sinks);
  const std::size_t q_heads = query.size() / keys.head_dim();
  const std::size_t need = split_scratch_floats(q_heads, keys.head_dim(), keys.length());
  if (scratch.size() < need)
    refuse(caller, "scratch has " + str(scratch.size()) + " floats; split_scratch_floats(" +
                       str(q_heads) + ", " + str(keys.head_dim()) + ", " + str(keys.length()) +
                       ") = " + str(need) + " needed");
  if (overlaps(scratch, out) || overlaps(scratch, query) || overlaps(scratch, sinks))
    refuse(caller, "scratch overlaps out, query or sinks");
  simd::problem p = view_of(query, keys, values, s);  // reads planned once the split is known
  const float* sink_logits = sinks.empty() ? nullptr : sinks.data();
  const simd::split_plan plan = simd::plan_split(p, pool.size(), scratch.size());
  simd::plan_reads(p, std::min(pool.size(), plan.tasks));
  if (plan.tasks == 1) {
    simd::decode(p, sink_logits, out.data());
    return;
  }
  pool.parallel_for(plan.tasks, [&](std::size_t task) {
    simd::run_split_task(p, plan, task, sink_logits, out.data(), scratch.data());
  });
  simd::finish_split(p, plan, sink_logits, out.data(), scratch.data());
}

std::size_t prefill_scratch_floats(std::size_t q_heads, std::size_t kv_heads, std::size_t head_dim,
                                   std::size_t threads) noexcept {
  simd::prefill_problem p;
  p.step.q_heads = q_heads;
  p.step.kv_heads = kv_heads;
  p.step.head_dim = head_dim;
  return simd::prefill_task_floats(p) * std::max<std::size_t>(threads, 1);
}

void prefill(std::span<const float> queries, std::size_t tokens, const windowed_kv& keys,
             const windowed_kv& values, const chunk_window& at, std::span<float> out, float scale,
             std::span<const float> sinks, thread_pool* pool, std::span<float> scratch) {
  constexpr std::string_view caller = "ringkv::kernels::prefill";
  if (tokens == 0 || queries.size() % tokens != 0)
    refuse(caller, "queries has " + str(queries.size()) + " floats for " + str(tokens) +
                       " tokens; expected tokens (> 0) * q_heads * head_dim");
  if (out.size() != queries.size())
    refuse(caller, "out has " + str(out.size()) + " floats but queries has " + str(queries.size()));
  if (overlaps(out, queries)) refuse(caller, "out overlaps queries");
  const std::size_t q_row = queries.size() / tokens;
  const float s =
      check_decode(caller, queries.first(q_row), keys, values, out.first(q_row), scale, sinks);
  if (at.window == 0 || (at.keep > 0 && at.keep >= at.window))
    refuse(caller,
           "window " + str(at.window) + " must be positive and exceed keep " + str(at.keep));
  // Every position a query sees: [0, S) and [from, last] for the first query's rolling start.
  const std::size_t last = at.first + tokens - 1;
  const std::size_t from = at.first + 1 > at.window ? at.first + 1 - (at.window - at.keep) : 0;
  const intervals held = positions_of(keys);
  const auto holds = [&](std::size_t lo, std::size_t hi) {
    return lo >= hi || std::any_of(held.at.begin(), held.at.begin() + held.count,
                                   [&](auto iv) { return iv.first <= lo && hi <= iv.second; });
  };
  if (!holds(from, last + 1) || (from > 0 && !holds(0, std::min(at.keep, last + 1))))
    refuse(caller, "keys cover positions " + describe(held) + "; queries at " + str(at.first) +
                       " … " + str(last) + " see [" + str(from) + ", " + str(last + 1) +
                       ") and the " + str(at.keep) + " kept ones");
  simd::prefill_problem p;
  p.step = view_of(queries.first(q_row), keys, values, s);
  p.tokens = tokens;
  p.first = at.first;
  p.window = at.window;
  p.keep = at.keep;
  const std::size_t threads = pool ? pool->size() : 1;
  const std::size_t per_task = simd::prefill_task_floats(p);
  if (scratch.size() < per_task * threads)
    refuse(caller, "scratch has " + str(scratch.size()) +
                       " floats; prefill_scratch_floats = " + str(per_task * threads) + " needed");
  if (reinterpret_cast<std::uintptr_t>(scratch.data()) % 64 != 0)
    refuse(caller, "scratch is not 64-byte aligned");
  if (overlaps(scratch, out) || overlaps(scratch, queries) || overlaps(scratch, sinks))
    refuse(caller, "scratch overlaps out, queries or sinks");
  const simd::prefill_plan plan = simd::plan_prefill(p);
  // kv head major: a thread's tiles of one kv head read rows the previous tile left in cache.
  const std::size_t items = plan.tiles * p.step.kv_heads, tasks = std::min(threads, items);
  const float* sink_logits = sinks.empty() ? nullptr : sinks.data();
  const auto run = [&](std::size_t task) {
    for (std::size_t item = task; item < items; item += tasks)
      simd::attend_tile(p, simd::tile_of(plan, item % plan.tiles), item / plan.tiles, sink_logits,
                        out.data(), scratch.data() + task * per_task);
  };
  if (tasks > 1)
    pool->parallel_for(tasks, run);
  else
    run(0);
}

void clear(const softmax_state& s) {
  check_state("ringkv::kernels::clear", "s", s);
  for (float& m : s.max) m = -std::numeric_limits<float>::infinity();
  for (float& x : s.sum) x = 0.0f;
  for (float& x : s.acc) x = 0.0f;
}

void attend(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
            float scale, std::size_t from, std::size_t to, const softmax_state& s) {
  constexpr std::string_view caller = "ringkv::kernels::attend";
  check_windows(caller, keys, values);
  if (from > to) refuse(caller, "from " + str(from) + " is after to " + str(to));
  if (keys.empty()) {
    check_scale(caller, scale, 1);
    return;
  }
  const std::size_t q_heads = check_query(caller, query, keys.heads(), keys.head_dim());
  const float resolved = check_scale(caller, scale, keys.head_dim());
  if (s.max.size() != q_heads || check_state(caller, "s", s) != keys.head_dim())
    refuse(caller, "s has max[" + str(s.max.size()) + "], acc[" + str(s.acc.size()) +
                       "]; expected max[" + str(q_heads) + "], acc[" + str(query.size()) + "]");
  simd::attend(problem_of(query, keys, values, resolved), from, to, state_of(s));
}

void merge(const softmax_state& into, const softmax_state& from) {
  constexpr std::string_view caller = "ringkv::kernels::merge";
  const std::size_t dim = check_state(caller, "into", into);
  check_state(caller, "from", from);
  if (from.max.size() != into.max.size() || from.acc.size() != into.acc.size())
    refuse(caller, "into is [" + str(into.max.size()) + " heads, " + str(into.acc.size()) +
                       " acc] but from is [" + str(from.max.size()) + " heads, " +
                       str(from.acc.size()) + " acc]");
  simd::merge(into.max.size(), dim, state_of(into), state_of(from));
}

void finish(const softmax_state& s, std::span<const float> sinks, std::span<float> out) {
  constexpr std::string_view caller = "ringkv::kernels::finish";
  const std::size_t dim = check_state(caller, "s", s);
  if (out.size() != s.acc.size())
    refuse(caller, "out has " + str(out.size()) + " floats but s.acc has " + str(s.acc.size()));
  check_sinks(caller, sinks, s.max.size());
  if (overlaps(out, sinks)) refuse(caller, "out overlaps sinks");
  simd::finish(s.max.size(), dim, state_of(s), sinks.empty() ? nullptr : sinks.data(), out.data());
}

}  // namespace ringkv::kernels
