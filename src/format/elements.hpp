// f32 <-> f16 / bf16 / fp8 E4M3FN conversions of one element, rounding to nearest even: the
// format table's element codecs (format.cpp). Internal: included by that implementation unit only.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>

namespace ringkv::detail {

/// f32 -> IEEE binary16 bits, round to nearest even; overflow gives inf, NaN stays a quiet NaN.
/// Needs the default FP rounding mode (no -ffast-math): the subnormal path rounds in hardware.
inline std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  std::uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u)  // inf or NaN (NaN keeps its top payload bits and is made quiet)
    return sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u | ((mag >> 13) & 0x3ffu) : 0u);
  if (mag >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds past 65504: inf
  if (mag < 0x38800000u) {
    // Below 2^-14 the result is subnormal: adding 0.5 puts the f16 subnormal step (2^-24) at the
    // f32 ulp of 0.5, so the FPU's add rounds to nearest even for us.
    const float shifted = std::bit_cast<float>(mag) + 0.5f;
    return sign | static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u);
  }
  const std::uint32_t odd = (mag >> 13) & 1u;
  mag += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round half even
  return sign | static_cast<std::uint16_t>(mag >> 13);
}

/// IEEE binary16 bits -> f32 (exact).
inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24 is exact in f32
    const float v = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/// f32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
inline std::uint16_t f32_to_bf16(float f) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

/// bfloat16 bits -> f32 (exact).
inline float bf16_to_f32(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// f32 -> OCP FP8 E4M3FN bits (4 exponent bits, bias 7, 3 mantissa bits; no infinity), round to
/// nearest even. For |f| up to 464 (ties round to 448, the largest finite); larger magnitudes
/// saturate to 448 (the store refuses them first), NaN gives NaN (0x7f with the sign).
inline std::uint8_t f32_to_fp8_e4m3(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  std::uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7fu;
  if (mag > 0x43e80000u) return sign | 0x7eu;  // past 464: saturate (refused before)
  if (mag < 0x3c800000u) {
    // Below 2^-6 the result is subnormal, a multiple of 2^-9: scaling by 2^9 is exact, and the
    // FPU's conversion in the default mode rounds to nearest even (8 becomes 2^-6, code 0x08).
    return sign | static_cast<std::uint8_t>(std::nearbyint(std::bit_cast<float>(mag) * 512.0f));
  }
  const std::uint32_t odd = (mag >> 20) & 1u;
  mag += 0x7ffffu + odd - (static_cast<std::uint32_t>(127 - 7) << 23);  // round, rebias
  return sign | static_cast<std::uint8_t>(mag >> 20);
}

/// OCP FP8 E4M3FN bits -> f32 (exact; 0x7f and 0xff are NaN).
inline float fp8_e4m3_to_f32(std::uint8_t b) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t mag = b & 0x7fu;
  if (mag == 0x7f) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (mag < 0x08) {  // zero or subnormal: mantissa * 2^-9 is exact in f32
    const float v = static_cast<float>(mag) * 0x1p-9f;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
  }
  return std::bit_cast<float>(sign | ((mag << 20) + (static_cast<std::uint32_t>(127 - 7) << 23)));
}

}  // namespace ringkv::detail
