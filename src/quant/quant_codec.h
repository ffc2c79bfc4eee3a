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
  std::size_t code_bytes = 0;  // per row, LSB-first bit stream (rows layout)
  bool qjl = false;
  std::size_t sign_bytes = 0;        // per row when qjl (rows layout)
  const float* centroids = nullptr;  // 2^bits
  const float* rotations = nullptr;  // [heads][rotation_floats]
  std::size_t rotation_floats = 0;   // head_dim (Hadamard signs ±1/√d) or head_dim²
  bool hadamard = false;
  const float* projections = nullptr;  // [heads][head_dim][head_dim] when qjl
  bool grouped = false;                // codes and signs in slot groups (see group_bytes)
};

/// Positions [first, first + count) of every head, in slots [slot, slot + count); row (h, i) is
/// slot + i of head h, at index h·head_stride + slot + i of the scales and residual norms, and
/// of the codes and signs (rows layout: row_bytes each; groups: see group_bytes). The pointers
/// are the side's buffers (head 0, slot 0).
struct rows_run {
  const std::byte* codes = nullptr;
  const float* scales = nullptr;
  const std::byte* signs = nullptr;
  const float* residual_norms = nullptr;
  std::size_t first = 0, count = 0, head_stride = 0, slot = 0;
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
                     f.projections,
                     f.grouped};
}

/// The plain run of a ringkv::compressed_view whose first row is at absolute position `first`.
template <class View>
rows_run run_of(const View& v, std::size_t first) noexcept {
  return rows_run{v.codes, v.scales,    v.signs,       v.residual_norms,
                  first,   v.positions, v.head_stride, v.first_slot};
}

// The slot-group layout of TurboQuant keys (codes and QJL signs), read by the kernels' fast scan
// (quant_simd.cpp): a head's slots are taken 32 at a time, and a group's codes are stored by
// coordinate in 16-byte units, the code of slot b (b < 16) in byte b's low nibble and that of
// slot b + 16 in its high nibble, so that one byte shuffle looks up 16 slots' codes at once.
// A nibble holds the codes of 4 / bits consecutive coordinates (1, 2 and 4 bits: unit u holds
// coordinates u·(4 / bits) …, the first in the nibble's low bits); units are padded to a multiple
// of 4 (a 512-bit vector's). 3-bit codes take a byte a slot: per octet of coordinates 8o … 8o + 7
// three planes of 32 bytes (slot b at byte b), plane p holding coordinate 8o + 2p in bits 0-2 and
// 8o + 2p + 1 in bits 3-5, and in bits 6-7 bits 2p, 2p + 1 of the pair index of 8o + 6 and
// 8o + 7 (their codes c6 | c7 << 3): each plane is two codes' 6-bit pair index as it stands, a
// 64-entry byte permute's (VPERMB) or two 16-entry shuffles'. Octets go in twos, plane p of both
// side by side (64 bytes: 2o's, then 2o + 1's), so a vector of 64 bytes holds one plane of 16
// coordinates. Coordinates past head_dim hold code 0.

/// Slots in a group.
inline constexpr std::size_t group_slots = 32;

/// Bytes a TurboQuant store keeps after its value codes' last row: the kernels' loads of 3-bit
/// rows read up to 16 bytes past a row (64 bytes for a 48-byte chunk, 32 for a 24-byte one).
inline constexpr std::size_t value_code_padding = 16;

/// Units of a group of `bits`-bit codes (1, 2, 4) of `d` coordinates (a multiple of 4).
inline std::size_t group_units(std::size_t d, unsigned bits) noexcept {
  const std::size_t per_unit = 4 / bits;
  return ((d + per_unit - 1) / per_unit + 3) / 4 * 4;
}

/// Pairs of octets (16 coordinates, 192 bytes) of a group of 3-bit codes of `d` coordinates.
inline std::size_t group_sixteens(std::size_t d) noexcept { return (d + 15) / 16; }

/// Bytes of one group of `bits`-bit codes (bits 1 to 4) of `d` coordinates.
inline std::size_t group_bytes(std::size_t d, unsigned bits) noexcept {
  return bits == 3 ? 192 * group_sixteens(d) : 16 * group_units(d, bits);
}

/// Slots a head's groups take: `capacity` rounded up to whole groups.
inline std::size_t group_capacity(std::size_t capacity) noexcept {
  return (capacity + group_slots - 1) / group_slots * group_slots;
}

/// Where the bits of coordinate i of slot b (< group_slots) of a group lie: `width` bits at
/// `shift` of `byte` (1, 2, 4 bits: the whole code), or for 3 bits bit `bit` of the code alone.
struct group_place {
  std::size_t byte = 0;
  unsigned shift = 0, width = 0;
};
inline group_place place_in_group(unsigned bits, std::size_t b, std::size_t i,
                                  unsigned bit = 0) noexcept {
  if (bits != 3) {
    const std::size_t per_unit = 4 / bits;
    return {16 * (i / per_unit) + b % 16, unsigned(4 * (b / 16) + bits * (i % per_unit)), bits};
  }
  // octet 2·t + s of coordinates; k: coordinate i's place in its octet
  const std::size_t t = i / 16, s = i / 8 % 2, k = i % 8;
  const std::size_t p = k < 6 ? k / 2 : (3 * (k - 6) + bit) / 2;
  const unsigned shift = k < 6 ? unsigned(3 * (k % 2) + bit) : 6 + (3 * (k - 6) + bit) % 2;
  return {192 * t + 64 * p + 32 * s + b, shift, 1};
}

