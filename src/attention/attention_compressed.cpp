// compressed_kv_attention: checks compressed windows, describes them to the Highway kernel
// (quant_simd.h) and calls it once per step.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "quant/quant_codec.h"
#include "kernels/quant/quant_simd.h"
module ringkv.attention;

namespace ringkv {
namespace {

static_assert(compressed_kv_attention::max_head_dim == simd::max_compressed_head_dim);

constexpr std::string_view step_name = "ringkv::compressed_kv_attention::decode_step";

std::string str(std::size_t n) { return std::to_string(n); }

// The window's positions as maximal intervals (adjacent runs joined).
std::array<std::pair<std::size_t, std::size_t>, compressed_window::max_runs> intervals(
    const compressed_window& w, std::size_t& count) {
  std::array<std::pair<std::size_t, std::size_t>, compressed_window::max_runs> out{};
  count = 0;
  for (std::size_t i = 0; i < w.run_count(); ++i) {
    const std::size_t first = w.run_first_position(i), end = first + w.run_positions(i);
    if (count > 0 && out[count - 1].second == first)
      out[count - 1].second = end;
    else
      out[count++] = {first, end};
  }
  return out;
}

void check_windows(std::string_view caller, const compressed_window& keys,
                   const compressed_window& values) {
  const auto refuse = [caller](const std::string& what) {
    throw std::invalid_argument(std::string(caller) + ": " + what);
  };
  if (!keys.compressed() || !values.compressed())
    refuse(std::string("keys are ") + std::string(traits_of(keys.encoding()).name) +
           " and values " + std::string(traits_of(values.encoding()).name) +
           "; this step reads codes (int8, turboquant) on both sides");
  if (keys.empty() || values.empty())
    refuse("the window is empty (keys hold " + str(keys.length()) + " positions, values " +
           str(values.length()) + "; a decode step attends at least one position)");
  std::size_t nk = 0, nv = 0;
  const auto kp = intervals(keys, nk), vp = intervals(values, nv);
  if (nk != nv || !std::equal(kp.begin(), kp.begin() + nk, vp.begin()))
    refuse("keys cover positions [" + str(keys.first_position()) + ", " + str(keys.end_position()) +
           ") in " + str(nk) + " pieces but values [" + str(values.first_position()) + ", " +
           str(values.end_position()) + ") in " + str(nv) +
           " (they must cover the same positions)");
  if (keys.heads() != values.heads() || keys.head_dim() != values.head_dim())
    refuse("keys are [" + str(keys.heads()) + " heads, head_dim " + str(keys.head_dim()) +
           "] but values are [" + str(values.heads()) + " heads, head_dim " +
           str(values.head_dim()) + "]");
  if (values.format().qjl) refuse("values carry QJL sketches; only keys may");
  const compressed_format &kf = keys.format(), &vf = values.format();
  if (kf.kind == compression::turboquant && !kf.grouped)
    refuse("TurboQuant keys must be in slot groups (compressed_format::grouped)");
  if (vf.grouped || (vf.kind == compression::turboquant && (vf.bits < 2 || vf.bits > 4)))
    refuse("values must be rows of 2- to 4-bit TurboQuant codes or int8 codes");
  if (keys.head_dim() > compressed_kv_attention::max_head_dim)
    refuse("head_dim " + str(keys.head_dim()) + " exceeds max_head_dim " +
           str(compressed_kv_attention::max_head_dim));
}

simd::code_window code_window_of(const compressed_window& w) {
  simd::code_window out;
  out.format = codec::format_of(w.format());
  for (std::size_t i = 0; i < w.code_runs().size(); ++i)
    out.runs[i] = codec::run_of(w.code_runs()[i], w.run_first_position(i));
  out.run_count = w.code_runs().size();
  return out;
}

// How many tasks a step is split into: one a thread, each an even share of the query heads
// (whole kv heads when the threads divide them), none below kernels::min_split_work
// multiply-adds, where handing work to the pool costs about what it saves.
std::size_t tasks(const simd::compressed_problem& p, thread_pool* pool) {
  if (pool == nullptr || pool->size() <= 1) return 1;
  std::size_t positions = 0;
  for (std::size_t r = 0; r < p.keys.run_count; ++r) positions += p.keys.runs[r].count;
  if (p.q_heads * positions * p.head_dim < kernels::min_split_work) return 1;
  return std::min(pool->size(), p.q_heads);
}

}  // namespace

compressed_kv_attention::compressed_kv_attention() noexcept
    : compressed_kv_attention(attention_options{}) {}

compressed_kv_attention::compressed_kv_attention(attention_options options) noexcept
    : sink_(options.sink ? options.sink : &trace::null_sink()), pool_(options.pool) {}

void compressed_kv_attention::decode_step(std::span<const float> query,
                                          const compressed_window& keys,
                                          const compressed_window& values, std::span<float> out,
                                          float scale, std::span<const float> sinks) const {
  const float resolved = detail::check_codes(step_name, query, keys, values, out, scale, sinks);
  simd::compressed_problem p;
  p.query = query.data();
  p.keys = code_window_of(keys);
  p.values = code_window_of(values);
  p.kv_heads = keys.heads();
  p.head_dim = keys.head_dim();
  p.q_heads = query.size() / p.head_dim;
  p.scale = resolved;
  p.q_last = p.q_heads;
  const float* s = sinks.empty() ? nullptr : sinks.data();
  const std::size_t n = tasks(p, pool_);
  detail::traced(*sink_, "attention.compressed_decode_step",
                 keys.bytes() + values.bytes() + query.size_bytes(), out.size_bytes(), [&] {
                   if (n == 1) return simd::compressed_decode(p, s, out.data());
                   pool_->parallel_for(n, [&](std::size_t t) {
                     simd::compressed_problem share = p;
                     share.q_first = t * p.q_heads / n;
                     share.q_last = (t + 1) * p.q_heads / n;
                     simd::compressed_decode(share, s, out.data());
                   });
                 });
}

}  // namespace ringkv

namespace ringkv::detail {

float check_codes(std::string_view caller, std::span<const float> query, const windowed_kv& keys,
                  const windowed_kv& values, std::span<const float> out, float scale,
                  std::span<const float> sinks) {
  check_windows(caller, keys, values);
  const float resolved =
      kernels::check_step(caller, query, keys.heads(), keys.head_dim(), out, scale, sinks);
  // require_finite adds the "ringkv::" of caller itself.
  require_finite(caller.substr(std::string_view("ringkv::").size()), "query", query);
  return resolved;
}

}  // namespace ringkv::detail
