// windowed_attention::prefill: the chunk's queries attend the store's runs (as they lie in the
// ring) followed by the chunk's own rows, through the tiled kernel (kernels::prefill), which keeps
// decode's arithmetic per query, so prefill and token-by-token decode give the same bits; the
// chunk is appended only after every output is computed.
module;
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

module ringkv.attention;

namespace ringkv {
namespace {

constexpr std::string_view who = "ringkv::windowed_attention::prefill";

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument(std::string(who) + ": " + what);
}

std::string str(std::size_t n) { return std::to_string(n); }

/// The chunk's rows as the store holds them: the caller's f32 rows in place, or rounded once
/// to the store's element type in `arena` (a copy on the kernels' path: adapter_inserted
/// {"round-chunk-rows", target, bytes} to `sink`). [kv_heads, tokens, head_dim], positions from
/// `first`.
template <class Arena>
tensor_view chunk_view(std::span<const float> rows, dtype type, const kv_cache_config& c,
                       std::size_t tokens, Arena&& arena, trace::sink& sink,
                       std::string_view target) {
  if (type == dtype::f32)  // read only: the kernels never write through a window
    return tensor_view(const_cast<std::byte*>(reinterpret_cast<const std::byte*>(rows.data())),
                       dtype::f32, c.kv_heads, tokens, c.head_dim, c.head_dim, c.row_floats());
  const tensor_view v = arena().allocate_view(type, tokens, c.kv_heads, c.head_dim);
  traits_of(type).encode(v.data(), rows.data(), rows.size());
  if (sink.enabled()) sink.emit(trace::adapter_inserted{"round-chunk-rows", target, v.bytes()});
  // allocate_view lays rows out [tokens][kv_heads][head_dim]: read it as [kv_heads][tokens].
  return tensor_view(v.data(), type, c.kv_heads, tokens, c.head_dim, c.head_dim, c.row_floats());
}

/// The positions the token at p sees: the sinks [0, keep) when its rolling part starts past
/// them, then [from, p + 1).
std::array<position_range, 2> seen(std::size_t p, std::size_t window, std::size_t keep) {
  const std::size_t from = detail::window_from(p, window, keep);
  if (from > 0 && keep > 0) return {position_range{0, keep}, position_range{from, p + 1}};
  return {position_range{from, p + 1}, position_range{}};
}

/// Adds to runs[n] the part of `run` (first position `first`) inside each range of `seen`.
void add_seen(const tensor_view& run, std::size_t first, const std::array<position_range, 2>& seen,
              std::array<kv_run, windowed_kv::max_runs>& runs, std::size_t& n) {
  for (const position_range& r : seen) {
    const std::size_t lo = std::max(first, r.from), hi = std::min(first + run.positions(), r.to);
    if (lo < hi) runs[n++] = kv_run{run.slice(lo - first, hi - lo), lo};
  }
}

/// Token p's window: the store's runs (`held`, the first token's store part, which holds every
/// later token's) and the chunk rows, each cut to what p sees.
windowed_kv token_window(const windowed_kv& held, const tensor_view& chunk, std::size_t length,
                         const std::array<position_range, 2>& seen) {
  std::array<kv_run, windowed_kv::max_runs> runs{};
  std::size_t n = 0;
  for (std::size_t i = 0; i < held.runs().size(); ++i)
    add_seen(held.runs()[i], held.run_first_position(i), seen, runs, n);
  add_seen(chunk, length, seen, runs, n);
  return windowed_kv(std::span<const kv_run>(runs.data(), n));
}

/// The store's part of the first token's window (every later token sees a subset of it; with
/// a window of keep + 1, only the sinks) as the store exposes it (detail::stored_windows).
std::optional<std::array<windowed_kv, 2>> held_windows(const kv_cache_store& store,
                                                       std::size_t layer, std::size_t window) {
  const std::size_t length = store.length(layer), keep = store.options().keep;
  const std::size_t from = std::min(detail::window_from(length, window, keep), length);
  return detail::stored_windows(store, layer, from, length);
}

}  // namespace

