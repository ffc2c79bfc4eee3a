// Shared helpers for the store suites: deterministic key/value rows and checks of windows and
// reads against them. Include after `import ringkv;` (it names the library's types); the includer
// has already included <cstddef>, <initializer_list>, <span>, <string> and <vector> before the
// import (clang wants standard headers before imports).
#pragma once

namespace store_test {

/// Key element of (layer, position, head, dim): distinct per coordinate and exact in f32 for
/// layer < 4, position < 4000, head < 10, dim < 100. The value is its negation.
inline float key_at(std::size_t l, std::size_t p, std::size_t h, std::size_t d) {
  return float(l * 4000000 + p * 1000 + h * 100 + d) + 0.25f;
}
inline float value_at(std::size_t l, std::size_t p, std::size_t h, std::size_t d) {
  return -key_at(l, p, h, d);
}
inline float element_at(ringkv::kv_side side, std::size_t l, std::size_t p, std::size_t h,
                        std::size_t d) {
  return side == ringkv::kv_side::keys ? key_at(l, p, h, d) : value_at(l, p, h, d);
}

/// One token's key and value rows, filled without allocating after construction.
class rows {
 public:
  explicit rows(const ringkv::kv_cache_config& c)
      : c_(c), key(c.row_floats()), value(c.row_floats()) {}
  void fill(std::size_t l, std::size_t p) {
    for (std::size_t h = 0; h < c_.kv_heads; ++h)
      for (std::size_t d = 0; d < c_.head_dim; ++d) {
        key[h * c_.head_dim + d] = key_at(l, p, h, d);
        value[h * c_.head_dim + d] = value_at(l, p, h, d);
      }
  }
  /// Appends the token of position length(l) to layer l; returns the position.
  std::size_t append(ringkv::kv_cache_store& s, std::size_t l) {
    fill(l, s.length(l));
    return s.append(l, key, value);
  }
  /// Appends `count` tokens to every layer, layer by layer per token.
  void append_all(ringkv::kv_cache_store& s, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t l = 0; l < c_.layers; ++l) append(s, l);
  }

 private:
  ringkv::kv_cache_config c_;

 public:
  std::vector<float> key, value;
};

/// The absolute positions a window's runs cover (element or code runs), in run order.
inline std::vector<std::size_t> positions_of(const ringkv::windowed_kv& w) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < w.run_count(); ++i)
    for (std::size_t p = 0; p < w.run_positions(i); ++p) out.push_back(w.run_first_position(i) + p);
  return out;
}

/// Number of f32 elements of a window's rows that differ from the rows of their positions.
inline std::size_t wrong_elements(const ringkv::windowed_kv& w, ringkv::kv_side side,
                                  std::size_t layer) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < w.runs().size(); ++i) {
    const ringkv::tensor_view& run = w.runs()[i];
    for (std::size_t h = 0; h < run.heads(); ++h)
      for (std::size_t p = 0; p < run.positions(); ++p) {
        const auto row = run.row<float>(h, p);
        for (std::size_t d = 0; d < row.size(); ++d)
          wrong += row[d] != element_at(side, layer, w.run_first_position(i) + p, h, d);
      }
  }
  return wrong;
}

/// Number of elements of a read_keys/read_values result for [from, to) that are wrong.
inline std::size_t wrong_read(std::span<const float> out, ringkv::kv_side side, std::size_t layer,
                              std::size_t from, std::size_t to, std::size_t heads,
                              std::size_t head_dim) {
  std::size_t wrong = 0, i = 0;
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t p = from; p < to; ++p)
      for (std::size_t d = 0; d < head_dim; ++d)
        wrong += out[i++] != element_at(side, layer, p, h, d);
  return wrong;
}

/// Everything observable about a store's held positions, for "nothing changed" checks.
struct snapshot {
  std::vector<std::size_t> lengths, starts;
  std::vector<std::vector<float>> keys, values;  // per layer: pinned rows, then [start, length)
  bool operator==(const snapshot&) const = default;
};

inline snapshot snap(const ringkv::kv_cache_store& s) {
  snapshot out;
  const auto c = s.config();
  for (std::size_t l = 0; l < c.layers; ++l) {
    const std::size_t n = s.length(l), start = s.window_start(l);
    out.lengths.push_back(n);
    out.starts.push_back(start);
    std::vector<float> k, v;
    auto read = [&](std::size_t from, std::size_t to) {
      std::vector<float> kk(c.row_floats() * (to - from)), vv(kk.size());
      s.read_keys(l, from, to, kk);
      s.read_values(l, from, to, vv);
      k.insert(k.end(), kk.begin(), kk.end());
      v.insert(v.end(), vv.begin(), vv.end());
    };
    if (start == 0) {
      read(0, n);
    } else {
      read(0, s.options().keep);
      read(start, n);
    }
    out.keys.push_back(std::move(k));
    out.values.push_back(std::move(v));
  }
  return out;
}

template <class E>
bool mentions(const E& e, std::initializer_list<const char*> words) {
  const std::string what = e.what();
  for (const char* w : words)
    if (what.find(w) == std::string::npos) return false;
  return true;
}

}  // namespace store_test
