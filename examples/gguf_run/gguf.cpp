// GGUF v3 layout (all integers little-endian):
//   u32 magic "GGUF", u32 version (3), u64 tensor_count, u64 kv_count,
//   kv_count × { string key, u32 value_type, value },
//   tensor_count × { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset },
//   padding to general.alignment (default 32), then the data section; each tensor's bytes at
//   data_start + offset, offsets multiples of the alignment.
//   string = u64 length + bytes; array = u32 element type + u64 count + elements.
#include "gguf.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>

namespace gguf {
namespace {

constexpr std::uint32_t magic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr std::uint32_t version = 3;
// ggml's limits: a tensor name of at most 63 bytes (GGML_MAX_NAME 64 with its NUL), four dims.
constexpr std::size_t max_name = 63, max_dims = 4;
// Keys are ASCII identifiers; the format caps them at 65535 bytes.
constexpr std::size_t max_key = 65535;

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes little-endian");

std::string type_name(value_type t) {
  switch (t) {
    case value_type::u8:
      return "u8";
    case value_type::i8:
      return "i8";
    case value_type::u16:
      return "u16";
    case value_type::i16:
      return "i16";
    case value_type::u32:
      return "u32";
    case value_type::i32:
      return "i32";
    case value_type::f32:
      return "f32";
    case value_type::boolean:
      return "bool";
    case value_type::string:
      return "string";
    case value_type::array:
      return "array";
    case value_type::u64:
      return "u64";
    case value_type::i64:
      return "i64";
    case value_type::f64:
      return "f64";
  }
  return "type " + std::to_string(static_cast<std::uint32_t>(t));
}

/// Bounds-checked reads from the file's bytes; every refusal names the field and its offset.
class cursor {
 public:
  explicit cursor(std::span<const std::byte> b) : b_(b) {}
  std::uint64_t at() const noexcept { return pos_; }
  std::uint64_t left() const noexcept { return b_.size() - pos_; }

