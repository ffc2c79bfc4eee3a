// ringkv.store — the KV cache: a checked configuration, the store interface (a new store only
// implements the core; windows default to one traced copy), and the default store, dense or a
// ring with pinned sinks and slack for truncation, whose windows are zero-copy runs.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
export module ringkv.store;
export import ringkv.window;

export namespace ringkv {

namespace detail {
/// Restricted: defined only by ringkv's snapshot code (src/snapshot/), one specialization
/// per store kind, so `load` can restore a store's slots and counters as they were saved. Stores
/// befriend it; importers see no definition and have no use for it.
template <class Store>
struct snapshot_access;
}  // namespace detail

/// Shape of a KV cache. Every size must be > 0 (validate()).
struct kv_cache_config {
  std::size_t layers = 0;
  std::size_t kv_heads = 0;
  std::size_t head_dim = 0;
  std::size_t capacity = 0;  // positions a layer physically holds
  dtype key_type = dtype::f32;
  dtype value_type = dtype::f32;

  /// Throws std::invalid_argument naming the first size that is 0; O(1).
  void validate() const;
  /// Floats in one token's key (or value) for one layer: kv_heads * head_dim; O(1).
  std::size_t row_floats() const noexcept { return kv_heads * head_dim; }
};

/// How a store treats a full layer. Without sliding_window keep and slack must be 0.
struct store_options {
  bool sliding_window = false;  // a ring: overwrite the oldest position when full
  std::size_t keep = 0;         // pinned positions 0..keep-1 (attention sinks), ring only
  std::size_t slack = 0;        // slots reserved so truncate works after a wrap, ring only
};

/// Bytes of one side (keys or values).
struct memory_side {
  std::size_t physical_bytes = 0;  // what the store's buffers take
  std::size_t logical_bytes = 0;   // the held positions as the f32 rows the caller appended
};

/// What a store holds and what it costs. compression_ratio = f32 bytes of a full cache over
/// physical_bytes (1 for an f32 store, 2 for f16).
struct memory_report {
  std::size_t physical_bytes = 0;  // keys + values
  std::size_t logical_bytes = 0;   // keys + values
  memory_side keys{};
  memory_side values{};
  double compression_ratio = 1.0;
};

/// A half-open range of absolute positions [from, to).
struct position_range {
  std::size_t from = 0;
  std::size_t to = 0;
  std::size_t size() const noexcept { return to - from; }
  bool empty() const noexcept { return from == to; }
  friend bool operator==(const position_range&, const position_range&) = default;
};

/// Which side of the cache a call is about.
enum class kv_side : bool { keys, values };

/// Thrown by append on a full layer of a store that is not a ring; nothing was changed.
class cache_full : public std::length_error {
 public:
  using std::length_error::length_error;
};

/// The KV cache interface. Positions are absolute and lengths are per layer. Held positions of a
/// layer are [0, length) until the ring first overwrites, then [0, keep) ∪ [window_start, length).
/// Every member validates its arguments before touching state or output (strong guarantee).
class kv_cache_store {
 public:
  virtual ~kv_cache_store() = default;

  /// Writes one token's key and value (kv_heads * head_dim floats each) at position length(layer)
  /// and returns that position.
  virtual std::size_t append(std::size_t layer, std::span<const float> key,
                             std::span<const float> value) = 0;
  /// One past the newest position of `layer`.
  virtual std::size_t length(std::size_t layer) const = 0;
  /// Oldest position of the rolling part still held (0 until something was overwritten).
  virtual std::size_t window_start(std::size_t layer) const = 0;
  virtual kv_cache_config config() const = 0;
  virtual store_options options() const = 0;
  /// Copies positions [from, to) as f32 [kv_heads, to - from, head_dim] into `out` (sized
  /// exactly); refuses positions not held.
  virtual void read_keys(std::size_t layer, std::size_t from, std::size_t to,
                         std::span<float> out) const = 0;
  /// As read_keys, for values.
  virtual void read_values(std::size_t layer, std::size_t from, std::size_t to,
                           std::span<float> out) const = 0;
  /// Rolls `layer` back to `new_length` if the window the next token needs is still held.
  virtual void truncate(std::size_t layer, std::size_t new_length) = 0;
  /// Forgets every layer's positions.
  virtual void clear() = 0;
  /// Forgets `layer`'s positions.
  virtual void clear(std::size_t layer) = 0;
  virtual memory_report memory() const = 0;

