// A store written outside the library (tests, bench): a ring or dense cache over its own buffers
// (ringkv::storage: 64-byte aligned, huge pages where large, as a runtime's allocator would give),
// one per layer and side laid out [kv_heads][capacity][head_dim] in the config's element type,
// that exposes its rows through kv_cache_store::stored_window and nothing else of ringkv's store
// code (no slotted_kv_cache_store, no friend access). It shows what a runtime's own store gets:
// the tiled prefill, decode without copies and snapshots. No sinks, no slack (keep = slack = 0).
// Include after `import ringkv;`; the includer has already included <algorithm>, <array>,
// <cstddef>, <optional>, <span>, <stdexcept>, <string>, <utility> and <vector> before the import.
#pragma once

namespace store_test {

class own_rows_store final : public ringkv::kv_cache_store {
 public:
  own_rows_store(ringkv::kv_cache_config c, bool ring,
                 ringkv::trace::sink& sink = ringkv::trace::null_sink())
      : kv_cache_store(sink), c_(c), ring_(ring), layers_(c.layers) {
    c_.validate();
    const std::size_t bytes = c.kv_heads * c.capacity * c.head_dim * ringkv::size_of(c.key_type);
    for (layer& l : layers_) {
      l.keys = ringkv::storage(bytes, "own-keys", sink);
      l.values = ringkv::storage(bytes, "own-values", sink);
    }
  }

  std::size_t append(std::size_t l, std::span<const float> k, std::span<const float> v) override {
    layer& L = at(l);
    if (k.size() != c_.row_floats() || v.size() != c_.row_floats())
      throw std::invalid_argument("own_rows_store::append: a row is not kv_heads * head_dim");
    if (!ring_ && L.length == c_.capacity) throw ringkv::cache_full("own_rows_store: full");
    ringkv::require_storable("own_rows_store::append", "key", k, c_.key_type);
    ringkv::require_storable("own_rows_store::append", "value", v, c_.value_type);
    const ringkv::format_traits t = ringkv::traits_of(c_.key_type);
    const std::size_t slot = L.length % c_.capacity, d = c_.head_dim;
    for (std::size_t h = 0; h < c_.kv_heads; ++h) {
      const std::size_t at_row = (h * c_.capacity + slot) * d * t.element_bytes;
      t.encode(L.keys.data() + at_row, k.data() + h * d, d);
      t.encode(L.values.data() + at_row, v.data() + h * d, d);
    }
    return L.length++;
  }
  std::size_t length(std::size_t l) const override { return at(l).length; }
  std::size_t window_start(std::size_t l) const override {
    const std::size_t n = at(l).length;
    return n > c_.capacity ? n - c_.capacity : 0;
  }
  ringkv::kv_cache_config config() const override { return c_; }
  ringkv::store_options options() const override { return {.sliding_window = ring_}; }
  void read_keys(std::size_t l, std::size_t from, std::size_t to,
                 std::span<float> out) const override {
    read(ringkv::kv_side::keys, l, from, to, out);
  }
  void read_values(std::size_t l, std::size_t from, std::size_t to,
                   std::span<float> out) const override {
    read(ringkv::kv_side::values, l, from, to, out);
  }
  void truncate(std::size_t l, std::size_t n) override {
    layer& L = at(l);
    // The next token (position n) sees n - capacity + 1 .. n: they must still be held.
    if (n > L.length || (n + 1 > c_.capacity && n + 1 - c_.capacity < window_start(l)))
      throw std::out_of_range("own_rows_store::truncate: " + std::to_string(n));
    L.length = n;
  }
  void clear() override {
    for (layer& L : layers_) L.length = 0;
  }
  void clear(std::size_t l) override { at(l).length = 0; }
  ringkv::memory_report memory() const override {
    ringkv::memory_report r;
    r.keys.physical_bytes = r.values.physical_bytes = layers_.size() * layers_[0].keys.bytes();
    r.physical_bytes = 2 * r.keys.physical_bytes;
    return r;
  }

  /// The positions [from, to) as one view of its buffer, two across the ring's end.
  std::optional<ringkv::windowed_kv> stored_window(ringkv::kv_side side, std::size_t l,
                                                   std::size_t from,
                                                   std::size_t to) const override {
    check_range("own_rows_store::stored_window", l, from, to);
    const layer& L = at(l);
    auto* data = const_cast<std::byte*>(
        (side == ringkv::kv_side::keys ? L.keys : L.values).data());  // windows are read-only
    const std::size_t d = c_.head_dim, bytes = ringkv::size_of(c_.key_type);
    std::array<ringkv::kv_run, 2> runs{};  // no allocation: decode asks for a window a token
    std::size_t n = 0;
    for (std::size_t p = from; p < to; ++n) {
      const std::size_t slot = p % c_.capacity, count = std::min(to - p, c_.capacity - slot);
      runs[n] = {ringkv::tensor_view(data + slot * d * bytes, c_.key_type, c_.kv_heads, count, d,
                                     c_.capacity * d, d),
                 p};
      p += count;
    }
    return ringkv::windowed_kv(std::span<const ringkv::kv_run>(runs.data(), n));
  }

 private:
  struct layer {
    ringkv::storage keys, values;  // [kv_heads][capacity][head_dim]
    std::size_t length = 0;
  };
  layer& at(std::size_t l) { return const_cast<layer&>(std::as_const(*this).at(l)); }
  const layer& at(std::size_t l) const {
    check_layer("own_rows_store", l);
    return layers_[l];
  }
  void read(ringkv::kv_side side, std::size_t l, std::size_t from, std::size_t to,
            std::span<float> out) const {
    const ringkv::windowed_kv w = *stored_window(side, l, from, to);
    if (out.size() != c_.kv_heads * (to - from) * c_.head_dim)
      throw std::invalid_argument("own_rows_store::read: out has the wrong size");
    std::size_t at_row = 0;
    for (std::size_t h = 0; h < c_.kv_heads; ++h)
      for (std::size_t i = 0; i < w.run_count(); ++i)
        for (std::size_t p = 0; p < w.run_positions(i); ++p, ++at_row)
          w.decode(i, h, p, out.subspan(at_row * c_.head_dim, c_.head_dim));
  }

  ringkv::kv_cache_config c_;
  bool ring_;
  std::vector<layer> layers_;
};

}  // namespace store_test
