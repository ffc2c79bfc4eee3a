// The default store's snapshot section: per layer (length, window_start), then per layer the
// held rows of keys and of values, per head in position order, as the raw stored elements
// (f32, f16 or bf16 bits: nothing is rounded twice). Loading puts every position back in the
// slot slot_of gives it, so a wrapped ring keeps its physical layout.
module;
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
module ringkv.snapshot;

namespace ringkv::detail {

/// The restricted access load needs: the layer buffers and counters of a default store.
template <>
struct snapshot_access<default_kv_cache_store> {
  static std::byte* data(default_kv_cache_store& s, std::size_t layer, kv_side side) {
    auto& l = s.layers_[layer];
    return side == kv_side::keys ? l.keys.data() : l.values.data();
  }
  static void set_counters(default_kv_cache_store& s, std::size_t layer, layer_counters c) {
    s.layers_[layer].length = c.length;
    s.layers_[layer].window_start = c.window_start;
  }
};

namespace {
using access = snapshot_access<default_kv_cache_store>;

// Calls f(slot, count) for the slot runs of the held positions of `layer`, in position order.
template <class F>
void for_each_held_run(const default_kv_cache_store& s, std::size_t layer, F f) {
  const std::size_t n = s.length(layer), start = s.window_start(layer), keep = s.options().keep;
  const std::size_t capacity = s.config().capacity;
  auto range = [&](std::size_t from, std::size_t to) {
    while (from < to) {  // at most twice: to the ring's end, then from its start
      const std::size_t slot = s.slot_of(from), count = std::min(to - from, capacity - slot);
      f(slot, count);
      from += count;
    }
  };
  if (start == 0) {
    range(0, n);
  } else {
    range(0, keep);
    range(start, n);
  }
}

// Bytes the store's buffers take: layers * kv_heads * capacity * head_dim * (key element +
// value element), or 0 when that overflows.
std::size_t store_bytes(const kv_cache_config& c) {
  std::size_t n = 0;
  const std::size_t element = size_of(c.key_type) + size_of(c.value_type);
  if (__builtin_mul_overflow(c.kv_heads, c.capacity, &n) ||
      __builtin_mul_overflow(n, c.head_dim, &n) || __builtin_mul_overflow(n, element, &n) ||
      __builtin_mul_overflow(n, c.layers, &n))
    return 0;
  return n;
}
}  // namespace

void save_default(const default_kv_cache_store& s, snapshot_out& out) {
  const kv_cache_config c = s.config();
  for (std::size_t l = 0; l < c.layers; ++l) {
    out.u64(s.length(l));
    out.u64(s.window_start(l));
  }
  const std::size_t d = c.head_dim;
  for (std::size_t l = 0; l < c.layers; ++l)
    for (kv_side side : {kv_side::keys, kv_side::values}) {
      const bool keys = side == kv_side::keys;
      const std::size_t size = size_of(keys ? c.key_type : c.value_type);
      const std::byte* base = (keys ? s.key_storage(l) : s.value_storage(l)).data();
      for (std::size_t h = 0; h < c.kv_heads; ++h)
        for_each_held_run(s, l, [&](std::size_t slot, std::size_t count) {
          out.elements(base + (h * c.capacity + slot) * d * size, count * d, size);
        });
    }
}

std::unique_ptr<kv_cache_store> load_default(const snapshot_header& h, snapshot_in& in,
                                             trace::sink& sink, std::size_t max_store_bytes) {
  const kv_cache_config& c = h.config;
  std::vector<layer_counters> counters(c.layers);
  for (layer_counters& lc : counters) lc = read_counters(h, in);
  const std::size_t bytes = store_bytes(c);
  if (bytes == 0 || bytes > max_store_bytes)
    in.fail("config out of range: the store would take " +
                (bytes == 0 ? std::string("more than 2^64") : std::to_string(bytes)) +
                " bytes (limit " + std::to_string(max_store_bytes) + ")",
            16);
  // Held rows <= capacity per layer and bytes did not overflow: this sum cannot either.
  std::size_t data_bytes = 0;
  for (const layer_counters& lc : counters) {
    const std::size_t held = lc.window_start == 0 ? lc.length
                                                  : h.options.keep + lc.length - lc.window_start;
    data_bytes += held * c.row_floats() * (size_of(c.key_type) + size_of(c.value_type));
  }
  const std::vector<std::byte> data = in.block(data_bytes);
  in.finish();  // checked before the store is allocated: nothing is built from a corrupt file

  auto store = std::make_unique<default_kv_cache_store>(c, h.options, sink);
  for (std::size_t l = 0; l < c.layers; ++l) access::set_counters(*store, l, counters[l]);
  const std::size_t d = c.head_dim;
  const std::byte* next = data.data();
  for (std::size_t l = 0; l < c.layers; ++l)
    for (kv_side side : {kv_side::keys, kv_side::values}) {
      const std::size_t size = size_of(side == kv_side::keys ? c.key_type : c.value_type);
      std::byte* base = access::data(*store, l, side);
      for (std::size_t hd = 0; hd < c.kv_heads; ++hd)
        for_each_held_run(*store, l, [&](std::size_t slot, std::size_t count) {
          copy_elements(base + (hd * c.capacity + slot) * d * size, next, count * d, size);
          next += count * d * size;
        });
    }
  return store;
}

}  // namespace ringkv::detail
