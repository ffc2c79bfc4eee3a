// default_kv_cache_store: preallocated [kv_heads][capacity][head_dim] buffers per layer and side,
// dense or a ring with pinned sinks; windows are views of those buffers.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include "half.hpp"
module ringkv.store;

namespace ringkv {
namespace {
std::string str(std::size_t n) { return std::to_string(n); }

void check_options(const kv_cache_config& c, const store_options& o) {
  const std::string who = "ringkv::default_kv_cache_store: ";
  if (!o.sliding_window) {
    // A dense store never overwrites, so there is nothing to pin and nothing to reserve.
    if (o.keep != 0)
      throw std::invalid_argument(who + "keep " + str(o.keep) + " needs sliding_window = true");
    if (o.slack != 0)
      throw std::invalid_argument(who + "slack " + str(o.slack) + " needs sliding_window = true");
  } else if (o.keep + o.slack >= c.capacity) {
    throw std::invalid_argument(who + "keep " + str(o.keep) + " + slack " + str(o.slack) +
                                " must be < capacity " + str(c.capacity) +
                                " (the attention window needs at least one rolling slot)");
  }
}

// Elements per side per layer, refusing a size that does not fit in memory's address space.
std::size_t side_elements(const kv_cache_config& c) {
  std::size_t n = 0;
  if (__builtin_mul_overflow(c.kv_heads, c.capacity, &n) ||
      __builtin_mul_overflow(n, c.head_dim, &n) || __builtin_mul_overflow(n, std::size_t{4}, &n))
    throw std::invalid_argument("ringkv::default_kv_cache_store: kv_heads * capacity * head_dim "
                                "overflows size_t");
  return n / 4;
}

void store_elements(std::byte* dst, const float* src, std::size_t n, dtype type) noexcept {
  if (type == dtype::f32) {
    std::memmove(dst, src, n * sizeof(float));  // the caller may pass a row of this very slot
    return;
  }
  const bool half = type == dtype::f16;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t bits = half ? detail::f32_to_f16(src[i]) : detail::f32_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &bits, 2);
  }
}

void load_elements(float* dst, const std::byte* src, std::size_t n, dtype type) noexcept {
  if (type == dtype::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const bool half = type == dtype::f16;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    dst[i] = half ? detail::f16_to_f32(bits) : detail::bf16_to_f32(bits);
  }
}
}  // namespace

default_kv_cache_store::default_kv_cache_store(kv_cache_config config, store_options options,
                                               trace::sink& sink)
    : kv_cache_store(sink), config_(config), options_(options), ring_slots_(0) {
  config_.validate();
  check_options(config_, options_);
  ring_slots_ = config_.capacity - options_.keep;
  const std::size_t elements = side_elements(config_);
  layers_.reserve(config_.layers);
  for (std::size_t l = 0; l < config_.layers; ++l)
    layers_.push_back(layer_state{
        storage(elements * size_of(config_.key_type), "kv-cache-keys", sink),
        storage(elements * size_of(config_.value_type), "kv-cache-values", sink)});
}

std::size_t default_kv_cache_store::slot_of(std::size_t position) const noexcept {
  if (!options_.sliding_window || position < options_.keep) return position;
  return options_.keep + (position - options_.keep) % ring_slots_;
}

std::size_t default_kv_cache_store::length(std::size_t layer) const {
  check_layer("default_kv_cache_store::length", layer);
  return layers_[layer].length;
}

std::size_t default_kv_cache_store::window_start(std::size_t layer) const {
  check_layer("default_kv_cache_store::window_start", layer);
  return layers_[layer].window_start;
}

const storage& default_kv_cache_store::key_storage(std::size_t layer) const {
  check_layer("default_kv_cache_store::key_storage", layer);
  return layers_[layer].keys;
}

const storage& default_kv_cache_store::value_storage(std::size_t layer) const {
  check_layer("default_kv_cache_store::value_storage", layer);
  return layers_[layer].values;
}

