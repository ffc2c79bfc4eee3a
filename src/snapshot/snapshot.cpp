// The snapshot format's common part: the byte streams (little-endian fields, running XXH3-64,
// offsets), the header every kind shares, and save/load dispatching on the store kind.
//
// Version 1 layout (offsets in bytes, all integers little-endian):
//    0  magic "\x89RKV\r\n\x1a\n" (a text-mode transfer or a truncation to 7 bits shows)
//    8  u32 format version        12  u32 store kind (snapshot_kind)
//   16  u64 layers, kv_heads, head_dim, capacity
//   48  u8 key_type, value_type (their format_traits::snapshot_tag), u8 sliding_window (0/1), u8 reserved (0)
//   52  u64 keep, slack
//   68  the kind's section: its parameters (TurboQuant: u32 key_bits, u32 value_bits, u8 qjl,
//       u64 seed; the default and int8 stores have none), per layer u64 length and u64
//       window_start, then per layer each plane's held rows (snapshot_slots.cpp)
//  end  u64 XXH3-64 (seed 0) of every byte before it
module;
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <istream>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
#include <xxhash.h>
module ringkv.snapshot;

namespace ringkv {
namespace detail {

struct hash_state {
  XXH3_state_t* state;
};

void hash_state_deleter::operator()(hash_state* s) const noexcept {
  XXH3_freeState(s->state);
  delete s;
}

namespace {
constexpr std::array<unsigned char, 8> magic = {0x89, 'R', 'K', 'V', '\r', '\n', 0x1a, '\n'};

std::unique_ptr<hash_state, hash_state_deleter> new_hash() {
  auto h = std::unique_ptr<hash_state, hash_state_deleter>(new hash_state{XXH3_createState()});
  if (h->state == nullptr || XXH3_64bits_reset(h->state) == XXH_ERROR) throw std::bad_alloc();
  return h;
}

template <class T>
T little(T v) noexcept {
  if constexpr (std::endian::native == std::endian::big) {
    T r = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) r = T(r << 8) | T((v >> (8 * i)) & 0xff);
    return r;
  }
  return v;
}

// Swaps each `size`-byte element in place (a no-op on little-endian hosts).
void swap_elements(std::byte* data, std::size_t count, std::size_t size) noexcept {
  if constexpr (std::endian::native == std::endian::big)
    for (std::size_t i = 0; i < count; ++i) std::reverse(data + i * size, data + (i + 1) * size);
}

std::string str(std::uint64_t n) { return std::to_string(n); }
}  // namespace

// ---- writing ----

snapshot_out::snapshot_out(std::ostream& out) : out_(&out), hash_(new_hash()) {}

void snapshot_out::bytes(const void* data, std::size_t n) {
  XXH3_64bits_update(hash_->state, data, n);
  out_->write(static_cast<const char*>(data), std::streamsize(n));
  if (!*out_) throw std::ios_base::failure("ringkv::save: writing the snapshot failed");
}

void snapshot_out::u32(std::uint32_t v) {
  v = little(v);
  bytes(&v, sizeof v);
}

void snapshot_out::u64(std::uint64_t v) {
  v = little(v);
  bytes(&v, sizeof v);
}

void snapshot_out::elements(const std::byte* data, std::size_t count, std::size_t size) {
  if constexpr (std::endian::native == std::endian::little) {
    bytes(data, count * size);
  } else {
    std::array<std::byte, 4> e;
    for (std::size_t i = 0; i < count; ++i) {
      std::memcpy(e.data(), data + i * size, size);
      swap_elements(e.data(), 1, size);
      bytes(e.data(), size);
    }
  }
}

void snapshot_out::finish() {
  const std::uint64_t sum = little(std::uint64_t(XXH3_64bits_digest(hash_->state)));
  out_->write(reinterpret_cast<const char*>(&sum), sizeof sum);
  out_->flush();
  if (!*out_) throw std::ios_base::failure("ringkv::save: writing the snapshot failed");
}

// ---- reading ----

snapshot_in::snapshot_in(std::istream& in) : in_(&in), hash_(new_hash()) {}

void snapshot_in::fail(const std::string& what, std::uint64_t at) const {
  throw snapshot_error("ringkv::load: " + what + " at byte " + str(at), at);
}

void snapshot_in::bytes(void* data, std::size_t n) {
  in_->read(static_cast<char*>(data), std::streamsize(n));
  const auto got = std::uint64_t(in_->gcount());
  if (got != n)
    fail("truncated snapshot: " + str(n) + " bytes needed, " + str(got) + " left", offset_ + got);
  XXH3_64bits_update(hash_->state, data, n);
  offset_ += n;
}

std::uint8_t snapshot_in::u8() {
  std::uint8_t v;
  bytes(&v, 1);
  return v;
}

std::uint32_t snapshot_in::u32() {
  std::uint32_t v;
  bytes(&v, sizeof v);
  return little(v);
}

std::uint64_t snapshot_in::u64() {
  std::uint64_t v;
  bytes(&v, sizeof v);
  return little(v);
}

void copy_elements(std::byte* dst, const std::byte* src, std::size_t count,
                   std::size_t size) noexcept {
  std::memcpy(dst, src, count * size);
  swap_elements(dst, count, size);
}

std::vector<std::byte> snapshot_in::block(std::size_t n) {
  constexpr std::size_t chunk = std::size_t(1) << 20;
  std::vector<std::byte> out;
  out.reserve(std::min(n, chunk));
  for (std::size_t done = 0; done < n;) {
    const std::size_t step = std::min(chunk, n - done);
    out.resize(done + step);
    const std::uint64_t at = offset_;
    try {
      bytes(out.data() + done, step);
    } catch (const snapshot_error& e) {
      fail("truncated snapshot: " + str(n) + " data bytes needed, " +
               str(done + (e.offset() - at)) + " left",
           e.offset());
    }
    done += step;
  }
  return out;
}

void snapshot_in::finish() {
  const std::uint64_t at = offset_;
  const std::uint64_t computed = XXH3_64bits_digest(hash_->state);
  std::uint64_t stored;
  in_->read(reinterpret_cast<char*>(&stored), sizeof stored);
  if (in_->gcount() != sizeof stored)
    fail("truncated snapshot: the 8-byte checksum is missing", at + std::uint64_t(in_->gcount()));
  if (little(stored) != computed)
    fail("checksum mismatch (XXH3-64 of the preceding bytes differs from the stored one)", at);
  offset_ += sizeof stored;
}

// ---- the common header ----

namespace {

void write_header(snapshot_kind kind, const kv_cache_config& c, const store_options& o,
                  snapshot_out& out) {
  out.bytes(magic.data(), magic.size());
  out.u32(snapshot_version);
  out.u32(std::uint32_t(kind));
  for (std::size_t v : {c.layers, c.kv_heads, c.head_dim, c.capacity}) out.u64(v);
  out.u8(traits_of(c.key_type).snapshot_tag);
  out.u8(traits_of(c.value_type).snapshot_tag);
  out.u8(o.sliding_window ? 1 : 0);
  out.u8(0);
  out.u64(o.keep);
  out.u64(o.slack);
}

// Reads a u64 size field that must lie in [lo, hi].
std::size_t read_size(snapshot_in& in, const char* name, std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t at = in.offset(), v = in.u64();
  if (v < lo || v > hi)
    in.fail(std::string("config out of range: ") + name + " " + str(v) + " not in [" + str(lo) +
                ", " + str(hi) + "]",
            at);
  return std::size_t(v);
}

dtype read_dtype(snapshot_in& in, const char* name) {
  const std::uint64_t at = in.offset();
  const std::uint8_t v = in.u8();
  std::string known;
  for (const dtype t : all_dtypes) {
    if (traits_of(t).snapshot_tag == v) return t;
    known += std::string(known.empty() ? "" : ", ") + str(traits_of(t).snapshot_tag) + " " +
             std::string(name_of(t));
  }
  in.fail(std::string("config out of range: ") + name + " " + str(v) + " is not a dtype (" + known +
              ")",
          at);
}

snapshot_header read_header(snapshot_in& in) {
  std::array<unsigned char, 8> m;
  in.bytes(m.data(), m.size());
  if (m != magic) in.fail("wrong magic: not a ringkv snapshot", 0);
  const std::uint32_t version = in.u32();
  if (version > snapshot_version)
    in.fail("newer format version " + str(version) + " (this library reads 1.." +
                str(snapshot_version) + ")",
            8);
  if (version == 0) in.fail("format version 0 does not exist", 8);
  snapshot_header h;
  const std::uint32_t kind = in.u32();
  if (kind < std::uint32_t(snapshot_kind::default_store) ||
      kind > std::uint32_t(snapshot_kind::int8))
    in.fail("unknown store kind " + str(kind) + " (1 default, 2 turboquant, 3 int8)", 12);
  h.kind = snapshot_kind(kind);
  // Sizes are bounded so that no product below can overflow 64 bits (2^62 positions, 2^24 of
  // each dimension); the kinds bound the bytes they allocate themselves.
  constexpr std::uint64_t dim_max = std::uint64_t(1) << 24;
  h.config.layers = read_size(in, "layers", 1, dim_max);
  h.config.kv_heads = read_size(in, "kv_heads", 1, dim_max);
  h.config.head_dim = read_size(in, "head_dim", 1, dim_max);
  h.config.capacity = read_size(in, "capacity", 1, std::uint64_t(1) << 40);
  h.config.key_type = read_dtype(in, "key_type");
  h.config.value_type = read_dtype(in, "value_type");
  const std::uint64_t flag_at = in.offset();
  const std::uint8_t ring = in.u8(), reserved = in.u8();
  if (ring > 1)
    in.fail("options out of range: sliding_window byte " + str(ring) + " not 0 or 1", flag_at);
  if (reserved != 0) in.fail("reserved byte " + str(reserved) + " is not 0", flag_at + 1);
  h.options.sliding_window = ring == 1;
  const std::uint64_t keep_at = in.offset();
  h.options.keep = read_size(in, "keep", 0, h.config.capacity);
  h.options.slack = read_size(in, "slack", 0, h.config.capacity);
  if (!ring && (h.options.keep | h.options.slack) != 0)
    in.fail("options out of range: keep " + str(h.options.keep) + " and slack " +
                str(h.options.slack) + " must be 0 without sliding_window",
            keep_at);
  if (ring && h.options.keep + h.options.slack >= h.config.capacity)
    in.fail("options out of range: keep " + str(h.options.keep) + " + slack " +
                str(h.options.slack) + " must be < capacity " + str(h.config.capacity),
            keep_at);
  return h;
}

}  // namespace

layer_counters read_counters(const snapshot_header& h, snapshot_in& in) {
  const std::size_t capacity = h.config.capacity, keep = h.options.keep;
  const std::uint64_t at = in.offset();
  layer_counters c;
  c.length = std::size_t(in.u64());
  c.window_start = std::size_t(in.u64());
  auto refuse = [&](const std::string& why) {
    in.fail("lengths inconsistent with capacity " + str(capacity) + " (keep " + str(keep) +
                "): length " + str(c.length) + ", window_start " + str(c.window_start) + ": " + why,
            at);
  };
  if (c.length > (std::uint64_t(1) << 62)) refuse("length above 2^62");
  if (c.window_start == 0) {
    // Nothing overwritten yet: every position is in its own slot.
    if (c.length > capacity) refuse("length > capacity with nothing overwritten");
  } else {
    if (!h.options.sliding_window)
      refuse("a dense store never overwrites (window_start must be 0)");
    if (c.window_start <= keep) refuse("window_start must be 0 or > keep");
    if (c.window_start > c.length) refuse("window_start > length");
    if (c.length - c.window_start > capacity - keep)
      refuse("more rolling positions than capacity - keep");
  }
  return c;
}

// A code window's tag is its store kind (the format table's snapshot_tag).
static_assert(traits_of(kv_encoding::int8).snapshot_tag == std::uint32_t(snapshot_kind::int8));
static_assert(traits_of(kv_encoding::turboquant).snapshot_tag ==
              std::uint32_t(snapshot_kind::turboquant));

void save_snapshot(const kv_cache_store& store, std::ostream& out) {
  // The rows as the store exposes them say what the snapshot holds: element rows are the
  // default store's kind, codes their own.
  const std::optional<windowed_kv> rows = store.stored_window(kv_side::keys, 0, 0, 0);
  if (!rows)
    throw std::invalid_argument(
        "ringkv::save: this store has no snapshot format: it exposes no rows "
        "(kv_cache_store::stored_window; the default, TurboQuant and int8 stores have)");
  const snapshot_kind kind = rows->compressed()
                                 ? snapshot_kind(traits_of(rows->encoding()).snapshot_tag)
                                 : snapshot_kind::default_store;
  snapshot_out s(out);
  write_header(kind, store.config(), store.options(), s);
  save_slots(kind, store, s);
  s.finish();
}

std::unique_ptr<kv_cache_store> load_snapshot(std::istream& in, trace::sink& sink,
                                              std::size_t max_store_bytes) {
  snapshot_in s(in);
  const snapshot_header h = read_header(s);
  return load_slots(h, s, sink, max_store_bytes);
}

}  // namespace detail
}  // namespace ringkv
