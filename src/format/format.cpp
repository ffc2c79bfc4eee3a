// The element formats' codecs of the format table (modules/format.cppm): f32 copied, f16, bf16 and
// fp8 E4M3FN rounded once to nearest even on the way in and promoted exactly on the way out.
module;
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "format/elements.hpp"
module ringkv.format;

namespace ringkv::codecs {
namespace {

/// Each of n elements of Bits converted by `to_bits`, stored at dst (any alignment).
template <class Bits, class ToBits>
void encode_each(std::byte* dst, const float* src, std::size_t n, ToBits to_bits) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const Bits bits = to_bits(src[i]);
    std::memcpy(dst + sizeof(Bits) * i, &bits, sizeof(Bits));
  }
}

/// Each of n elements of Bits at src (any alignment) promoted by `to_float`.
template <class Bits, class ToFloat>
void decode_each(float* dst, const std::byte* src, std::size_t n, ToFloat to_float) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, src + sizeof(Bits) * i, sizeof(Bits));
    dst[i] = to_float(bits);
  }
}

}  // namespace

void encode_f32(std::byte* dst, const float* src, std::size_t n) noexcept {
  std::memmove(dst, src, n * sizeof(float));  // a store's caller may pass a row of this very slot
}
void decode_f32(float* dst, const std::byte* src, std::size_t n) noexcept {
  std::memcpy(dst, src, n * sizeof(float));
}
void encode_f16(std::byte* dst, const float* src, std::size_t n) noexcept {
  encode_each<std::uint16_t>(dst, src, n, detail::f32_to_f16);
}
void decode_f16(float* dst, const std::byte* src, std::size_t n) noexcept {
  decode_each<std::uint16_t>(dst, src, n, detail::f16_to_f32);
}
void encode_bf16(std::byte* dst, const float* src, std::size_t n) noexcept {
  encode_each<std::uint16_t>(dst, src, n, detail::f32_to_bf16);
}
void decode_bf16(float* dst, const std::byte* src, std::size_t n) noexcept {
  decode_each<std::uint16_t>(dst, src, n, detail::bf16_to_f32);
}
void encode_fp8_e4m3(std::byte* dst, const float* src, std::size_t n) noexcept {
  encode_each<std::uint8_t>(dst, src, n, detail::f32_to_fp8_e4m3);
}
void decode_fp8_e4m3(float* dst, const std::byte* src, std::size_t n) noexcept {
  decode_each<std::uint8_t>(dst, src, n, detail::fp8_e4m3_to_f32);
}

}  // namespace ringkv::codecs
