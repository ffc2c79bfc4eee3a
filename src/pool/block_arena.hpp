// The pool's physical blocks: one shared-memory file of `units` blocks of `unit_bytes`, each
// with a reference count, that a dense layer maps into its own reserved address range. Mapping
// rather than pointing keeps a dense layer one contiguous run for the kernels however its blocks
// lie in the file (the kernels read windows of at most four runs), and lets two sequences map
// one block (a fork's shared prefix). POSIX; thread-safe (one mutex, taken once a block).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace ringkv::pool_detail {

/// A block's number in the arena.
using unit = std::uint32_t;
inline constexpr unit no_unit = ~unit(0);

/// The system's page size (blocks, reservations and mappings are multiples of it); O(1).
std::size_t page_bytes() noexcept;

/// An address range reserved (no memory, no access) until released; O(1).
class reservation {
 public:
  reservation() noexcept = default;
  /// Reserves `bytes` (a page multiple, > 0); throws std::system_error when the system refuses.
  explicit reservation(std::size_t bytes);
  reservation(reservation&& o) noexcept;
  reservation& operator=(reservation&& o) noexcept;
  ~reservation();
  std::byte* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class block_arena {
 public:
  /// A file of units × unit_bytes (unit_bytes a page multiple); no memory until written.
  block_arena(std::size_t unit_bytes, std::size_t units);
  block_arena(const block_arena&) = delete;
  block_arena& operator=(const block_arena&) = delete;
  ~block_arena();

  std::size_t unit_bytes() const noexcept { return unit_bytes_; }
  /// Whether `n` more units are free; callers hold lock().
  bool has_free(std::size_t n) const noexcept { return free_.size() >= n; }
  /// A free unit with one reference (has_free(1) first); callers hold lock(). O(1).
  unit take() noexcept;
  /// One more holder of `u`; callers hold lock(). O(1).
  void share(unit u) noexcept { ++refs_[u]; }
  /// One holder fewer; the last returns `u` to the free list. Callers hold lock(). O(1).
  void drop(unit u) noexcept;
  std::uint32_t refs(unit u) const noexcept { return refs_[u]; }
  /// Units held by at least one / by more than one holder; callers hold lock(). O(units).
  std::size_t used() const noexcept { return refs_.size() - free_.size(); }
  std::size_t shared() const noexcept;
  /// The unit's bytes through the arena's own mapping (a copy-on-write copies through it).
  std::byte* bytes_of(unit u) const noexcept { return base_ + std::size_t(u) * unit_bytes_; }
  /// Maps the first `bytes` of `u` at `where` (page aligned, inside a reservation), readable
  /// and writable, replacing what was mapped there; throws std::system_error. O(1).
  void map(std::byte* where, unit u, std::size_t bytes) const;
  /// Returns [where, where + bytes) to reserved, inaccessible address space; O(1).
  static void unmap(std::byte* where, std::size_t bytes) noexcept;
  /// The arena's lock: taken around every take/share/drop and the decisions they follow from.
  std::mutex& lock() const noexcept { return mutex_; }

 private:
  int fd_ = -1;
  std::byte* base_ = nullptr;
  std::size_t unit_bytes_;
  std::vector<std::uint32_t> refs_;  // [units]
  std::vector<unit> free_;           // free units, the next taken at the back
  mutable std::mutex mutex_;
};

}  // namespace ringkv::pool_detail
