// The reference store for differential checks (tests/model_test.cpp, tests/fuzz/): a deque of
// rows. Include after `import ringkv;`; the includer has already included <algorithm>, <cstddef>,
// <deque>, <span>, <stdexcept> and <vector> before the import (clang wants standard headers
// before imports).
#pragma once

namespace store_test {

/// The reference: every held position is a row kept by value, the pinned ones in a vector and
/// the rolling ones in a std::deque that drops its front when the ring is full. It implements
/// only the core of kv_cache_store, so its windows are the interface's defaulted copies.
class deque_store final : public ringkv::kv_cache_store {
 public:
  struct row {
    std::size_t position;
    std::vector<float> key, value;
  };

  deque_store(ringkv::kv_cache_config c, ringkv::store_options o, ringkv::trace::sink& sink)
      : kv_cache_store(sink), c_(c), o_(o), layers_(c.layers) {}

  std::size_t append(std::size_t l, std::span<const float> k, std::span<const float> v) override {
    layer_rows& L = at(l);
    if (k.size() != c_.row_floats() || v.size() != c_.row_floats())
      throw std::invalid_argument("deque_store: row size");
    if (!o_.sliding_window && L.length == c_.capacity)
      throw ringkv::cache_full("deque_store: full");
    row r{L.length, {k.begin(), k.end()}, {v.begin(), v.end()}};
    if (r.position < o_.keep) {
      L.pinned.push_back(std::move(r));
    } else {
      L.rolling.push_back(std::move(r));
      if (L.rolling.size() > c_.capacity - o_.keep) {
        L.rolling.pop_front();
        L.overwritten = true;
      }
    }
    return L.length++;
  }
  std::size_t length(std::size_t l) const override { return at(l).length; }
  std::size_t window_start(std::size_t l) const override {
    const layer_rows& L = at(l);
    if (!L.overwritten) return 0;
    return L.rolling.empty() ? L.length : L.rolling.front().position;
  }
  ringkv::kv_cache_config config() const override { return c_; }
  ringkv::store_options options() const override { return o_; }
  void read_keys(std::size_t l, std::size_t from, std::size_t to,
                 std::span<float> out) const override {
    read(ringkv::kv_side::keys, l, from, to, out);
  }
  void read_values(std::size_t l, std::size_t from, std::size_t to,
                   std::span<float> out) const override {
    read(ringkv::kv_side::values, l, from, to, out);
  }
  void truncate(std::size_t l, std::size_t n) override {
    layer_rows& L = at(l);
    if (n > L.length) throw std::out_of_range("deque_store: truncate past length");
    // The next token (position n) attends the sinks and the W - keep newest positions up to n.
    const std::size_t w = o_.sliding_window ? c_.capacity - o_.slack : c_.capacity;
    const std::size_t lo = n + 1 > w ? n + 1 - (w - o_.keep) : 0;
    for (std::size_t p = std::max(lo, o_.keep); p < n; ++p)
      if (find(l, p) == nullptr) throw std::out_of_range("deque_store: window lost");
    if (L.pinned.size() > n) L.pinned.resize(n);
    while (!L.rolling.empty() && L.rolling.back().position >= n) L.rolling.pop_back();
    if (n <= o_.keep) L.overwritten = false;
    L.length = n;
  }
  void clear() override {
    for (std::size_t l = 0; l < c_.layers; ++l) clear(l);
  }
  void clear(std::size_t l) override { at(l) = layer_rows{}; }
  ringkv::memory_report memory() const override { return {}; }

  /// The row of position p of layer l, or nullptr when it is not held.
  const row* find(std::size_t l, std::size_t p) const {
    const layer_rows& L = at(l);
    if (p < L.pinned.size()) return &L.pinned[p];
    if (L.rolling.empty() || p < L.rolling.front().position) return nullptr;
    const std::size_t i = p - L.rolling.front().position;
    return i < L.rolling.size() ? &L.rolling[i] : nullptr;
  }

 private:
  struct layer_rows {
    std::vector<row> pinned;
    std::deque<row> rolling;
    std::size_t length = 0;
    bool overwritten = false;
  };
  layer_rows& at(std::size_t l) {
    if (l >= c_.layers) throw std::out_of_range("deque_store: layer");
    return layers_[l];
  }
  const layer_rows& at(std::size_t l) const { return const_cast<deque_store*>(this)->at(l); }
  void read(ringkv::kv_side side, std::size_t l, std::size_t from, std::size_t to,
            std::span<float> out) const {
    if (from > to || to > at(l).length) throw std::out_of_range("deque_store: range");
    for (std::size_t p = from; p < to; ++p)
      if (find(l, p) == nullptr) throw std::out_of_range("deque_store: not held");
    if (out.size() != c_.row_floats() * (to - from))
      throw std::invalid_argument("deque_store: out");
    const std::size_t d = c_.head_dim, n = to - from;
    for (std::size_t p = from; p < to; ++p) {
      const row& r = *find(l, p);
      for (std::size_t h = 0; h < c_.kv_heads; ++h)
        for (std::size_t i = 0; i < d; ++i)
          out[(h * n + p - from) * d + i] =
              (side == ringkv::kv_side::keys ? r.key : r.value)[h * d + i];
    }
  }

  ringkv::kv_cache_config c_;
  ringkv::store_options o_;
  std::vector<layer_rows> layers_;
};

}  // namespace store_test