std::size_t default_kv_cache_store::append(std::size_t layer, std::span<const float> key,
                                           std::span<const float> value) {
  const char* who = "default_kv_cache_store::append";
  check_layer(who, layer);
  const std::size_t row = config_.row_floats();
  for (const auto& [name, span] : {std::pair{"key", key}, std::pair{"value", value}})
    if (span.size() != row)
      throw std::invalid_argument(std::string("ringkv::") + who + ": " + name + " has " +
                                  str(span.size()) + " floats, expected kv_heads * head_dim = " +
                                  str(row));
  layer_state& s = layers_[layer];
  const std::size_t p = s.length;
  if (!options_.sliding_window && p == config_.capacity)
    throw cache_full(std::string("ringkv::") + who + ": layer " + str(layer) + " is full (length " +
                     str(p) + " = capacity " + str(config_.capacity) +
                     "); a ring (store_options::sliding_window) overwrites instead");

  const std::size_t slot = slot_of(p), d = config_.head_dim;
  const std::size_t head_stride = config_.capacity * d;
  const std::size_t kb = size_of(config_.key_type), vb = size_of(config_.value_type);
  for (std::size_t h = 0; h < config_.kv_heads; ++h) {
    const std::size_t at = h * head_stride + slot * d;
    store_elements(s.keys.data() + at * kb, key.data() + h * d, d, config_.key_type);
    store_elements(s.values.data() + at * vb, value.data() + h * d, d, config_.value_type);
  }
  if (options_.sliding_window && p >= options_.keep) {
    // The rolling part holds at most ring_slots_ positions: a full one just lost its oldest.
    const std::size_t rolling_start = std::max(s.window_start, options_.keep);
    if (p - rolling_start == ring_slots_) s.window_start = rolling_start + 1;
  }
  s.length = p + 1;
  return p;
}

void default_kv_cache_store::truncate(std::size_t layer, std::size_t new_length) {
  const char* who = "default_kv_cache_store::truncate";
  check_layer(who, layer);
  layer_state& s = layers_[layer];
  if (new_length > s.length)
    throw std::out_of_range(std::string("ringkv::") + who + ": new_length " + str(new_length) +
                            " > length " + str(s.length) + " of layer " + str(layer) +
                            " (truncate only rolls back)");
  const std::size_t keep = options_.keep;
  // The token appended next sits at new_length; its rolling keys before it must still be held.
  const std::size_t need_from =
      std::min(std::max(keep, query_window(new_length).from), new_length);
  if (!holds(layer, need_from, new_length))
    throw std::out_of_range(
        std::string("ringkv::") + who + ": new_length " + str(new_length) + " of layer " +
        str(layer) + " needs positions [" + str(need_from) + ", " + str(new_length) +
        ") for the next token's window (W " + str(attention_window()) + ", keep " + str(keep) +
        ") but window_start is " + str(s.window_start) + " (length " + str(s.length) +
        ", slack " + str(options_.slack) + ")");
  s.length = new_length;
  // Positions >= new_length are forgotten; overwritten ones before window_start stay lost.
  s.window_start = new_length <= keep ? 0 : std::min(s.window_start, new_length);
}

void default_kv_cache_store::clear() noexcept {
  for (layer_state& s : layers_) s.length = s.window_start = 0;
}

void default_kv_cache_store::clear(std::size_t layer) {
  check_layer("default_kv_cache_store::clear", layer);
  layers_[layer].length = layers_[layer].window_start = 0;
}

memory_report default_kv_cache_store::memory() const {
  memory_report r;
  std::size_t rows = 0;
  for (std::size_t l = 0; l < config_.layers; ++l) rows += held(l);
  const std::size_t logical = rows * config_.row_floats() * sizeof(float);
  for (const layer_state& s : layers_) {
    r.keys.physical_bytes += s.keys.bytes();
    r.values.physical_bytes += s.values.bytes();
  }
  r.keys.logical_bytes = r.values.logical_bytes = logical;
  r.physical_bytes = r.keys.physical_bytes + r.values.physical_bytes;
  r.logical_bytes = 2 * logical;
  const double full_f32 =
      2.0 * double(config_.layers) * double(side_elements(config_)) * sizeof(float);
  r.compression_ratio = full_f32 / double(r.physical_bytes);
  return r;
}