  template <class T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& field, std::size_t max) {
    const std::uint64_t start = pos_;
    const auto n = read<std::uint64_t>(field + " length");
    if (n > max)
      throw format_error(field + " length", start,
                         std::to_string(n) + " exceeds " + std::to_string(max));
    if (n > left())
      throw format_error(
          field + " length", start,
          std::to_string(n) + " bytes but only " + std::to_string(left()) + " remain in the file");
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void need(std::uint64_t n, const std::string& field) const {
    if (n > left())
      throw format_error(field, pos_,
                         "needs " + std::to_string(n) + " bytes but the file ends " +
                             std::to_string(left()) + " bytes later");
  }

 private:
  std::span<const std::byte> b_;
  std::uint64_t pos_ = 0;
};

/// Smallest encoded size of a value of type t (bounds array counts before anything is
/// allocated: a count larger than the bytes left could hold is refused).
std::uint64_t min_size(value_type t) {
  switch (t) {
    case value_type::u8:
    case value_type::i8:
    case value_type::boolean:
      return 1;
    case value_type::u16:
    case value_type::i16:
      return 2;
    case value_type::u32:
    case value_type::i32:
    case value_type::f32:
      return 4;
    case value_type::u64:
    case value_type::i64:
    case value_type::f64:
    case value_type::string:
      return 8;
    case value_type::array:
      return 12;
  }
  return 1;
}

bool known(std::uint32_t t) { return t <= static_cast<std::uint32_t>(value_type::f64); }

scalar read_scalar(cursor& c, value_type t, const std::string& field) {
  switch (t) {
    case value_type::u8:
      return std::uint64_t(c.read<std::uint8_t>(field));
    case value_type::i8:
      return std::int64_t(c.read<std::int8_t>(field));
    case value_type::u16:
      return std::uint64_t(c.read<std::uint16_t>(field));
    case value_type::i16:
      return std::int64_t(c.read<std::int16_t>(field));
    case value_type::u32:
      return std::uint64_t(c.read<std::uint32_t>(field));
    case value_type::i32:
      return std::int64_t(c.read<std::int32_t>(field));
    case value_type::f32:
      return double(c.read<float>(field));
    case value_type::u64:
      return c.read<std::uint64_t>(field);
    case value_type::i64:
      return c.read<std::int64_t>(field);
    case value_type::f64:
      return c.read<double>(field);
    case value_type::boolean: {
      const std::uint64_t at = c.at();
      const auto b = c.read<std::uint8_t>(field);
      if (b > 1) throw format_error(field, at, "bool byte " + std::to_string(b) + " is not 0 or 1");
      return b == 1;
    }
    case value_type::string:
      return c.string(field, std::numeric_limits<std::uint64_t>::max());
    case value_type::array:
      break;
  }
  throw format_error(field, c.at(), "nested arrays are not supported");
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

void put_bytes(std::vector<std::byte>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put(std::vector<std::byte>& out, T v) {
  put_bytes(out, &v, sizeof v);
}
void put_string(std::vector<std::byte>& out, const std::string& s) {
  put<std::uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

}  // namespace

format_error::format_error(std::string field, std::uint64_t offset, const std::string& what)
    : std::runtime_error("gguf: " + field + " at byte " + std::to_string(offset) + ": " + what),
      field_(std::move(field)), offset_(offset) {}

std::size_t element_size(tensor_type t) noexcept { return t == tensor_type::f32 ? 4 : 2; }

std::uint64_t tensor_info::elements() const noexcept {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  return n;
}

file::file(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {
  cursor c(bytes_);
  const std::uint64_t magic_at = c.at();
  if (const auto m = c.read<std::uint32_t>("magic"); m != magic)
    throw format_error("magic", magic_at, "not a GGUF file (the first 4 bytes are not \"GGUF\")");
  const std::uint64_t version_at = c.at();
  if (const auto v = c.read<std::uint32_t>("version"); v != version)
    throw format_error("version", version_at,
                       "version " + std::to_string(v) + " (this reader takes version 3)");
  const std::uint64_t tensor_count_at = c.at();
  const auto tensor_count = c.read<std::uint64_t>("tensor_count");
  const std::uint64_t kv_count_at = c.at();
  const auto kv_count = c.read<std::uint64_t>("kv_count");
  // Each key/value takes at least 8 + 1 + 4 + 1 bytes and each tensor info 8 + 1 + 4 + 8 + 4 + 8:
  // larger counts cannot be in the file (refused before anything is reserved).
  if (kv_count > c.left() / 14)
    throw format_error("kv_count", kv_count_at,
                       std::to_string(kv_count) + " key/values cannot fit in the " +
                           std::to_string(c.left()) + " bytes that follow");
  if (tensor_count > c.left() / 33)
    throw format_error("tensor_count", tensor_count_at,
                       std::to_string(tensor_count) + " tensors cannot fit in the " +
                           std::to_string(c.left()) + " bytes that follow");

  for (std::uint64_t i = 0; i < kv_count; ++i) {
    const std::string at = "key/value " + std::to_string(i);
    const std::uint64_t key_at = c.at();
    std::string key = c.string(at + " key", max_key);
    if (key.empty()) throw format_error(at + " key", key_at, "empty key");
    for (char ch : key)
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e)
        throw format_error(at + " key", key_at, "key is not printable ASCII");
    if (kv_.count(key) != 0) throw format_error(at + " key", key_at, "duplicate key " + key);
    const std::string field = "value of " + key;
    const std::uint64_t type_at = c.at();
    const auto type = c.read<std::uint32_t>(field + " type");
    if (!known(type))
      throw format_error(field + " type", type_at, "unknown value type " + std::to_string(type));
    value v;
    v.type = static_cast<value_type>(type);
    const std::uint64_t value_at = c.at();
    if (v.type == value_type::array) {
      const std::uint64_t element_at = c.at();
      const auto element = c.read<std::uint32_t>(field + " element type");
      if (!known(element))
        throw format_error(field + " element type", element_at,
                           "unknown value type " + std::to_string(element));
      v.element = static_cast<value_type>(element);
      if (v.element == value_type::array)
        throw format_error(field + " element type", element_at, "nested arrays are not supported");
      const std::uint64_t count_at = c.at();
      const auto count = c.read<std::uint64_t>(field + " count");
      if (count > c.left() / min_size(v.element))
        throw format_error(field + " count", count_at,
                           std::to_string(count) + " elements of " + type_name(v.element) +
                               " cannot fit in the " + std::to_string(c.left()) +
                               " bytes that follow");
      v.many.reserve(count);
      for (std::uint64_t j = 0; j < count; ++j)
        v.many.push_back(read_scalar(c, v.element, field + "[" + std::to_string(j) + "]"));
    } else {
      v.one = read_scalar(c, v.type, field);
    }
    kv_offset_.emplace(key, value_at);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const value* a = find("general.alignment")) {
    const std::uint64_t at = kv_offset_.find("general.alignment")->second;
    if (a->type != value_type::u32)
      throw format_error("general.alignment", at, "is " + type_name(a->type) + ", expected u32");
    const auto n = std::get<std::uint64_t>(a->one);
    if (n == 0 || (n & (n - 1)) != 0)
      throw format_error("general.alignment", at, std::to_string(n) + " is not a power of two");
    alignment_ = static_cast<std::uint32_t>(n);
  }

  tensors_.reserve(tensor_count);
  std::vector<std::uint64_t> offset_at(tensor_count);
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    const std::string at = "tensor " + std::to_string(i);
    const std::uint64_t name_at = c.at();
    tensor_info t;
    t.name = c.string(at + " name", max_name);
    if (t.name.empty()) throw format_error(at + " name", name_at, "empty name");
    if (tensor_index_.count(t.name) != 0)
      throw format_error(at + " name", name_at, "duplicate tensor name " + t.name);
    const std::string field = at + " (" + t.name + ")";
    const std::uint64_t dims_at = c.at();
    const auto n_dims = c.read<std::uint32_t>(field + " n_dims");
    if (n_dims == 0 || n_dims > max_dims)
      throw format_error(field + " n_dims", dims_at,
                         std::to_string(n_dims) + " dimensions (1 to 4 are allowed)");
    std::uint64_t elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t dim_at = c.at();
      const auto n = c.read<std::uint64_t>(field + " dims[" + std::to_string(d) + "]");
      // 2^40 elements a dimension and 2^50 in all are far past any model file here, and keep
      // the byte count below from overflowing.
      if (n == 0 || n > (std::uint64_t(1) << 40))
        throw format_error(field + " dims[" + std::to_string(d) + "]", dim_at,
                           std::to_string(n) + " is not in 1 … 2^40");
      if (elements > (std::uint64_t(1) << 50) / n)
        throw format_error(field + " dims[" + std::to_string(d) + "]", dim_at,
                           "the tensor would hold more than 2^50 elements");
      elements *= n;
      t.dims.push_back(n);
    }
    const std::uint64_t type_at = c.at();
    const auto type = c.read<std::uint32_t>(field + " type");
    if (type != 0 && type != 1 && type != 30)
      throw format_error(field + " type", type_at,
                         "ggml type " + std::to_string(type) +
                             " is not supported (F32 = 0, F16 = 1, BF16 = 30; quantized weights "
                             "are out of scope)");
    t.type = static_cast<tensor_type>(type);
    offset_at[i] = c.at();
    t.offset = c.read<std::uint64_t>(field + " offset");
    if (t.offset % alignment_ != 0)
      throw format_error(field + " offset", offset_at[i],
                         std::to_string(t.offset) + " is not a multiple of the alignment " +
                             std::to_string(alignment_));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  const std::uint64_t data_start = align_up(c.at(), alignment_);
  if (data_start > bytes_.size() && tensor_count > 0)
    throw format_error("data section", c.at(),
                       "starts at byte " + std::to_string(data_start) +
                           ", past the end of the file (" + std::to_string(bytes_.size()) +
                           " bytes)");
  const std::uint64_t data_size =
      bytes_.size() - std::min<std::uint64_t>(data_start, bytes_.size());
  // Bounds, then overlaps: sorted by offset, each tensor must end before the next begins.
  std::vector<std::size_t> order(tensors_.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    tensor_info& t = tensors_[i];
    order[i] = i;
    const std::uint64_t n = t.elements() * element_size(t.type);
    if (t.offset > data_size || n > data_size - t.offset)
      throw format_error("tensor " + std::to_string(i) + " (" + t.name + ") offset", offset_at[i],
                         "its " + std::to_string(n) + " bytes at data offset " +
                             std::to_string(t.offset) + " run past the end of the data section (" +
                             std::to_string(data_size) + " bytes)");
    t.data = std::span<const std::byte>(bytes_).subspan(data_start + t.offset, n);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const tensor_info& prev = tensors_[order[k - 1]];
    const tensor_info& t = tensors_[order[k]];
    if (t.offset < prev.offset + prev.data.size())
      throw format_error("tensor " + std::to_string(order[k]) + " (" + t.name + ") offset",
                         offset_at[order[k]], "its data overlaps tensor " + prev.name + "'s");
  }
}

file file::read(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error))
    throw std::runtime_error("gguf: " + path + " is a directory, not a GGUF file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("gguf: cannot open " + path);
  std::vector<char> raw;
  try {
    raw.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    throw std::runtime_error("gguf: cannot read " + path + ": " + e.what());
  }
  if (in.bad()) throw std::runtime_error("gguf: cannot read " + path);
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  return file(std::move(bytes));
}

const value* file::find(std::string_view key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const tensor_info* file::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const value& file::need(std::string_view key) const {
  const value* v = find(key);
  if (v == nullptr) throw format_error(std::string(key), 0, "required key is missing");
  return *v;
}

void file::wrong_type(std::string_view key, const char* wanted) const {
  const auto it = kv_offset_.find(key);
  throw format_error(std::string(key), it->second,
                     "is " + type_name(find(key)->type) + ", expected " + wanted);
}

std::uint32_t file::get_u32(std::string_view key) const {
  const value& v = need(key);
  const auto fits = [&](auto x) {
    if (x < 0 || std::uint64_t(x) > std::numeric_limits<std::uint32_t>::max())
      wrong_type(key, "an integer in 0 … 2^32 - 1");
    return static_cast<std::uint32_t>(x);
  };
  if (v.type == value_type::array || v.type == value_type::string || v.type == value_type::f32 ||
      v.type == value_type::f64 || v.type == value_type::boolean)
    wrong_type(key, "an integer");
  if (const auto* u = std::get_if<std::uint64_t>(&v.one)) {
    if (*u > std::numeric_limits<std::uint32_t>::max()) wrong_type(key, "an integer below 2^32");
    return static_cast<std::uint32_t>(*u);
  }
  return fits(std::get<std::int64_t>(v.one));
}

std::uint32_t file::get_u32(std::string_view key, std::uint32_t otherwise) const {
  return find(key) ? get_u32(key) : otherwise;
}

float file::get_f32(std::string_view key) const {
  const value& v = need(key);
  if (v.type != value_type::f32 && v.type != value_type::f64) wrong_type(key, "f32");
  return static_cast<float>(std::get<double>(v.one));
}

float file::get_f32(std::string_view key, float otherwise) const {
  return find(key) ? get_f32(key) : otherwise;
}

std::string file::get_string(std::string_view key) const {
  const value& v = need(key);
  if (v.type != value_type::string) wrong_type(key, "string");
  return std::get<std::string>(v.one);
}

std::vector<std::uint64_t> file::get_uint_array(std::string_view key) const {
  const value& v = need(key);
  if (v.type != value_type::array) wrong_type(key, "an array");
  std::vector<std::uint64_t> out;
  for (const scalar& s : v.many) {
    if (const auto* u = std::get_if<std::uint64_t>(&s))
      out.push_back(*u);
    else if (const auto* b = std::get_if<bool>(&s))
      out.push_back(*b ? 1 : 0);
    else if (const auto* i = std::get_if<std::int64_t>(&s); i && *i >= 0)
      out.push_back(std::uint64_t(*i));
    else
      wrong_type(key, "an array of unsigned integers or bools");
  }
  return out;
}

void writer::add_u32(std::string key, std::uint32_t v) {
  put_string(kv_, key);
  put(kv_, value_type::u32);
  put(kv_, v);
  ++kv_count_;
}

void writer::add_f32(std::string key, float v) {
  put_string(kv_, key);
  put(kv_, value_type::f32);
  put(kv_, v);
  ++kv_count_;
}

void writer::add_string(std::string key, std::string v) {
  put_string(kv_, key);
  put(kv_, value_type::string);
  put_string(kv_, v);
  ++kv_count_;
}

void writer::add_bool_array(std::string key, const std::vector<bool>& v) {
  put_string(kv_, key);
  put(kv_, value_type::array);
  put(kv_, value_type::boolean);
  put<std::uint64_t>(kv_, v.size());
  for (bool b : v) put<std::uint8_t>(kv_, b ? 1 : 0);
  ++kv_count_;
}

void writer::add_u32_array(std::string key, const std::vector<std::uint32_t>& v) {
  put_string(kv_, key);
  put(kv_, value_type::array);
  put(kv_, value_type::u32);
  put<std::uint64_t>(kv_, v.size());
  for (auto x : v) put(kv_, x);
  ++kv_count_;
}

void writer::add_tensor(std::string name, std::vector<std::uint64_t> dims, tensor_type type,
                        std::vector<std::byte> data) {
  std::uint64_t n = element_size(type);
  for (auto d : dims) n *= d;
  if (n != data.size())
    throw std::invalid_argument("gguf::writer: tensor " + name + " has " +
                                std::to_string(data.size()) + " bytes, its dims say " +
                                std::to_string(n));
  tensors_.push_back({std::move(name), std::move(dims), type, std::move(data)});
}

std::vector<std::byte> writer::bytes() const {
  constexpr std::uint64_t alignment = 32;
  std::vector<std::byte> out;
  put(out, magic);
  put(out, version);
  put<std::uint64_t>(out, tensors_.size());
  put<std::uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  std::uint64_t offset = 0;
  for (const pending& t : tensors_) {
    put_string(out, t.name);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) put(out, d);
    put(out, t.type);
    put(out, offset);
    offset = align_up(offset + t.data.size(), alignment);
  }
  out.resize(align_up(out.size(), alignment));
  for (const pending& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize(align_up(out.size(), alignment));
  }
  return out;
}

void writer::write(const std::string& path) const {
  const std::vector<std::byte> b = bytes();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  out.close();
  if (!out) throw std::runtime_error("gguf: cannot write " + path);
}

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);  // zero or subnormal
    return sign ? -f : f;
  }
  const std::uint32_t bits =
      exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t bits = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // Inf or NaN
    return sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0);
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds to at least 65520: Inf
  if (abs < 0x38800000u) {                       // below the smallest normal half: subnormal
    // Value in units of 2^-24, rounded to nearest even by the FPU's own float arithmetic.
    float a;
    std::memcpy(&a, &abs, 4);
    const float units = a * 16777216.0f;  // exact (power of two)
    return sign | static_cast<std::uint16_t>(std::nearbyint(units));
  }
  const std::uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1);  // ties to even
  return sign | static_cast<std::uint16_t>((mant_round - 0x38000000u) >> 13);
}

std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

std::vector<float> to_floats(const tensor_info& t) {
  std::vector<float> out(t.elements());
  if (t.type == tensor_type::f32) {
    std::memcpy(out.data(), t.data.data(), t.data.size());
    return out;
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    out[i] = t.type == tensor_type::f16 ? half_to_float(h) : bf16_to_float(h);
  }
  return out;
}

}  // namespace gguf