  /// The window [from, to) plus its sinks [0, min(keep, from)) as runs. Default: one copy into
  /// `arena` through read_keys, announced as adapter_inserted{"copy-kv-window", "keys", bytes};
  /// O(window). Stores that can hand out their own memory override it.
  virtual windowed_kv key_window(std::size_t layer, std::size_t from, std::size_t to,
                                 scope& arena) const;
  /// As key_window, for values (target "values").
  virtual windowed_kv value_window(std::size_t layer, std::size_t from, std::size_t to,
                                   scope& arena) const;
  /// The window [from, to) plus its sinks over the store's own memory, in the format it holds
  /// its rows (element runs, or codes with their side planes): what attention, prefill and
  /// snapshots read, so a store that exposes its rows gets the tiled prefill, the compressed
  /// kernels and snapshots. Refuses positions not held (std::out_of_range); O(1), nothing
  /// copied. Default: std::nullopt (rows only through read_keys/read_values and the copying
  /// windows above).
  virtual std::optional<windowed_kv> stored_window(kv_side side, std::size_t layer,
                                                   std::size_t from, std::size_t to) const;
  /// Makes room now for `positions` more appends to `layer` (a pool's dense layer takes their
  /// blocks), so memory cannot refuse them later; changes no position or row. Throws what the
  /// appends would for memory (pool_budget_exceeded), all or nothing. Default: nothing; O(1).
  virtual void reserve(std::size_t layer, std::size_t positions);

  /// W: keys a query attends to, counting itself and the sinks (capacity - slack for a ring,
  /// capacity otherwise); O(1).
  std::size_t attention_window() const;
  /// The positions a query at `position` attends to besides the sinks: [from, position + 1),
  /// with W - keep rolling keys once position >= W (key_window adds the sinks); O(1).
  position_range query_window(std::size_t position) const;
  /// Positions of `layer` currently held (pinned + rolling); O(1).
  std::size_t held(std::size_t layer) const;
  /// Whether every position of [from, to) of `layer` is held (and to <= length); O(1).
  bool holds(std::size_t layer, std::size_t from, std::size_t to) const;
  /// Where this store's events go.
  trace::sink& sink() const noexcept { return *sink_; }

 protected:
  explicit kv_cache_store(trace::sink& sink = trace::null_sink()) noexcept : sink_(&sink) {}
  kv_cache_store(const kv_cache_store&) = default;
  kv_cache_store(kv_cache_store&&) = default;
  kv_cache_store& operator=(const kv_cache_store&) = default;
  kv_cache_store& operator=(kv_cache_store&&) = default;

  /// Throws std::out_of_range naming `who`, layer and layers when layer >= layers; O(1).
  void check_layer(const char* who, std::size_t layer) const;
  /// Throws std::out_of_range naming from, to, window_start, length and keep unless every
  /// position of [from, to) is held; O(1).
  void check_range(const char* who, std::size_t layer, std::size_t from, std::size_t to) const;
  /// The positions of the window [from, to) plus its sinks, as at most two ranges in order (one
  /// when from <= keep, since the sinks then continue into the window); O(1).
  std::array<position_range, 2> window_positions(std::size_t from, std::size_t to) const;
  /// The adapter kind the defaulted windows announce their copy as ("copy-kv-window"); a store
  /// whose rows are decoded on the way out says so ("dequantize-kv-window").
  virtual std::string_view copy_kind() const noexcept { return "copy-kv-window"; }

 private:
  windowed_kv copied_window(kv_side side, std::size_t layer, std::size_t from, std::size_t to,
                            scope& arena) const;

  trace::sink* sink_;
};

/// The position bookkeeping of a store that keeps each layer's positions in `capacity` slots,
/// dense or a ring: per-layer length and window_start, the slot rule (position p < keep in slot
/// p, p >= keep in slot keep + (p - keep) mod (capacity - keep)), append's refusals, truncate's
/// rule, clear, and the slot runs a window covers. A derived store owns the buffers: it writes
/// a row at prepare_append's slot, then commit_append()s, and reads rows at the slots of
/// add_slots / window_slots.
class slotted_kv_cache_store : public kv_cache_store {
 public:
  /// Consecutive positions in consecutive slots.
  struct slot_run {
    std::size_t first_position = 0;
    std::size_t slot = 0;
    std::size_t count = 0;
  };
  /// At most max_runs slot runs in position order (pinned sinks, ring head, ring tail).
  struct slot_runs {
    std::array<slot_run, windowed_kv::max_runs> runs{};
    std::size_t count = 0;
    std::span<const slot_run> view() const noexcept { return {runs.data(), count}; }
  };

  std::size_t length(std::size_t layer) const override;
  std::size_t window_start(std::size_t layer) const override;
  kv_cache_config config() const override { return config_; }
  store_options options() const override { return options_; }
  /// A ring needs positions max(keep, new_length + keep + 1 - W) .. new_length - 1 still held
  /// (the next token's window); otherwise any new_length <= length; O(1).
  void truncate(std::size_t layer, std::size_t new_length) override;
  void clear() noexcept override;
  void clear(std::size_t layer) override;