void default_kv_cache_store::add_range(physical_runs& out, const storage& side, dtype type,
                                       position_range r) const {
  const std::size_t d = config_.head_dim, row_bytes = d * size_of(type);
  auto push = [&](std::size_t first_position, std::size_t slot, std::size_t count) {
    // const_cast: windows are read-only by contract; tensor_view carries a mutable pointer.
    std::byte* data = const_cast<std::byte*>(side.data()) + slot * row_bytes;
    if (out.count > 0) {
      kv_run& last = out.runs[out.count - 1];
      const std::size_t n = last.view.positions();
      if (last.first_position + n == first_position && last.view.data() + n * row_bytes == data) {
        last.view = tensor_view(last.view.data(), type, config_.kv_heads, n + count, d,
                                config_.capacity * d, d);
        return;
      }
    }
    out.runs[out.count++] =
        kv_run{tensor_view(data, type, config_.kv_heads, count, d, config_.capacity * d, d),
               first_position};
  };
  const std::size_t pinned_end = std::min(r.to, options_.keep);
  std::size_t p = r.from;
  if (p < pinned_end) {
    push(p, p, pinned_end - p);
    p = pinned_end;
  }
  while (p < r.to) {  // at most twice for a held range: up to the ring's end, then from its start
    const std::size_t slot = slot_of(p);
    const std::size_t count = std::min(r.to - p, config_.capacity - slot);
    push(p, slot, count);
    p += count;
  }
}

default_kv_cache_store::physical_runs default_kv_cache_store::runs_of(
    const storage& side, dtype type, std::array<position_range, 2> ranges) const {
  physical_runs out;
  for (const position_range& r : ranges)
    if (!r.empty()) add_range(out, side, type, r);
  return out;
}

windowed_kv default_kv_cache_store::window(kv_side side, std::size_t layer, std::size_t from,
                                           std::size_t to) const {
  const bool keys = side == kv_side::keys;
  check_range(keys ? "default_kv_cache_store::key_window" : "default_kv_cache_store::value_window",
              layer, from, to);
  const layer_state& s = layers_[layer];
  const physical_runs runs =
      runs_of(keys ? s.keys : s.values, keys ? config_.key_type : config_.value_type,
              window_positions(from, to));
  return windowed_kv(std::span<const kv_run>(runs.runs.data(), runs.count));
}

windowed_kv default_kv_cache_store::key_window(std::size_t layer, std::size_t from,
                                               std::size_t to) const {
  return window(kv_side::keys, layer, from, to);
}

windowed_kv default_kv_cache_store::value_window(std::size_t layer, std::size_t from,
                                                 std::size_t to) const {
  return window(kv_side::values, layer, from, to);
}

windowed_kv default_kv_cache_store::key_window(std::size_t layer, std::size_t from, std::size_t to,
                                               scope&) const {
  return window(kv_side::keys, layer, from, to);
}

windowed_kv default_kv_cache_store::value_window(std::size_t layer, std::size_t from,
                                                 std::size_t to, scope&) const {
  return window(kv_side::values, layer, from, to);
}

void default_kv_cache_store::read(kv_side side, const char* who, std::size_t layer,
                                  std::size_t from, std::size_t to, std::span<float> out) const {
  check_range(who, layer, from, to);
  const std::size_t d = config_.head_dim, count = to - from;
  if (out.size() != config_.kv_heads * count * d)
    throw std::invalid_argument(std::string("ringkv::") + who + ": out has " + str(out.size()) +
                                " floats, expected kv_heads * (to - from) * head_dim = " +
                                str(config_.kv_heads * count * d));
  const bool keys = side == kv_side::keys;
  const dtype type = keys ? config_.key_type : config_.value_type;
  physical_runs runs;
  add_range(runs, keys ? layers_[layer].keys : layers_[layer].values, type, {from, to});
  for (std::size_t h = 0; h < config_.kv_heads; ++h) {
    float* dst = out.data() + h * count * d;
    for (std::size_t i = 0; i < runs.count; ++i) {
      const tensor_view& v = runs.runs[i].view;
      load_elements(dst, v.row_bytes(h, 0), v.positions() * d, type);
      dst += v.positions() * d;
    }
  }
}

void default_kv_cache_store::read_keys(std::size_t layer, std::size_t from, std::size_t to,
                                       std::span<float> out) const {
  read(kv_side::keys, "default_kv_cache_store::read_keys", layer, from, to, out);
}

void default_kv_cache_store::read_values(std::size_t layer, std::size_t from, std::size_t to,
                                         std::span<float> out) const {
  read(kv_side::values, "default_kv_cache_store::read_values", layer, from, to, out);
}

}  // namespace ringkv
