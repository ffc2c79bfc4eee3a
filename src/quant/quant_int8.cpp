// int8_kv_cache_store: one f32 scale (absmax / 127) and head_dim int8 codes per row; slots and
// ring semantics from the slotted base.
module;
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>
module ringkv.quant;

namespace ringkv {

int8_kv_cache_store::int8_kv_cache_store(kv_cache_config config, store_options store,
                                         trace::sink& sink)
    : compressed_kv_cache_store(config, store, "int8_kv_cache_store", sink) {
  const std::size_t rows = this->config().kv_heads * this->config().capacity;
  layers_.reserve(this->config().layers);
  for (std::size_t l = 0; l < this->config().layers; ++l)
    layers_.push_back(layer_state{{storage(side_elements(), "int8-key-codes", sink),
                                   storage(rows * sizeof(float), "int8-key-scales", sink)},
                                  {storage(side_elements(), "int8-value-codes", sink),
                                   storage(rows * sizeof(float), "int8-value-scales", sink)}});
}

compressed_format int8_kv_cache_store::format() const noexcept {
  compressed_format f;
  f.kind = compression::int8;
  f.heads = config().kv_heads;
  f.head_dim = config().head_dim;
  f.bits = 8;
  f.code_bytes = config().head_dim;
  return f;
}

std::size_t int8_kv_cache_store::append(std::size_t layer, std::span<const float> key,
                                        std::span<const float> value) {
  const std::size_t slot = prepare_append(layer, key, value);
  const std::size_t d = config().head_dim, capacity = config().capacity;
  for (auto [b, row] :
       {std::pair{&layers_[layer].keys, key}, std::pair{&layers_[layer].values, value}})
    for (std::size_t h = 0; h < config().kv_heads; ++h) {
      const std::span<const float> x = row.subspan(h * d, d);
      float absmax = 0;
      for (float v : x) absmax = std::max(absmax, std::fabs(v));
      const float scale = absmax / 127.0f;
      auto* codes = reinterpret_cast<std::int8_t*>(b->codes.data() + (h * capacity + slot) * d);
      for (std::size_t i = 0; i < d; ++i) {
        // NaN (or inf / inf) has no code: 0; the comparisons keep the conversion defined.
        const float r = scale > 0 ? std::nearbyint(x[i] / scale) : 0.0f;
        codes[i] = r >= 127.0f    ? std::int8_t{127}
                   : r <= -127.0f ? std::int8_t{-127}
                   : r == r       ? std::int8_t(r)
                                  : std::int8_t{0};
      }
      b->scales.as<float>()[h * capacity + slot] = scale;
    }
  return commit_append(layer);
}

compressed_window int8_kv_cache_store::window_of(kv_side side, std::size_t layer,
                                                 const slot_runs& slots) const {
  const side_buffers& b = side == kv_side::keys ? layers_[layer].keys : layers_[layer].values;
  return detail::window_over(format(), slots.view(), config().capacity, b.codes.data(),
                             b.scales.as<float>().data(), nullptr, nullptr);
}

memory_report int8_kv_cache_store::memory() const {
  std::size_t keys = 0, values = 0;
  for (const layer_state& s : layers_) {
    keys += s.keys.codes.bytes() + s.keys.scales.bytes();
    values += s.values.codes.bytes() + s.values.scales.bytes();
  }
  return report(keys, values);
}

}  // namespace ringkv
