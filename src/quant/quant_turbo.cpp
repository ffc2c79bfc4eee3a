// turboquant_kv_cache_store: per (layer, kv head) a random rotation; each row's norm kept apart
// and its rotated unit direction quantized coordinate-wise with the Lloyd–Max codebook; keys may
// add a 1-bit QJL sketch of the residual. Slots and ring semantics come from the slotted base.
module;
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include "quant_codec.h"
module ringkv.quant;

namespace ringkv {
namespace {

void check_bits(const char* field, unsigned bits) {
  if (bits < 2 || bits > 4)
    throw std::invalid_argument(std::string("ringkv::turboquant_kv_cache_store: ") + field + " " +
                                std::to_string(bits) + " outside 2..4");
}

turboquant_options checked(const turboquant_options& o) {
  check_bits("key_bits", o.key_bits);
  check_bits("value_bits", o.value_bits);
  return o;
}

std::uint64_t mix(std::uint64_t seed, std::size_t layer, std::size_t head, std::uint64_t what) {
  std::uint64_t z = seed ^ (0x9e3779b97f4a7c15ULL * (layer * 1000003ULL + head * 131ULL + what));
  z = (z ^ (z >> 31)) * 0xd6e8feb86659fd93ULL;
  return z ^ (z >> 32);
}

std::size_t code_bytes(std::size_t d, unsigned bits) { return (d * bits + 7) / 8; }

// Bytes of one head's codes of `bits` bits over `slots` slots (a multiple of 32): slot groups for
// keys (see quant_codec.h), rows for values.
std::size_t head_code_bytes(std::size_t d, unsigned bits, std::size_t slots, bool grouped) {
  return grouped ? slots / codec::group_slots * codec::group_bytes(d, bits)
                 : slots * code_bytes(d, bits);
}

}  // namespace

turboquant_kv_cache_store::turboquant_kv_cache_store(kv_cache_config config,
                                                     turboquant_options options,
                                                     store_options store, trace::sink& sink)
    : compressed_kv_cache_store(config, store, "turboquant_kv_cache_store", sink),
      quant_(checked(options)),
      key_book_(&lloyd_max_codebook(config.head_dim, options.key_bits - (options.qjl ? 1 : 0))),
      value_book_(&lloyd_max_codebook(config.head_dim, options.value_bits)),
      scratch_(4 * config.head_dim * sizeof(float), "turboquant-append-scratch", sink) {
  const kv_cache_config& c = this->config();
  const std::size_t slots = codec::group_capacity(c.capacity), rows = c.kv_heads * slots;
  const std::size_t d = c.head_dim;
  layers_.reserve(c.layers);
  for (std::size_t l = 0; l < c.layers; ++l) {
    layer_state s;
    s.keys.codes = storage(c.kv_heads * head_code_bytes(d, key_book_->bits, slots, true),
                           "turboquant-key-codes", sink);
    s.keys.scales = storage(rows * sizeof(float), "turboquant-key-norms", sink);
    if (quant_.qjl) {
      s.keys.signs =
          storage(c.kv_heads * head_code_bytes(d, 1, slots, true), "turboquant-qjl-signs", sink);
      s.keys.residual_norms = storage(rows * sizeof(float), "turboquant-qjl-residual-norms", sink);
      s.projections =
          storage(c.kv_heads * d * d * sizeof(float), "turboquant-qjl-projections", sink);
      for (std::size_t h = 0; h < c.kv_heads; ++h)
        fill_gaussian(s.projections.as<float>().subspan(h * d * d, d * d),
                      mix(quant_.seed, l, h, 2));
    }
    s.values.codes = storage(c.kv_heads * head_code_bytes(d, value_book_->bits, slots, false) +
                                 codec::value_code_padding,
                             "turboquant-value-codes", sink);
    s.values.scales = storage(rows * sizeof(float), "turboquant-value-norms", sink);
    const std::size_t rf = rotation_floats(d);
    s.rotations = storage(c.kv_heads * rf * sizeof(float), "turboquant-rotations", sink);
    for (std::size_t h = 0; h < c.kv_heads; ++h)
      fill_rotation(d, mix(quant_.seed, l, h, 1), s.rotations.as<float>().subspan(h * rf, rf));
    layers_.push_back(std::move(s));
  }
}

compressed_format turboquant_kv_cache_store::format(kv_side side,
                                                    std::size_t layer) const noexcept {
  const bool keys = side == kv_side::keys;
  const codebook& book = keys ? *key_book_ : *value_book_;
  const layer_state& s = layers_[layer];
  const std::size_t d = config().head_dim;
  const bool qjl = keys && quant_.qjl;
  return compressed_format{compression::turboquant,
                           config().kv_heads,
                           d,
                           book.bits,
                           code_bytes(d, book.bits),
                           qjl,
                           qjl ? code_bytes(d, 1) : 0,
                           book.centroids.data(),
                           s.rotations.as<float>().data(),
                           rotation_floats(d),
                           rotation_floats(d) == d,
                           qjl ? s.projections.as<float>().data() : nullptr,
                           keys,
                           quant_.seed};
}

void turboquant_kv_cache_store::encode(kv_side side, std::size_t layer, std::size_t slot,
                                       std::span<const float> row) {
  const bool keys = side == kv_side::keys;
  const codebook& book = keys ? *key_book_ : *value_book_;
  const compressed_format f = format(side, layer);
  side_buffers& b = keys ? layers_[layer].keys : layers_[layer].values;
  const std::size_t d = f.head_dim, slots = codec::group_capacity(config().capacity);
  const std::span<float> scratch(reinterpret_cast<float*>(scratch_.data()), 4 * d);
  const std::span<float> u = scratch.first(d), y = scratch.subspan(d, d),
                         back = scratch.subspan(2 * d, d);
  // [d] one code a byte (the last d floats' bytes)
  auto* codes = reinterpret_cast<std::uint8_t*>(scratch.subspan(3 * d).data());
  // Row (h, slot)'s d codes of `bits` bits into `plane`: its group, or its packed row.
  const auto store = [&](std::byte* plane, unsigned bits, std::size_t h) {
    if (f.grouped) {
      std::byte* group = plane + head_code_bytes(d, bits, slots, true) * h +
                         slot / codec::group_slots * codec::group_bytes(d, bits);
      codec::grouped_store(group, d, bits, slot % codec::group_slots, codes);
    } else {
      codec::pack(codes, d, bits, plane + (h * slots + slot) * code_bytes(d, bits));
    }
  };
  for (std::size_t h = 0; h < f.heads; ++h) {
    const std::span<const float> x = row.subspan(h * d, d);
    double sum = 0;
    for (float v : x) sum += double(v) * v;
    const float norm = float(std::sqrt(sum));
    for (std::size_t i = 0; i < d; ++i) u[i] = norm > 0 ? float(x[i] / double(norm)) : 0.0f;
    const float* rotation = f.rotations + h * f.rotation_floats;
    codec::rotate(rotation, f.hadamard, d, u.data(), y.data());
    for (std::size_t i = 0; i < d; ++i) codes[i] = book.encode(y[i]);
    store(b.codes.data(), f.bits, h);
    b.scales.as<float>()[h * slots + slot] = norm;
    if (!f.qjl) continue;
    // Residual of the unit direction in the original coordinates, r = u − Πᵀ·ỹ; keep ‖r‖ and
    // sign(S·r).
    for (std::size_t i = 0; i < d; ++i) y[i] = f.centroids[codes[i]];
    codec::rotate_back(rotation, f.hadamard, d, y.data(), back.data());
    double rn = 0;
    for (std::size_t i = 0; i < d; ++i) {
      u[i] -= back[i];
      rn += double(u[i]) * u[i];
    }
    const float* s = f.projections + h * d * d;
    for (std::size_t k = 0; k < d; ++k) {
      float dot = 0;
      for (std::size_t i = 0; i < d; ++i) dot += s[k * d + i] * u[i];
      codes[k] = dot >= 0 ? 1 : 0;
    }
    store(b.signs.data(), 1, h);
    b.residual_norms.as<float>()[h * slots + slot] = float(std::sqrt(rn));
  }
}

std::size_t turboquant_kv_cache_store::append(std::size_t layer, std::span<const float> key,
                                              std::span<const float> value) {
  const std::size_t slot = prepare_append(layer, key, value);
  encode(kv_side::keys, layer, slot, key);
  encode(kv_side::values, layer, slot, value);
  return commit_append(layer);
}

compressed_window turboquant_kv_cache_store::window_of(kv_side side, std::size_t layer,
                                                       const slot_runs& slots) const {
  const side_buffers& b = side == kv_side::keys ? layers_[layer].keys : layers_[layer].values;
  return detail::window_over(
      format(side, layer), slots.view(), codec::group_capacity(config().capacity), b.codes.data(),
      b.scales.as<float>().data(), b.signs.empty() ? nullptr : b.signs.data(),
      b.residual_norms.empty() ? nullptr : b.residual_norms.as<float>().data());
}

memory_report turboquant_kv_cache_store::memory() const {
  // The rotations serve both sides; they are counted with the keys, as the projections are.
  std::size_t keys = key_book_->centroids.size() * sizeof(float);
  std::size_t values = value_book_->centroids.size() * sizeof(float);
  for (const layer_state& s : layers_) {
    keys += s.keys.codes.bytes() + s.keys.scales.bytes() + s.keys.signs.bytes() +
            s.keys.residual_norms.bytes() + s.projections.bytes();
    keys += s.rotations.bytes();
    values += s.values.codes.bytes() + s.values.scales.bytes();
  }
  return report(keys, values);
}

}  // namespace ringkv
