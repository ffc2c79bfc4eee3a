// A strict GGUF v3 reader and a writer, for the model runner and the model maker. The reader
// takes F32, F16 and BF16 tensors and refuses anything it cannot vouch for (quantized tensor
// types, nested arrays, overlapping or misaligned data, counts the file cannot hold) with
// gguf::format_error, which names the field and its byte offset. No ringkv or Highway here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace gguf {

/// A malformed or unsupported file: what was wrong, the field and the byte offset it sits at.
class format_error : public std::runtime_error {
 public:
  format_error(std::string field, std::uint64_t offset, const std::string& what);
  /// The field that was refused, e.g. "tensor 3 (blk.0.attn_q.weight) offset".
  const std::string& field() const noexcept { return field_; }
  /// Byte offset of that field in the file.
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::string field_;
  std::uint64_t offset_;
};

/// GGUF metadata value types (the numbers are the format's).
enum class value_type : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

/// Tensor element types this reader takes (ggml's numbers).
enum class tensor_type : std::uint32_t { f32 = 0, f16 = 1, bf16 = 30 };

/// Bytes of one element of `t`.
std::size_t element_size(tensor_type t) noexcept;

/// One scalar: unsigned and signed integers widened, floats as double, bool, string.
using scalar = std::variant<std::uint64_t, std::int64_t, double, bool, std::string>;

/// A metadata value: a scalar of `type`, or an array of scalars of `element` (type == array).
struct value {
  value_type type = value_type::u32;
  value_type element = value_type::u32;  // arrays only
  scalar one;
  std::vector<scalar> many;
};

/// A tensor's description and its bytes inside the file's buffer.
struct tensor_info {
  std::string name;
  std::vector<std::uint64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) one
  tensor_type type = tensor_type::f32;
  std::uint64_t offset = 0;         // from the start of the data section
  std::span<const std::byte> data;  // element_size(type) * product(dims) bytes
  /// Elements in all.
  std::uint64_t elements() const noexcept;
};

/// A parsed GGUF file; owns its bytes. Every check happens in the constructor.
class file {
 public:
  /// Parses and checks `bytes` (the whole file). Throws format_error naming field and offset.
  /// O(size of the header and metadata); tensor data is not read, only bounded.
  explicit file(std::vector<std::byte> bytes);
  /// Reads `path` whole and parses it; a file that cannot be read throws std::runtime_error.
  static file read(const std::string& path);

  /// Metadata by key; null when absent. O(log keys).
  const value* find(std::string_view key) const;
  /// The tensor of that name; null when absent. O(log tensors).
  const tensor_info* find_tensor(std::string_view name) const;
  const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, value, std::less<>>& metadata() const noexcept { return kv_; }
  std::uint32_t alignment() const noexcept { return alignment_; }

  /// Typed getters: throw format_error (field = the key) when absent (and `required`) or of
  /// another type; an integer getter takes any integer type whose value fits.
  std::uint32_t get_u32(std::string_view key) const;
  std::uint32_t get_u32(std::string_view key, std::uint32_t otherwise) const;
  float get_f32(std::string_view key) const;
  float get_f32(std::string_view key, float otherwise) const;
  std::string get_string(std::string_view key) const;
  /// An integer or bool array as unsigned values.
  std::vector<std::uint64_t> get_uint_array(std::string_view key) const;

 private:
  std::vector<std::byte> bytes_;
  std::map<std::string, value, std::less<>> kv_;
  std::map<std::string, std::uint64_t, std::less<>> kv_offset_;  // where each key's value sits
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
  std::uint32_t alignment_ = 32;

  const value& need(std::string_view key) const;
  [[noreturn]] void wrong_type(std::string_view key, const char* wanted) const;
};

/// Builds a GGUF v3 file in memory: metadata in the order added, then tensor infos and the
/// aligned data (alignment 32, the format's default, not written as a key).
class writer {
 public:
  void add_u32(std::string key, std::uint32_t v);
  void add_f32(std::string key, float v);
  void add_string(std::string key, std::string v);
  void add_bool_array(std::string key, const std::vector<bool>& v);
  void add_u32_array(std::string key, const std::vector<std::uint32_t>& v);
  /// A tensor of `type` and `dims` (ggml order) whose bytes are `data` (size checked).
  void add_tensor(std::string name, std::vector<std::uint64_t> dims, tensor_type type,
                  std::vector<std::byte> data);
  /// The whole file.
  std::vector<std::byte> bytes() const;
  /// Writes bytes() to `path`; throws std::runtime_error when it cannot.
  void write(const std::string& path) const;

 private:
  std::vector<std::byte> kv_;  // encoded key/value pairs
  std::uint64_t kv_count_ = 0;
  struct pending {
    std::string name;
    std::vector<std::uint64_t> dims;
    tensor_type type;
    std::vector<std::byte> data;
  };
  std::vector<pending> tensors_;
};

/// Decodes IEEE half and bfloat16 bits to float (exact).
float half_to_float(std::uint16_t h) noexcept;
float bf16_to_float(std::uint16_t h) noexcept;
/// Rounds a float to the nearest half / bfloat16 (ties to even; overflow to ±Inf).
std::uint16_t float_to_half(float f) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;

/// A tensor's elements as floats (F16/BF16 widened exactly).
std::vector<float> to_floats(const tensor_info& t);

}  // namespace gguf
