// A store whose windows are copies: a default_kv_cache_store behind only the core of
// kv_cache_store, so its key_window/value_window are the interface's defaulted copies (traced
// adapter_inserted{"copy-kv-window"}) — what a user's own store that cannot hand out its rows
// gets. Unlike the deque reference it allocates nothing per append. Include after
// `import ringkv;`; the includer has already included <cstddef> and <span>.
#pragma once

namespace store_test {

class copying_store final : public ringkv::kv_cache_store {
 public:
  copying_store(ringkv::kv_cache_config c, ringkv::store_options o, ringkv::trace::sink& sink)
      : kv_cache_store(sink), inner_(c, o, sink) {}
  std::size_t append(std::size_t l, std::span<const float> k, std::span<const float> v) override {
    return inner_.append(l, k, v);
  }
  std::size_t length(std::size_t l) const override { return inner_.length(l); }
  std::size_t window_start(std::size_t l) const override { return inner_.window_start(l); }
  ringkv::kv_cache_config config() const override { return inner_.config(); }
  ringkv::store_options options() const override { return inner_.options(); }
  void read_keys(std::size_t l, std::size_t from, std::size_t to,
                 std::span<float> out) const override {
    inner_.read_keys(l, from, to, out);
  }
  void read_values(std::size_t l, std::size_t from, std::size_t to,
                   std::span<float> out) const override {
    inner_.read_values(l, from, to, out);
  }
  void truncate(std::size_t l, std::size_t n) override { inner_.truncate(l, n); }
  void clear() override { inner_.clear(); }
  void clear(std::size_t l) override { inner_.clear(l); }
  ringkv::memory_report memory() const override { return inner_.memory(); }

 private:
  ringkv::default_kv_cache_store inner_;
};

}  // namespace store_test
