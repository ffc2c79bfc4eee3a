// ringkv.snapshot — the machinery behind ringkv.store's save and load: a versioned
// little-endian format (magic, version, store kind, config, options, kind parameters, per-layer
// lengths and window starts, the held slots' raw elements, an xxHash XXH3-64 checksum over
// everything), and loads that refuse anything wrong with the byte offset where it is, never
// returning a half-built store. Its own module because it names every store kind, the
// compressed ones included, which ringkv.store cannot import; ringkv.store declares save, load
// and replace_file (docs/design.md lists them there) and defines them over this module's
// save_snapshot and load_snapshot (src/snapshot/snapshot_file.cpp, a ringkv.store unit that
// imports it).
module;
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
export module ringkv.snapshot;
export import ringkv.store;
export import ringkv.quant;

export namespace ringkv::detail {

/// save(store, out)'s work: the format above; O(held rows).
void save_snapshot(const kv_cache_store& store, std::ostream& out);
/// load(in, sink, max_store_bytes)'s work; O(snapshot).
std::unique_ptr<kv_cache_store> load_snapshot(std::istream& in, trace::sink& sink,
                                              std::size_t max_store_bytes);

}  // namespace ringkv::detail

namespace ringkv::detail {

struct hash_state;
struct hash_state_deleter {
  void operator()(hash_state* s) const noexcept;
};

/// The snapshot byte stream being written: little-endian fields, a running XXH3-64 of every
/// byte, and the offset. finish() appends the checksum.
class snapshot_out {
 public:
  explicit snapshot_out(std::ostream& out);
  void bytes(const void* data, std::size_t n);
  void u8(std::uint8_t v) { bytes(&v, 1); }
  void u32(std::uint32_t v);
  void u64(std::uint64_t v);
  /// `count` elements of `size` bytes (2 or 4) from host order to little-endian.
  void elements(const std::byte* data, std::size_t count, std::size_t size);
  void finish();

 private:
  std::ostream* out_;
  std::unique_ptr<hash_state, hash_state_deleter> hash_;
};

/// The snapshot byte stream being read: the same fields, the running checksum, the offset for
/// messages; every read that runs out throws snapshot_error("truncated").
class snapshot_in {
 public:
  explicit snapshot_in(std::istream& in);
  std::uint64_t offset() const noexcept { return offset_; }
  void bytes(void* data, std::size_t n);
  std::uint8_t u8();
  std::uint32_t u32();
  std::uint64_t u64();
  /// The next `n` bytes, read in chunks so a header that claims more than the stream holds
  /// fails as truncated after allocating only what was there.
  std::vector<std::byte> block(std::size_t n);
  /// Reads the stored checksum and throws snapshot_error unless it matches.
  void finish();
  /// Throws snapshot_error(what + " at byte " + at) at offset `at`.
  [[noreturn]] void fail(const std::string& what, std::uint64_t at) const;

 private:
  std::istream* in_;
  std::uint64_t offset_ = 0;
  std::unique_ptr<hash_state, hash_state_deleter> hash_;
};

/// Copies `count` little-endian elements of `size` bytes (2 or 4) to host order; O(count).
void copy_elements(std::byte* dst, const std::byte* src, std::size_t count,
                   std::size_t size) noexcept;

/// The header fields common to every kind, as read (and checked) by load.
struct snapshot_header {
  snapshot_kind kind{};
  kv_cache_config config{};
  store_options options{};
};

/// Every slot store (default, TurboQuant, int8): the kind's parameters (TurboQuant: u32
/// key_bits, u32 value_bits, u8 qjl, u64 seed), the per-layer counters and each layer's planes'
/// held rows. A loader reads its whole section and checks the checksum (in.finish()) before it
/// allocates the store, so a corrupt size cannot make it allocate (and zero) more than the
/// snapshot's own bytes.
/// Saving reads the store's own windows (stored_window) only, so any store exposing its rows has
/// a snapshot; loading builds the store of the kind (a default store for element rows).
void save_slots(snapshot_kind kind, const kv_cache_store& store, snapshot_out& out);
std::unique_ptr<kv_cache_store> load_slots(const snapshot_header& h, snapshot_in& in,
                                           trace::sink& sink, std::size_t max_store_bytes);

/// The per-layer counters (length, window_start) of a store with slots: written as two u64 per
/// layer; read back checked against capacity, keep and the ring (snapshot_error otherwise).
struct layer_counters {
  std::size_t length = 0;
  std::size_t window_start = 0;
};
layer_counters read_counters(const snapshot_header& h, snapshot_in& in);

}  // namespace ringkv::detail
