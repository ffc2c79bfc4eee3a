// ringkv.format — how a K/V row is stored: the format table. One entry per format holds its
// name, the kernel family that reads it, its bits a coordinate and side planes, the largest value
// it stores, its snapshot tag and (element formats) its encode and decode; every place that asks
// "which format is this row" reads the entry, so a new format is one entry (docs/design.md §3.8).
module;
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
export module ringkv.format;

export namespace ringkv {

/// Element type of a tensor: a row of one of these is head_dim elements of one type. f16, bf16
/// and fp8_e4m3 (OCP FP8 E4M3FN) are stored as their bit patterns.
enum class dtype : std::uint8_t { f32, f16, bf16, fp8_e4m3 };

/// Every row format a store can hold: the element types (same values as dtype's), then the
/// compressed ones, whose rows are codes with side planes.
enum class kv_encoding : std::uint8_t { f32, f16, bf16, fp8_e4m3, int8, turboquant };

/// Which kernels attend rows of a format.
enum class kernel_family : std::uint8_t {
  elements,    // kernels::decode / prefill: each element promoted to f32 in registers
  int8,        // compressed_kv_attention: exact integer dots, one f32 scale a row
  turboquant,  // compressed_kv_attention: codebook lookups, one f32 norm a row (QJL: signs too)
};

/// The conversions of the element formats: n coordinates from f32 to the stored bits, each
/// rounded once to nearest even (finite inputs the format can store: see format_traits), and
/// back, exactly. What stores write and read and what a prefill's chunk rows are rounded with.
namespace codecs {
using encoder = void (*)(std::byte* dst, const float* src, std::size_t n) noexcept;
using decoder = void (*)(float* dst, const std::byte* src, std::size_t n) noexcept;
void encode_f32(std::byte* dst, const float* src, std::size_t n) noexcept;
void decode_f32(float* dst, const std::byte* src, std::size_t n) noexcept;
void encode_f16(std::byte* dst, const float* src, std::size_t n) noexcept;
void decode_f16(float* dst, const std::byte* src, std::size_t n) noexcept;
void encode_bf16(std::byte* dst, const float* src, std::size_t n) noexcept;
void decode_bf16(float* dst, const std::byte* src, std::size_t n) noexcept;
void encode_fp8_e4m3(std::byte* dst, const float* src, std::size_t n) noexcept;
void decode_fp8_e4m3(float* dst, const std::byte* src, std::size_t n) noexcept;
}  // namespace codecs

/// One entry of the format table.
struct format_traits {
  std::string_view name;  // as messages, snapshots' readers and gguf_run --cache name it
  kernel_family family;
  std::size_t element_bytes;  // bytes a coordinate (element formats; 1 for int8; 0: bit-packed)
  bool scale_plane;           // one f32 a row beside the codes (int8: absmax/127; TurboQuant: norm)
  // Smallest |x| that rounds past the largest finite value (infinity: every finite x is held):
  // a store of this format refuses such keys and values (require_storable).
  float unstorable;
  std::string_view largest;  // the largest finite value, as a refusal prints it
  // The byte a snapshot records: the element type of a default store's keys and values, or the
  // store kind of a compressed store (docs/snapshots.md).
  std::uint8_t snapshot_tag;
  codecs::encoder encode;  // element formats; null for codes (their stores hold the codecs)
  codecs::decoder decode;
};

/// The format table: the entry of `e`; O(1). An exhaustive switch, so an encoding without an
/// entry does not compile (-Werror=switch-enum).
constexpr format_traits traits_of(kv_encoding e) noexcept {
  using namespace codecs;
  constexpr float all = std::numeric_limits<float>::infinity();
  constexpr auto elements = kernel_family::elements;
  // clang-format off: one row an entry
  switch (e) {  // name, family, bytes, scale plane, unstorable, largest, snapshot tag, codecs
    case kv_encoding::f32:
      return {"f32", elements, 4, false, all, "3.40e38", 0, encode_f32, decode_f32};
    case kv_encoding::f16:  // 65504 + half an ulp: a tie that rounds up (65504 ends in 1)
      return {"f16", elements, 2, false, 65520.0f, "65504", 1, encode_f16, decode_f16};
    case kv_encoding::bf16:
      return {"bf16", elements, 2, false, 0x1.ffp127f, "3.39e38", 2, encode_bf16, decode_bf16};
    case kv_encoding::fp8_e4m3:  // 448 + half an ulp = 464 is a tie that rounds down (to even)
      return {"fp8_e4m3", elements, 1, false, 0x1.d00002p8f, "448", 3, encode_fp8_e4m3,
              decode_fp8_e4m3};
    case kv_encoding::int8:
      return {"int8", kernel_family::int8, 1, true, all, "3.40e38", 3, nullptr, nullptr};
    case kv_encoding::turboquant:
      return {"turboquant", kernel_family::turboquant, 0, true, all, "3.40e38", 2, nullptr,
              nullptr};
  }
  // clang-format on
  return {};  // unreachable: every encoding has its case
}

/// The encoding whose rows are elements of `t`; O(1).
constexpr kv_encoding encoding_of(dtype t) noexcept { return kv_encoding(std::uint8_t(t)); }
/// The format table's entry of element type `t`; O(1).
constexpr format_traits traits_of(dtype t) noexcept { return traits_of(encoding_of(t)); }
/// Bytes per element of `t`; O(1).
constexpr std::size_t size_of(dtype t) noexcept { return traits_of(t).element_bytes; }
/// The dtype's name ("f32", "f16", "bf16", "fp8_e4m3"); O(1).
constexpr std::string_view name_of(dtype t) noexcept { return traits_of(t).name; }
/// Every element type, in the order of their values.
inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3};

}  // namespace ringkv
