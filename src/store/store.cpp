// The parts of ringkv.store every store shares: the checked configuration, the held-position
// rules, and the defaulted (copying, traced) windows.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
module ringkv.store;

namespace ringkv {
namespace {
std::string str(std::size_t n) { return std::to_string(n); }
}  // namespace

void kv_cache_config::validate() const {
  const std::pair<const char*, std::size_t> sizes[] = {
      {"layers", layers}, {"kv_heads", kv_heads}, {"head_dim", head_dim}, {"capacity", capacity}};
  for (const auto& [name, value] : sizes)
    if (value == 0)
      throw std::invalid_argument(std::string("ringkv::kv_cache_config: ") + name + " must be > 0");
}

void kv_cache_store::check_layer(const char* who, std::size_t layer) const {
  const std::size_t layers = config().layers;
  if (layer >= layers)
    throw std::out_of_range(std::string("ringkv::") + who + ": layer " + str(layer) +
                            " out of range (layers " + str(layers) + ")");
}

void kv_cache_store::check_range(const char* who, std::size_t layer, std::size_t from,
                                 std::size_t to) const {
  check_layer(who, layer);
  const std::size_t n = length(layer), start = window_start(layer), keep = options().keep;
  auto refuse = [&](const std::string& why) {
    throw std::out_of_range(std::string("ringkv::") + who + ": positions [from " + str(from) +
                            ", to " + str(to) + ") of layer " + str(layer) + " " + why +
                            " (window_start " + str(start) + ", length " + str(n) + ", keep " +
                            str(keep) + ")");
  };
  if (from > to) refuse("are reversed: from > to");
  if (to > n) refuse("run past the newest position: to > length");
  // Pinned positions are always held; a rolling position is held from window_start on.
  const std::size_t first_rolling = std::max(from, keep);
  if (first_rolling < to && first_rolling < start)
    refuse("start before the oldest held position (overwritten): " + str(first_rolling) +
           " < window_start");
}

bool kv_cache_store::holds(std::size_t layer, std::size_t from, std::size_t to) const {
  check_layer("kv_cache_store::holds", layer);
  const std::size_t first_rolling = std::max(from, options().keep);
  return from <= to && to <= length(layer) &&
         !(first_rolling < to && first_rolling < window_start(layer));
}

std::size_t kv_cache_store::held(std::size_t layer) const {
  check_layer("kv_cache_store::held", layer);
  const std::size_t n = length(layer), start = window_start(layer);
  return start == 0 ? n : options().keep + (n - start);
}

std::size_t kv_cache_store::attention_window() const {
  const store_options o = options();
  return o.sliding_window ? config().capacity - o.slack : config().capacity;
}

position_range kv_cache_store::query_window(std::size_t position) const {
  const std::size_t w = attention_window(), keep = options().keep;
  // Until the query has W keys counting the sinks, it sees every position up to itself.
  if (position + 1 <= w) return {0, position + 1};
  return {position + 1 - (w - keep), position + 1};
}

std::array<position_range, 2> kv_cache_store::window_positions(std::size_t from,
                                                               std::size_t to) const {
  const std::size_t keep = options().keep;
  if (keep == 0) return {position_range{from, to}, position_range{}};
  if (from <= keep) return {position_range{0, to}, position_range{}};  // sinks run into it
  return {position_range{0, keep}, position_range{from, to}};
}

windowed_kv kv_cache_store::key_window(std::size_t layer, std::size_t from, std::size_t to,
                                       scope& arena) const {
  return copied_window(kv_side::keys, layer, from, to, arena);
}

windowed_kv kv_cache_store::value_window(std::size_t layer, std::size_t from, std::size_t to,
                                         scope& arena) const {
  return copied_window(kv_side::values, layer, from, to, arena);
}

void kv_cache_store::reserve(std::size_t, std::size_t) {}

std::optional<windowed_kv> kv_cache_store::stored_window(kv_side, std::size_t, std::size_t,
                                                         std::size_t) const {
  return std::nullopt;
}

windowed_kv kv_cache_store::copied_window(kv_side side, std::size_t layer, std::size_t from,
                                          std::size_t to, scope& arena) const {
  const char* who =
      side == kv_side::keys ? "kv_cache_store::key_window" : "kv_cache_store::value_window";
  check_range(who, layer, from, to);
  const kv_cache_config c = config();
  std::array<kv_run, 2> runs{};
  std::size_t count = 0, bytes = 0;
  for (const position_range& r : window_positions(from, to)) {
    if (r.empty()) continue;
    const tensor_view view = arena.allocate_view(dtype::f32, c.kv_heads, r.size(), c.head_dim);
    const std::span<float> out(reinterpret_cast<float*>(view.data()),
                               c.kv_heads * r.size() * c.head_dim);
    if (side == kv_side::keys)
      read_keys(layer, r.from, r.to, out);
    else
      read_values(layer, r.from, r.to, out);
    runs[count++] = kv_run{view, r.from};
    bytes += view.bytes();
  }
  if (count > 0 && sink().enabled())
    sink().emit(
        trace::adapter_inserted{copy_kind(), side == kv_side::keys ? "keys" : "values", bytes});
  return windowed_kv(std::span<const kv_run>(runs.data(), count));
}

}  // namespace ringkv