  /// The slot position `position` occupies (not a claim that it is held); O(1).
  std::size_t slot_of(std::size_t position) const noexcept;

 protected:
  /// Validates config and options (std::invalid_argument naming the field and `name`, the
  /// derived store's class name, a static string); O(layers).
  slotted_kv_cache_store(kv_cache_config config, store_options options, const char* name,
                         trace::sink& sink);
  slotted_kv_cache_store(slotted_kv_cache_store&&) noexcept = default;
  slotted_kv_cache_store& operator=(slotted_kv_cache_store&&) noexcept = default;

  /// Checks layer, row sizes (kv_heads * head_dim) and room (cache_full for a full dense layer)
  /// and returns the slot position length(layer) goes to; changes nothing; O(1).
  std::size_t prepare_append(std::size_t layer, std::span<const float> key,
                             std::span<const float> value) const;
  /// Makes the row written at prepare_append's slot the layer's newest position (a full ring
  /// forgets its oldest rolling position) and returns that position; O(1).
  std::size_t commit_append(std::size_t layer) noexcept;
  /// Appends the slot runs of held positions r to `out`, merging a run that continues the last
  /// one in position and slot; O(1).
  void add_slots(slot_runs& out, position_range r) const noexcept;
  /// check_range, then the slot runs of the window [from, to) plus its sinks; O(1).
  slot_runs window_slots(const char* who, std::size_t layer, std::size_t from,
                         std::size_t to) const;
  /// check_range and that `out` has kv_heads * (to - from) * head_dim floats, then the slot runs
  /// of [from, to) (no sinks); O(1).
  slot_runs read_slots(const char* who, std::size_t layer, std::size_t from, std::size_t to,
                       std::span<float> out) const;
  /// A report with physical bytes per side as given, logical bytes from the held rows and the
  /// ratio of a full f32 cache to the physical bytes; O(layers).
  memory_report report(std::size_t key_bytes, std::size_t value_bytes) const;
  /// Takes `from`'s lengths and window starts (same config and options, else
  /// std::invalid_argument): a derived store that copied or shared the rows themselves; O(layers).
  void copy_positions(const slotted_kv_cache_store& from);
  /// kv_heads * capacity * head_dim, checked against overflow at construction.
  std::size_t side_elements() const noexcept { return side_elements_; }
  /// The derived store's class name, for messages.
  const char* name() const noexcept { return name_; }

 private:
  friend struct detail::snapshot_access<slotted_kv_cache_store>;

  struct counters {
    std::size_t length = 0;
    std::size_t window_start = 0;
  };
  void check_layer_of(const char* member, std::size_t layer) const;

  kv_cache_config config_;
  store_options options_;
  const char* name_;
  std::size_t ring_slots_;  // capacity - keep: slots the rolling part cycles through
  std::size_t side_elements_;
  std::vector<counters> layers_;
};

/// The default store: per layer one traced buffer per side laid out [kv_heads][capacity][head_dim]
/// (head stride capacity * head_dim), allocated at construction; nothing is allocated after.
/// Slots as slotted_kv_cache_store. key_type/value_type f16 and bf16 are stored rounded to
/// nearest even and read back as f32; windows are views of the stored type. A derived store
/// (the pool's dense layers) lays the same rows over memory it maps itself.
class default_kv_cache_store : public slotted_kv_cache_store {
 public:
  /// Validates config and options (std::invalid_argument naming the field) and allocates
  /// 2 * layers traced buffers; O(layers * capacity * kv_heads * head_dim) to zero-fill.
  explicit default_kv_cache_store(kv_cache_config config, store_options options = {},
                                  trace::sink& sink = trace::null_sink());
  default_kv_cache_store(default_kv_cache_store&&) noexcept = default;
  default_kv_cache_store& operator=(default_kv_cache_store&&) noexcept = default;

  /// Writes position length(layer) into its slot (a ring overwrites its oldest rolling position;
  /// otherwise a full layer throws cache_full); O(kv_heads * head_dim), no allocation.
  std::size_t append(std::size_t layer, std::span<const float> key,
                     std::span<const float> value) override;
  /// Positions in order across the wrap; O((to - from) * kv_heads * head_dim).
  void read_keys(std::size_t layer, std::size_t from, std::size_t to,
                 std::span<float> out) const override;
  void read_values(std::size_t layer, std::size_t from, std::size_t to,
                   std::span<float> out) const override;
  memory_report memory() const override;

