// default_kv_cache_store: preallocated [kv_heads][capacity][head_dim] buffers per layer and side,
// dense or a ring with pinned sinks; windows are views of those buffers.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
module ringkv.store;

namespace ringkv {
default_kv_cache_store::default_kv_cache_store(kv_cache_config config, store_options options,
                                               trace::sink& sink)
    : slotted_kv_cache_store(config, options, "default_kv_cache_store", sink) {
  const kv_cache_config& c = this->config();
  layers_.reserve(c.layers);
  for (std::size_t l = 0; l < c.layers; ++l) {
    layer_buffers b{storage(side_elements() * size_of(c.key_type), "kv-cache-keys", sink),
                    storage(side_elements() * size_of(c.value_type), "kv-cache-values", sink),
                    {}};
    b.at = {b.keys.data(), b.values.data()};
    layers_.push_back(std::move(b));
  }
}

default_kv_cache_store::default_kv_cache_store(kv_cache_config config, store_options options,
                                               std::span<const layer_memory> memory,
                                               const char* name, trace::sink& sink)
    : slotted_kv_cache_store(config, options, name, sink) {
  if (memory.size() != this->config().layers)
    throw std::invalid_argument(std::string(name) + ": " + std::to_string(memory.size()) +
                                " layer memories for " + std::to_string(this->config().layers) +
                                " layers");
  layers_.reserve(memory.size());
  for (const layer_memory& m : memory) layers_.push_back(layer_buffers{{}, {}, m});
}

void default_kv_cache_store::prepare_write(std::size_t, std::size_t) {}

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
  const std::size_t slot = prepare_append(layer, key, value);
  prepare_write(layer, slot);
  const kv_cache_config& c = config();
  const std::size_t d = c.head_dim, head_stride = c.capacity * d;
  const format_traits kt = traits_of(c.key_type), vt = traits_of(c.value_type);
  layer_buffers& s = layers_[layer];
  for (std::size_t h = 0; h < c.kv_heads; ++h) {
    const std::size_t at = h * head_stride + slot * d;
    kt.encode(s.at.keys + at * kt.element_bytes, key.data() + h * d, d);
    vt.encode(s.at.values + at * vt.element_bytes, value.data() + h * d, d);
  }
  return commit_append(layer);
}

memory_report default_kv_cache_store::memory() const {
  std::size_t keys = 0, values = 0;
  for (const layer_buffers& s : layers_) {
    keys += s.keys.bytes();
    values += s.values.bytes();
  }
  return report(keys, values);
}

tensor_view default_kv_cache_store::view_of(const std::byte* side, dtype type,
                                            const slot_run& r) const {
  const kv_cache_config& c = config();
  const std::size_t d = c.head_dim;
  // const_cast: windows are read-only by contract; tensor_view carries a mutable pointer.
  std::byte* data = const_cast<std::byte*>(side) + r.slot * d * size_of(type);
  return tensor_view(data, type, c.kv_heads, r.count, d, c.capacity * d, d);
}

windowed_kv default_kv_cache_store::window(kv_side side, std::size_t layer, std::size_t from,
                                           std::size_t to) const {
  const bool keys = side == kv_side::keys;
  const slot_runs slots = window_slots(
      keys ? "default_kv_cache_store::key_window" : "default_kv_cache_store::value_window", layer,
      from, to);
  const std::byte* buffer = keys ? layers_[layer].at.keys : layers_[layer].at.values;
  const dtype type = keys ? config().key_type : config().value_type;
  std::array<kv_run, windowed_kv::max_runs> runs{};
  for (std::size_t i = 0; i < slots.count; ++i)
    runs[i] = kv_run{view_of(buffer, type, slots.runs[i]), slots.runs[i].first_position};
  return windowed_kv(std::span<const kv_run>(runs.data(), slots.count));
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

std::optional<windowed_kv> default_kv_cache_store::stored_window(kv_side side, std::size_t layer,
                                                                 std::size_t from,
                                                                 std::size_t to) const {
  return window(side, layer, from, to);
}

void default_kv_cache_store::read(kv_side side, const char* who, std::size_t layer,
                                  std::size_t from, std::size_t to, std::span<float> out) const {
  const slot_runs slots = read_slots(who, layer, from, to, out);
  const bool keys = side == kv_side::keys;
  const dtype type = keys ? config().key_type : config().value_type;
  const std::byte* buffer = keys ? layers_[layer].at.keys : layers_[layer].at.values;
  const std::size_t d = config().head_dim, count = to - from;
  const codecs::decoder decode = traits_of(type).decode;
  for (std::size_t h = 0; h < config().kv_heads; ++h) {
    float* dst = out.data() + h * count * d;
    for (const slot_run& r : slots.view()) {
      decode(dst, view_of(buffer, type, r).row_bytes(h, 0), r.count * d);
      dst += r.count * d;
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
