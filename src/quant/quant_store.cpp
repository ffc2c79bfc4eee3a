// compressed_kv_cache_store: what every compressed store shares — reads decode the store's
// compressed windows with the row codec, windows refuse positions not held.
module;
#include <cstddef>
#include <optional>
#include <span>
module ringkv.quant;

namespace ringkv {

compressed_window compressed_kv_cache_store::window(kv_side side, std::size_t layer,
                                                    std::size_t from, std::size_t to) const {
  return window_of(
      side, layer,
      window_slots(side == kv_side::keys ? "compressed_kv_cache_store::compressed_key_window"
                                         : "compressed_kv_cache_store::compressed_value_window",
                   layer, from, to));
}

compressed_window compressed_kv_cache_store::compressed_key_window(std::size_t layer,
                                                                   std::size_t from,
                                                                   std::size_t to) const {
  return window(kv_side::keys, layer, from, to);
}

compressed_window compressed_kv_cache_store::compressed_value_window(std::size_t layer,
                                                                     std::size_t from,
                                                                     std::size_t to) const {
  return window(kv_side::values, layer, from, to);
}

std::optional<windowed_kv> compressed_kv_cache_store::stored_window(kv_side side, std::size_t layer,
                                                                    std::size_t from,
                                                                    std::size_t to) const {
  return window(side, layer, from, to);
}

void compressed_kv_cache_store::read(kv_side side, const char* who, std::size_t layer,
                                     std::size_t from, std::size_t to, std::span<float> out) const {
  detail::decode_window(window_of(side, layer, read_slots(who, layer, from, to, out)), out);
}

void compressed_kv_cache_store::read_keys(std::size_t layer, std::size_t from, std::size_t to,
                                          std::span<float> out) const {
  read(kv_side::keys, "compressed_kv_cache_store::read_keys", layer, from, to, out);
}

void compressed_kv_cache_store::read_values(std::size_t layer, std::size_t from, std::size_t to,
                                            std::span<float> out) const {
  read(kv_side::values, "compressed_kv_cache_store::read_values", layer, from, to, out);
}

}  // namespace ringkv