/// Code of coordinate i of slot b of the group at `group`.
inline std::uint8_t grouped_code_at(const std::byte* group, unsigned bits, std::size_t b,
                                    std::size_t i) noexcept {
  unsigned v = 0;
  for (unsigned bit = 0; bit < (bits == 3 ? 3u : 1u); ++bit) {
    const group_place at = place_in_group(bits, b, i, bit);
    v |= ((unsigned(group[at.byte]) >> at.shift) & ((1u << at.width) - 1)) << bit;
  }
  return std::uint8_t(v);
}

/// Writes the d codes of slot b into the group at `group` (its other slots unchanged).
inline void grouped_store(std::byte* group, std::size_t d, unsigned bits, std::size_t b,
                          const std::uint8_t* codes) noexcept {
  for (std::size_t i = 0; i < d; ++i)
    for (unsigned bit = 0; bit < (bits == 3 ? 3u : 1u); ++bit) {
      const group_place at = place_in_group(bits, b, i, bit);
      const unsigned mask = ((1u << at.width) - 1) << at.shift;
      group[at.byte] = std::byte((unsigned(group[at.byte]) & ~mask) |
                                 ((unsigned(codes[i]) >> bit << at.shift) & mask));
    }
}

/// The group holding slot `slot` of head h of a side whose heads take `head_stride` slots.
inline const std::byte* group_of(const std::byte* codes, std::size_t d, unsigned bits,
                                 std::size_t h, std::size_t head_stride,
                                 std::size_t slot) noexcept {
  return codes + (h * head_stride + slot) / group_slots * group_bytes(d, bits);
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

/// Reads the codes of one row (h, p) of run `v`: `bits` bits a coordinate from `codes` (a run's
/// codes or signs; rows layout: row_bytes a row).
struct row_reader {
  const std::byte* at;  // the row (rows layout) or its group
  std::size_t d, slot;  // slot within the group
  unsigned bits;
  bool grouped;
  row_reader(const rows_format& f, const std::byte* codes, unsigned code_bits,
             std::size_t row_bytes, std::size_t h, const rows_run& v, std::size_t p) noexcept
      : d(f.head_dim), slot((v.slot + p) % group_slots), bits(code_bits), grouped(f.grouped) {
    at = grouped ? group_of(codes, d, bits, h, v.head_stride, v.slot + p)
                 : codes + (h * v.head_stride + v.slot + p) * row_bytes;
  }
  std::uint8_t operator()(std::size_t i) const noexcept {
    return grouped ? grouped_code_at(at, bits, slot, i) : code_at(at, bits, i);
  }
};

/// Decodes row (h, p) of run `v` to f32 in out[head_dim] (original coordinates): int8 scale ·
/// code; TurboQuant ‖x‖·Πᵀ·c[codes] (+ ‖x‖·‖r‖·qjl_scale·Sᵀ·signs).
inline void decode_row(const rows_format& f, std::size_t h, const rows_run& v, std::size_t p,
                       float* out) noexcept {
  const std::size_t d = f.head_dim, row = h * v.head_stride + v.slot + p;
  const float scale = v.scales[row];
  if (f.int8) {
    const std::byte* codes = v.codes + row * f.code_bytes;
    for (std::size_t i = 0; i < d; ++i) out[i] = scale * float(static_cast<std::int8_t>(codes[i]));
    return;
  }
  const row_reader code(f, v.codes, f.bits, f.code_bytes, h, v, p);
  const float* state = f.rotations + h * f.rotation_floats;
  if (f.hadamard) {
    for (std::size_t i = 0; i < d; ++i) out[i] = f.centroids[code(i)];
    rotate_back(state, true, d, out, out);
  } else {  // Πᵀ·y = Σ_r y_r · (row r of Π), streaming the codes
    for (std::size_t i = 0; i < d; ++i) out[i] = 0;
    for (std::size_t r = 0; r < d; ++r) {
      const float y = f.centroids[code(r)];
      for (std::size_t i = 0; i < d; ++i) out[i] += y * state[r * d + i];
    }
  }
  for (std::size_t i = 0; i < d; ++i) out[i] *= scale;
  if (!f.qjl) return;
  const row_reader sign(f, v.signs, 1, f.sign_bytes, h, v, p);
  const float gamma = float(scale * v.residual_norms[row] * qjl_scale(d));
  const float* s = f.projections + h * d * d;
  for (std::size_t k = 0; k < d; ++k) {
    const float z = sign(k) ? gamma : -gamma;
    for (std::size_t i = 0; i < d; ++i) out[i] += z * s[k * d + i];
  }
}

}  // namespace ringkv::codec
