// ringkv.store — the KV cache: a checked configuration, the store interface (a new store only
// implements the core; windows default to one traced copy), and the default store, dense or a
// ring with pinned sinks and slack for truncation, whose windows are zero-copy runs.
module;
#include <array>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
export module ringkv.store;
export import ringkv.window;

export namespace ringkv {

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

 private:
  windowed_kv copied_window(kv_side side, std::size_t layer, std::size_t from, std::size_t to,
                            scope& arena) const;

  trace::sink* sink_;
};

/// The default store: per layer one traced buffer per side laid out [kv_heads][capacity][head_dim]
/// (head stride capacity * head_dim), allocated at construction; nothing is allocated after.
/// A ring puts position p < keep in slot p and p >= keep in slot keep + (p - keep) mod
/// (capacity - keep). key_type/value_type f16 and bf16 are stored rounded to nearest even and
/// read back as f32; windows are views of the stored type.
class default_kv_cache_store final : public kv_cache_store {
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
  std::size_t length(std::size_t layer) const override;
  std::size_t window_start(std::size_t layer) const override;
  kv_cache_config config() const override { return config_; }
  store_options options() const override { return options_; }
  /// Positions in order across the wrap; O((to - from) * kv_heads * head_dim).
  void read_keys(std::size_t layer, std::size_t from, std::size_t to,
                 std::span<float> out) const override;
  void read_values(std::size_t layer, std::size_t from, std::size_t to,
                   std::span<float> out) const override;
  /// A ring needs positions max(keep, new_length + keep + 1 - W) .. new_length - 1 still held
  /// (the next token's window); otherwise any new_length <= length; O(1).
  void truncate(std::size_t layer, std::size_t new_length) override;
  void clear() noexcept override;
  void clear(std::size_t layer) override;
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

  /// The slot position `position` occupies (not a claim that it is held); O(1).
  std::size_t slot_of(std::size_t position) const noexcept;
  /// The buffer of `layer`'s keys or values, e.g. to check that a window lies inside it.
  const storage& key_storage(std::size_t layer) const;
  const storage& value_storage(std::size_t layer) const;

 private:
  struct layer_state {
    storage keys;
    storage values;
    std::size_t length = 0;
    std::size_t window_start = 0;
  };
  struct physical_runs {
    std::array<kv_run, windowed_kv::max_runs> runs{};
    std::size_t count = 0;
  };

  physical_runs runs_of(const storage& side, dtype type, std::array<position_range, 2> ranges) const;
  void add_range(physical_runs& out, const storage& side, dtype type, position_range r) const;
  windowed_kv window(kv_side side, std::size_t layer, std::size_t from, std::size_t to) const;
  void read(kv_side side, const char* who, std::size_t layer, std::size_t from, std::size_t to,
            std::span<float> out) const;

  kv_cache_config config_;
  store_options options_;
  std::size_t ring_slots_;  // capacity - keep: slots the rolling part cycles through
  std::vector<layer_state> layers_;
};

}  // namespace ringkv