detail::chunk_shape detail::check_chunk(const kv_cache_store& store, std::size_t layer,
                                        std::span<const float> queries, std::span<const float> keys,
                                        std::span<const float> values, std::span<const float> out,
                                        const prefill_options& o) {
  const kv_cache_config c = store.config();
  detail::chunk_shape s;
  s.window = detail::check_store(store, layer, o.window, who);
  s.kv_row = c.row_floats();
  if (keys.size() % s.kv_row != 0)
    refuse("keys has " + str(keys.size()) +
           " floats, not a multiple of kv_heads * head_dim = " + str(s.kv_row));
  if (values.size() != keys.size())
    refuse("values has " + str(values.size()) + " floats but keys has " + str(keys.size()));
  s.tokens = keys.size() / s.kv_row;
  if (out.size() != queries.size())
    refuse("out has " + str(out.size()) + " floats but queries has " + str(queries.size()));
  if (s.tokens == 0) {
    if (!queries.empty()) refuse("queries has " + str(queries.size()) + " floats for 0 tokens");
    return s;
  }
  if (queries.size() % s.tokens != 0)
    refuse("queries has " + str(queries.size()) + " floats for " + str(s.tokens) +
           " tokens; expected tokens * q_heads * head_dim");
  s.q_row = queries.size() / s.tokens;
  for (const auto& [name, in] : {std::pair{"queries", queries}, std::pair{"keys", keys},
                                 std::pair{"values", values}, std::pair{"sinks", o.sinks}})
    if (overlaps(out, in)) refuse(std::string("out overlaps ") + name);
  // One row's query/out/sinks/scale checks stand for all rows (they share the geometry).
  s.scale = kernels::check_step(who, queries.first(s.q_row), c.kv_heads, c.head_dim,
                                out.first(s.q_row), o.scale, o.sinks);
  // These add the "ringkv::" of who themselves.
  const std::string_view name = who.substr(std::string_view("ringkv::").size());
  require_finite(name, "queries", queries);
  require_finite(name, "keys", keys);
  require_finite(name, "values", values);
  require_storable(name, "keys", keys, c.key_type);
  require_storable(name, "values", values, c.value_type);
  const std::size_t length = store.length(layer);
  if (!store.options().sliding_window && length + s.tokens > c.capacity)
    throw cache_full(std::string(who) + ": layer " + str(layer) + " holds " + str(length) + " of " +
                     str(c.capacity) + " positions; a chunk of " + str(s.tokens) +
                     " tokens does not fit");
  return s;
}

void windowed_attention::prefill(kv_cache_store& store, std::size_t layer,
                                 std::span<const float> queries, std::span<const float> keys,
                                 std::span<const float> values, std::span<float> out,
                                 const prefill_options& options) const {
  const detail::chunk_shape s =
      detail::check_chunk(store, layer, queries, keys, values, out, options);
  if (s.tokens == 0) return;
  std::optional<scope> local;  // made only if needed: an f32 prefill allocates nothing
  const auto arena = [&]() -> scope& {
    return options.arena ? *options.arena : local ? *local : local.emplace(64, *sink_);
  };
  const std::size_t length = store.length(layer), keep = store.options().keep;
  const kv_cache_config c = store.config();
  const auto stored = held_windows(store, layer, s.window);
  const std::size_t read = queries.size_bytes() + keys.size_bytes() + values.size_bytes();
  detail::traced(*sink_, "attention.prefill", read, out.size_bytes(), [&] {
    if (!stored || (*stored)[0].family() != kernel_family::elements) {
      // Codes, or rows the store does not expose: the decode stream's own loop, token by token;
      // a store whose windows copy gets an arena sized at once for the full window's copies.
      if (!stored && !options.arena) local.emplace(detail::window_copy_bytes(c, s.window), *sink_);
      for (std::size_t i = 0; i < s.tokens; ++i)
        detail::append_and_attend(
            store, layer, s.window,
            {queries.subspan(i * s.q_row, s.q_row), keys.subspan(i * s.kv_row, s.kv_row),
             values.subspan(i * s.kv_row, s.kv_row), out.subspan(i * s.q_row, s.q_row), s.scale,
             options.sinks},
            *this, stored ? nullptr : &arena());
      return;
    }
    const auto& [held_k, held_v] = *stored;
    const tensor_view chunk_k = chunk_view(keys, c.key_type, c, s.tokens, arena, *sink_, "keys");
    const tensor_view chunk_v =
        chunk_view(values, c.value_type, c, s.tokens, arena, *sink_, "values");
    if (!scratch_busy_.test_and_set(std::memory_order_acquire)) {
      // The tiled kernel, with this object's scratch (grown once, then reused).
      struct release {
        std::atomic_flag& busy;
        ~release() { busy.clear(std::memory_order_release); }
      } const held{scratch_busy_};
      const std::size_t floats = kernels::prefill_scratch_floats(
          s.q_row / c.head_dim, c.kv_heads, c.head_dim, pool_ ? pool_->size() : 1);
      if (scratch_.bytes() < floats * sizeof(float))
        scratch_ = storage(floats * sizeof(float), "prefill-scratch", *sink_);
      std::array<position_range, 2> all = seen(length, s.window, keep);
      (all[1].to != 0 ? all[1] : all[0]).to = length + s.tokens;  // up to the last query
      kernels::prefill(queries, s.tokens, token_window(held_k, chunk_k, length, all),
                       token_window(held_v, chunk_v, length, all), {length, s.window, keep}, out,
                       s.scale, options.sinks, pool_, scratch_.as<float>());
    } else {
      // Another thread's step holds the scratch: each query its own decode (stack scratch),
      // the same bits, on this thread.
      for (std::size_t i = 0; i < s.tokens; ++i) {
        const auto window = seen(length + i, s.window, keep);
        kernels::decode(queries.subspan(i * s.q_row, s.q_row),
                        token_window(held_k, chunk_k, length, window),
                        token_window(held_v, chunk_v, length, window),
                        out.subspan(i * s.q_row, s.q_row), s.scale, options.sinks);
      }
    }
    for (std::size_t i = 0; i < s.tokens; ++i)
      store.append(layer, keys.subspan(i * s.kv_row, s.kv_row),
                   values.subspan(i * s.kv_row, s.kv_row));
  });
}

}  // namespace ringkv
