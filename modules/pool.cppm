// ringkv.pool — many sequences of one model shape under one memory budget: each sequence's
// sliding-window layers hold a ring, its dense layers grow in fixed-size blocks taken from the
// pool and shared copy-on-write between forks; every sequence layer group is a kv_cache_store.
module;
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
export module ringkv.pool;
export import ringkv.store;
export import ringkv.quant;

export namespace ringkv {

/// A sequence of a pool; ids start at 1 and are never reused by that pool.
using sequence_id = std::uint64_t;

/// Layers of a pool that share a shape and a row format; each sequence holds them as one store.
struct kv_pool_group {
  // layers, kv_heads, head_dim, key/value element type; capacity: a ring's slots, or the most
  // positions a dense layer may reach (only address space is reserved for it, not memory).
  kv_cache_config config;
  store_options options;  // sliding_window: a ring (any row format); else dense, in blocks
  std::optional<compression> codes;  // int8 or TurboQuant rows (rings only); none: elements
  turboquant_options turboquant{};   // with codes == turboquant
};

/// How a pool lays out its dense layers.
struct kv_pool_options {
  // Positions a dense block holds, rounded up so one head's rows of a block fill whole pages
  // (blocks are mapped into each sequence's layer; docs/design.md §3.12).
  std::size_t block_positions = 256;
};

/// Thrown when adding, forking, loading or appending would take the pool past its budget.
/// Nothing was changed. It is a cache_full: a full pool, as a full dense layer.
class pool_budget_exceeded : public cache_full {
 public:
  pool_budget_exceeded(const std::string& what, std::size_t asked, std::size_t free)
      : cache_full(what), asked_(asked), free_(free) {}
  std::size_t asked() const noexcept { return asked_; }
  std::size_t free() const noexcept { return free_; }

 private:
  std::size_t asked_;
  std::size_t free_;
};

/// A pool's memory: bytes counted against the budget.
struct pool_memory {
  std::size_t budget = 0;
  std::size_t in_use = 0;  // rings plus every block in use, a shared block once
  std::size_t shared = 0;  // blocks held by more than one sequence (part of in_use)
  std::size_t free = 0;    // budget - in_use
  std::size_t sequences = 0;
};

/// One sequence's memory.
struct sequence_memory {
  std::size_t ring_bytes = 0;    // its rings (its own)
  std::size_t block_bytes = 0;   // the dense blocks it holds, shared ones included
  std::size_t shared_bytes = 0;  // of those, the blocks another sequence holds too
};

/// Sequences of one model shape under one byte budget. Adding, forking and removing are for
/// between steps; appends to different sequences may run on different threads at once.
class kv_cache_pool {
 public:
  /// Validates the groups (std::invalid_argument naming the group and field) and, for dense
  /// groups, sets up the budget's blocks (address space only); O(groups).
  kv_cache_pool(std::size_t budget_bytes, std::vector<kv_pool_group> groups,
                kv_pool_options options = {}, trace::sink& sink = trace::null_sink());
  kv_cache_pool(const kv_cache_pool&) = delete;
  kv_cache_pool& operator=(const kv_cache_pool&) = delete;
  /// Every sequence's stores are released with the pool.
  ~kv_cache_pool();

  /// A new empty sequence: its rings allocated (counted against the budget), its dense layers
  /// reserved as address space. Throws pool_budget_exceeded; O(ring bytes) to zero-fill.
  sequence_id add();
  /// A copy of `parent` that shares its dense blocks (copy-on-write) and copies its rings;
  /// appending to either never changes the other. Throws std::out_of_range for an unknown
  /// parent, pool_budget_exceeded; O(ring bytes + blocks).
  sequence_id fork(sequence_id parent);
  /// Releases the sequence's rings and blocks at once (a shared block when its last holder
  /// goes). Throws std::out_of_range for an unknown id; O(ring bytes + blocks).
  void remove(sequence_id id);

  /// The sequence's layers of `group` as a store (every store API works on it): valid until
  /// the sequence is removed. Throws std::out_of_range for an unknown id or group; O(1).
  kv_cache_store& store(sequence_id id, std::size_t group = 0);
  const kv_cache_store& store(sequence_id id, std::size_t group = 0) const;
  /// The sink the sequence's stores emit to (its events name it): give it to its attention.
  trace::sink& sink(sequence_id id);

  /// Whether `id` is a sequence of this pool; O(1).
  bool contains(sequence_id id) const noexcept;
  /// The live sequences in increasing id order; O(sequences).
  std::vector<sequence_id> sequences() const;
  /// The pool's report; O(blocks).
  pool_memory memory() const;
  /// One sequence's report (std::out_of_range for an unknown id); O(its blocks).
  sequence_memory memory(sequence_id id) const;
  std::span<const kv_pool_group> groups() const noexcept;

  /// Writes one sequence (every group's held rows) to `out`; O(held rows).
  void save(sequence_id id, std::ostream& out) const;
  /// Reads a sequence written by save, from this or another pool of the same groups, as a new
  /// sequence. Throws snapshot_error for a bad stream or a different shape (nothing added),
  /// pool_budget_exceeded; O(rows).
  sequence_id load(std::istream& in);

 private:
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace ringkv