  /// Zero-copy: the scope is not used and nothing is emitted; O(1).
  windowed_kv key_window(std::size_t layer, std::size_t from, std::size_t to,
                         scope& arena) const override;
  windowed_kv value_window(std::size_t layer, std::size_t from, std::size_t to,
                           scope& arena) const override;
  /// The window [from, to) plus its sinks as views over the store's own buffers: one run, two
  /// when it crosses the end of the ring, plus the pinned run; O(1), no allocation.
  windowed_kv key_window(std::size_t layer, std::size_t from, std::size_t to) const;
  windowed_kv value_window(std::size_t layer, std::size_t from, std::size_t to) const;
  /// As key_window / value_window above, through the interface.
  std::optional<windowed_kv> stored_window(kv_side side, std::size_t layer, std::size_t from,
                                           std::size_t to) const override;

  /// The buffer of `layer`'s keys or values, e.g. to check that a window lies inside it.
  const storage& key_storage(std::size_t layer) const;
  const storage& value_storage(std::size_t layer) const;

 protected:
  /// One layer's memory: the first byte of its keys' and of its values' rows.
  struct layer_memory {
    std::byte* keys = nullptr;
    std::byte* values = nullptr;
  };
  /// Over `memory` (one entry a layer, [kv_heads][capacity][head_dim] each side), which the
  /// derived store keeps and maps; nothing is allocated or zero-filled, key_storage() is empty.
  /// Validates as the public constructor, naming `name` (a static string); O(layers).
  default_kv_cache_store(kv_cache_config config, store_options options,
                         std::span<const layer_memory> memory, const char* name, trace::sink& sink);
  /// Called by append after its checks and before it writes `slot` of `layer`: a derived store
  /// makes that slot's rows writable here (it may throw; nothing has changed). Default: nothing.
  virtual void prepare_write(std::size_t layer, std::size_t slot);

 private:
  friend struct detail::snapshot_access<default_kv_cache_store>;

  struct layer_buffers {
    storage keys;
    storage values;
    layer_memory at;  // keys.data(), values.data(), or a derived store's memory
  };

  tensor_view view_of(const std::byte* side, dtype type, const slot_run& r) const;
  windowed_kv window(kv_side side, std::size_t layer, std::size_t from, std::size_t to) const;
  void read(kv_side side, const char* who, std::size_t layer, std::size_t from, std::size_t to,
            std::span<float> out) const;

  std::vector<layer_buffers> layers_;
};

}  // namespace ringkv

export namespace ringkv {

// Snapshots (the format and its loader: ringkv.snapshot, src/snapshot/).

/// A snapshot that cannot be loaded: what is wrong and the byte offset of the field (or of the
/// end of the data, for a truncated file) where it was found. Nothing was built.
class snapshot_error : public std::runtime_error {
 public:
  snapshot_error(const std::string& what, std::uint64_t offset)
      : std::runtime_error(what), offset_(offset) {}
  /// Byte offset in the snapshot of the problem.
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::uint64_t offset_;
};

/// The format version this library writes; it loads versions 1 .. snapshot_version.
inline constexpr std::uint32_t snapshot_version = 1;

/// Store kinds a snapshot can hold (the header's store-kind field).
// NOLINTNEXTLINE(performance-enum-size): the header stores it as 4 bytes.
enum class snapshot_kind : std::uint32_t { default_store = 1, turboquant = 2, int8 = 3 };

/// Writes `store` to `out` (the format above; only held positions); O(held rows). Throws
/// std::invalid_argument for a store type without a snapshot format, std::ios_base::failure
/// (or what `out` throws) when writing fails.
void save(const kv_cache_store& store, std::ostream& out);
/// Writes `store` to `path` through replace_file: a failure or a crash midway leaves the
/// previous file intact; O(held rows) plus an fsync.
void save(const kv_cache_store& store, const std::filesystem::path& path);

/// Reads a snapshot from `in` and builds the store it describes, its events going to `sink`;
/// O(file). Throws snapshot_error (with offset()) for wrong magic, a newer version, a truncated
/// stream, a checksum mismatch, config or options out of range, lengths inconsistent with the
/// capacity, or a store that would take more than `max_store_bytes` of buffers.
std::unique_ptr<kv_cache_store> load(
    std::istream& in, trace::sink& sink = trace::null_sink(),
    std::size_t max_store_bytes = std::numeric_limits<std::size_t>::max());
/// As load(std::istream&), from a file (std::system_error when it cannot be opened).
std::unique_ptr<kv_cache_store> load(
    const std::filesystem::path& path, trace::sink& sink = trace::null_sink(),
    std::size_t max_store_bytes = std::numeric_limits<std::size_t>::max());

/// Replaces `path` atomically: `write` fills a new temporary file in the same folder, which is
/// then flushed, fsync'ed and renamed over `path` (and the folder fsync'ed). If `write` throws or
/// any step fails, the temporary file is removed, `path` is left as it was, and the exception
/// propagates (std::system_error for the file system's refusals). O(bytes written).
void replace_file(const std::filesystem::path& path,
                  const std::function<void(std::ostream&)>& write);

}  // namespace ringkv
