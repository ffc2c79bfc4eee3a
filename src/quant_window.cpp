// compressed_window (the window over codes, as runs with absolute positions) and the row codec
// every reader of compressed rows shares: bit packing and decoding one row.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
module ringkv.quant;

namespace ringkv {
namespace detail {

void pack_codes(std::span<const std::uint8_t> codes, unsigned bits, std::byte* out) noexcept {
  const std::size_t bytes = (codes.size() * bits + 7) / 8;
  std::memset(out, 0, bytes);
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const std::size_t bit = i * bits;
    const unsigned v = unsigned(codes[i]) << (bit % 8);
    out[bit / 8] |= std::byte(v & 0xff);
    if (bit % 8 + bits > 8) out[bit / 8 + 1] |= std::byte(v >> 8);
  }
}

std::uint8_t code_at(const std::byte* packed, unsigned bits, std::size_t i) noexcept {
  const std::size_t bit = i * bits;
  unsigned v = unsigned(packed[bit / 8]) >> (bit % 8);
  if (bit % 8 + bits > 8) v |= unsigned(packed[bit / 8 + 1]) << (8 - bit % 8);
  return std::uint8_t(v & ((1u << bits) - 1));
}

void decode_row(const compressed_format& f, std::size_t h, const compressed_view& v,
                std::size_t p, std::span<float> out) noexcept {
  const std::size_t d = f.head_dim, row = h * v.head_stride + p;
  const std::byte* codes = v.codes + row * f.code_bytes;
  const float scale = v.scales[row];
  if (f.kind == compression::int8) {
    for (std::size_t i = 0; i < d; ++i)
      out[i] = scale * float(static_cast<std::int8_t>(codes[i]));
    return;
  }
  const random_rotation& rotation = f.rotations[h];
  if (rotation.hadamard()) {  // codebook values, then the exact inverse rotation in place
    for (std::size_t i = 0; i < d; ++i) out[i] = f.centroids[code_at(codes, f.bits, i)];
    rotation.apply_inverse(out, out);
  } else {  // Πᵀ·y = Σ_r y_r · (row r of Π), streaming the codes
    const float* m = rotation.state().data();
    float* x = out.data();
    for (std::size_t i = 0; i < d; ++i) x[i] = 0;
    for (std::size_t r = 0; r < d; ++r) {
      const float y = f.centroids[code_at(codes, f.bits, r)];
      for (std::size_t i = 0; i < d; ++i) x[i] += y * m[r * d + i];
    }
  }
  for (std::size_t i = 0; i < d; ++i) out[i] *= scale;
  if (!f.qjl) return;
  // + ‖x‖·‖r‖·sqrt(π/2)/d · Sᵀ·sign(S·r): the QJL dequantization of the residual.
  const std::byte* signs = v.signs + row * f.sign_bytes;
  const float gamma = float(scale * v.residual_norms[row] * qjl_scale(d));
  const float* s = f.projections + h * d * d;
  float* x = out.data();
  for (std::size_t k = 0; k < d; ++k) {
    const float z = code_at(signs, 1, k) ? gamma : -gamma;
    for (std::size_t i = 0; i < d; ++i) x[i] += z * s[k * d + i];
  }
}

void decode_window(const compressed_window& w, std::span<float> out) noexcept {
  const std::size_t d = w.head_dim();
  float* dst = out.data();
  for (std::size_t h = 0; h < w.heads(); ++h)
    for (const compressed_view& v : w.runs())
      for (std::size_t p = 0; p < v.positions; ++p, dst += d)
        decode_row(w.format(), h, v, p, std::span(dst, d));
}

compressed_window window_over(const compressed_format& f,
                              std::span<const slotted_kv_cache_store::slot_run> slots,
                              std::size_t capacity, const std::byte* codes, const float* scales,
                              const std::byte* signs, const float* residual_norms) {
  std::array<compressed_run, compressed_window::max_runs> runs{};
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::size_t slot = slots[i].slot;
    runs[i] = {compressed_view{codes + slot * f.code_bytes, scales + slot,
                               signs ? signs + slot * f.sign_bytes : nullptr,
                               residual_norms ? residual_norms + slot : nullptr, slots[i].count,
                               capacity},
               slots[i].first_position};
  }
  return compressed_window(f, std::span<const compressed_run>(runs.data(), slots.size()));
}

}  // namespace detail

compressed_window::compressed_window(const compressed_format& format,
                                     std::span<const compressed_run> runs)
    : format_(format) {
  for (const compressed_run& r : runs) {
    if (r.view.positions == 0) continue;
    if (count_ == max_runs)
      throw std::invalid_argument("ringkv::compressed_window: more than " +
                                  std::to_string(max_runs) + " runs");
    if (count_ > 0 && r.first_position < end_position())
      throw std::invalid_argument("ringkv::compressed_window: run " + std::to_string(count_) +
                                  " starts at position " + std::to_string(r.first_position) +
                                  ", before the previous run ends (" +
                                  std::to_string(end_position()) + ")");
    views_[count_] = r.view;
    starts_[count_++] = r.first_position;
    length_ += r.view.positions;
  }
}

std::size_t compressed_window::run_first_position(std::size_t i) const {
  if (i >= count_)
    throw std::out_of_range("ringkv::compressed_window::run_first_position: run " +
                            std::to_string(i) + " of " + std::to_string(count_));
  return starts_[i];
}

const compressed_view& compressed_window::head() const {
  if (count_ == 0) throw std::out_of_range("ringkv::compressed_window::head: the window is empty");
  return views_[0];
}

bool compressed_window::wrapped() const noexcept {
  for (std::size_t i = 1; i < count_; ++i)
    if (starts_[i] == starts_[i - 1] + views_[i - 1].positions) return true;
  return false;
}

void compressed_window::decode(std::size_t i, std::size_t h, std::size_t p,
                               std::span<float> out) const {
  if (i >= count_ || h >= format_.heads || p >= views_[i].positions ||
      out.size() != format_.head_dim)
    throw std::out_of_range("ringkv::compressed_window::decode: run " + std::to_string(i) +
                            " of " + std::to_string(count_) + ", head " + std::to_string(h) +
                            " of " + std::to_string(format_.heads) + ", position " +
                            std::to_string(p) + ", out of " + std::to_string(out.size()) +
                            " floats (head_dim " + std::to_string(format_.head_dim) + ")");
  detail::decode_row(format_, h, views_[i], p, out);
}

}  // namespace ringkv
