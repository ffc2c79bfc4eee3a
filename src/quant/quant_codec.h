// The TurboQuant/int8 row codec as plain functions over plain data, shared by the ringkv.quant
// implementation units and the Highway kernels (which cannot see module types). No Highway here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ringkv::codec {

/// How one side of one layer is encoded (a plain mirror of ringkv::compressed_format).
struct rows_format {
  bool int8 = false;
  std::size_t heads = 0, head_dim = 0;
  unsigned bits = 0;           // codebook bits per coordinate
  std::size_t code_bytes = 0;  // per row, LSB-first bit stream
  bool qjl = false;
  std::size_t sign_bytes = 0;        // per row when qjl
  const float* centroids = nullptr;  // 2^bits
  const float* rotations = nullptr;  // [heads][rotation_floats]
  std::size_t rotation_floats = 0;   // head_dim (Hadamard signs ±1/√d) or head_dim²
  bool hadamard = false;
  const float* projections = nullptr;  // [heads][head_dim][head_dim] when qjl
};

/// Rows of positions [first, first + count) of every head; row (h, i) at index h·head_stride + i.
struct rows_run {
  const std::byte* codes = nullptr;
  const float* scales = nullptr;
  const std::byte* signs = nullptr;
  const float* residual_norms = nullptr;
  std::size_t first = 0, count = 0, head_stride = 0;
};

/// The plain format of a ringkv::compressed_format (a template, so this header needs no module).
template <class Format>
rows_format format_of(const Format& f) noexcept {
  return rows_format{f.kind != decltype(f.kind)::turboquant,
                     f.heads,
                     f.head_dim,
                     f.bits,
                     f.code_bytes,
                     f.qjl,
                     f.sign_bytes,
                     f.centroids,
                     f.rotations,
                     f.rotation_floats,
                     f.hadamard,
                     f.projections};
}

/// The plain run of a ringkv::compressed_view whose first row is at absolute position `first`.
template <class View>
rows_run run_of(const View& v, std::size_t first) noexcept {
  return rows_run{v.codes, v.scales, v.signs, v.residual_norms, first, v.positions, v.head_stride};
}

/// Code i of a row of `bits`-bit codes.
inline std::uint8_t code_at(const std::byte* packed, unsigned bits, std::size_t i) noexcept {
  const std::size_t bit = i * bits;
  unsigned v = unsigned(packed[bit / 8]) >> (bit % 8);
  if (bit % 8 + bits > 8) v |= unsigned(packed[bit / 8 + 1]) << (8 - bit % 8);
  return std::uint8_t(v & ((1u << bits) - 1));
}

/// Packs n codes of `bits` bits (n·bits/8 bytes rounded up, zeroed first).
inline void pack(const std::uint8_t* codes, std::size_t n, unsigned bits, std::byte* out) noexcept {
  std::memset(out, 0, (n * bits + 7) / 8);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t bit = i * bits;
    const unsigned v = unsigned(codes[i]) << (bit % 8);
    out[bit / 8] |= std::byte(v & 0xff);
    if (bit % 8 + bits > 8) out[bit / 8 + 1] |= std::byte(v >> 8);
  }
}

/// In place, unnormalised: x ← H·x, H the Sylvester Hadamard matrix of size n (a power of two).
inline void walsh_hadamard(float* x, std::size_t n) noexcept {
  for (std::size_t h = 1; h < n; h *= 2)
    for (std::size_t i = 0; i < n; i += 2 * h)
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

/// out = Π·in for a rotation state (Hadamard: out may alias in).
inline void rotate(const float* state, bool hadamard, std::size_t d, const float* in,
                   float* out) noexcept {
  if (hadamard) {  // (1/√d)·H·D·in, the signs stored as ±1/√d
    for (std::size_t i = 0; i < d; ++i) out[i] = in[i] * state[i];
    walsh_hadamard(out, d);
    return;
  }
  for (std::size_t r = 0; r < d; ++r) {
    const float* row = state + r * d;
    float acc = 0;
    for (std::size_t i = 0; i < d; ++i) acc += row[i] * in[i];
    out[r] = acc;
  }
}

/// out = Πᵀ·in, the exact inverse (Hadamard: out may alias in).
inline void rotate_back(const float* state, bool hadamard, std::size_t d, const float* in,
                        float* out) noexcept {
  if (hadamard) {  // D·(1/√d)·H·in: H is symmetric and H·H = d·I
    if (out != in) std::memcpy(out, in, d * sizeof(float));
    walsh_hadamard(out, d);
    for (std::size_t i = 0; i < d; ++i) out[i] *= state[i];
    return;
  }
  for (std::size_t i = 0; i < d; ++i) out[i] = 0;
  for (std::size_t r = 0; r < d; ++r) {
    const float* row = state + r * d;
    const float a = in[r];
    for (std::size_t i = 0; i < d; ++i) out[i] += a * row[i];
  }
}

/// The QJL constant sqrt(π/2)/d.
inline double qjl_scale(std::size_t d) noexcept {
  return 1.2533141373155002512078826424055 / double(d);
}

/// Decodes row (h, p) of run `v` to f32 in out[head_dim] (original coordinates): int8 scale ·
/// code; TurboQuant ‖x‖·Πᵀ·c[codes] (+ ‖x‖·‖r‖·qjl_scale·Sᵀ·signs).
inline void decode_row(const rows_format& f, std::size_t h, const rows_run& v, std::size_t p,
                       float* out) noexcept {
  const std::size_t d = f.head_dim, row = h * v.head_stride + p;
  const std::byte* codes = v.codes + row * f.code_bytes;
  const float scale = v.scales[row];
  if (f.int8) {
    for (std::size_t i = 0; i < d; ++i) out[i] = scale * float(static_cast<std::int8_t>(codes[i]));
    return;
  }
  const float* state = f.rotations + h * f.rotation_floats;
  if (f.hadamard) {
    for (std::size_t i = 0; i < d; ++i) out[i] = f.centroids[code_at(codes, f.bits, i)];
    rotate_back(state, true, d, out, out);
  } else {  // Πᵀ·y = Σ_r y_r · (row r of Π), streaming the codes
    for (std::size_t i = 0; i < d; ++i) out[i] = 0;
    for (std::size_t r = 0; r < d; ++r) {
      const float y = f.centroids[code_at(codes, f.bits, r)];
      for (std::size_t i = 0; i < d; ++i) out[i] += y * state[r * d + i];
    }
  }
  for (std::size_t i = 0; i < d; ++i) out[i] *= scale;
  if (!f.qjl) return;
  const std::byte* signs = v.signs + row * f.sign_bytes;
  const float gamma = float(scale * v.residual_norms[row] * qjl_scale(d));
  const float* s = f.projections + h * d * d;
  for (std::size_t k = 0; k < d; ++k) {
    const float z = code_at(signs, 1, k) ? gamma : -gamma;
    for (std::size_t i = 0; i < d; ++i) out[i] += z * s[k * d + i];
  }
}

}  // namespace ringkv::codec
