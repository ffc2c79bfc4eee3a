// ringkv.window — a window of the cache as the runs it physically is: one run, two when it
// crosses the end of a ring, plus the pinned run of attention sinks; its rows are elements
// (tensor_view runs) or codes with their side planes (compressed_view runs), in the format the
// store holds them. Nothing is copied unless a caller asks for gather().
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
export module ringkv.window;
export import ringkv.tensor;

export namespace ringkv {

/// How a compressed side's rows are encoded.
enum class compression : std::uint8_t { turboquant, int8 };

/// What a kernel needs to decode one side's rows of one layer (pointers into the store).
struct compressed_format {
  compression kind = compression::turboquant;
  std::size_t heads = 0;
  std::size_t head_dim = 0;
  unsigned bits = 0;                   // codebook bits per coordinate (8 for int8)
  std::size_t code_bytes = 0;          // per row: ceil(head_dim · bits / 8), LSB-first bit stream
  bool qjl = false;                    // rows carry sign bits and a residual norm
  std::size_t sign_bytes = 0;          // per row: ceil(head_dim / 8) when qjl
  const float* centroids = nullptr;    // 2^bits levels (turboquant)
  const float* rotations = nullptr;    // [heads][rotation_floats] states (turboquant)
  std::size_t rotation_floats = 0;     // head_dim (Hadamard) or head_dim² per head
  bool hadamard = false;               // head_dim is a power of two
  const float* projections = nullptr;  // [heads][head_dim][head_dim] S (qjl)
  // Codes and sign bits in slot groups (TurboQuant keys: 32 slots a group, stored by coordinate
  // for the kernel's byte-shuffle lookups; src/quant/quant_codec.h) instead of rows.
  bool grouped = false;
  std::uint64_t seed = 0;  // the rotations' and projections' seed (turboquant): what a snapshot
                           // records instead of them
};

/// One run of compressed rows: `positions` consecutive positions of every head, in slots
/// [first_slot, first_slot + positions). The pointers are the side's buffers (head 0, slot 0):
/// row (h, i) is slot first_slot + i of head h, index r = h·head_stride + first_slot + i; its
/// scale (turboquant: ‖x‖, int8: absmax/127) is scales[r], with qjl its residual norm
/// residual_norms[r]; its codes (and sign bits) are at codes + r·code_bytes (signs +
/// r·sign_bytes), or, grouped, in the slot group r / 32 of group_bytes each.
struct compressed_view {
  const std::byte* codes = nullptr;
  const float* scales = nullptr;
  const std::byte* signs = nullptr;
  const float* residual_norms = nullptr;
  std::size_t positions = 0;
  std::size_t head_stride = 0;  // slots from one head to the next
  std::size_t first_slot = 0;
};

/// A compressed run and the absolute position of its first row.
struct compressed_run {
  compressed_view view;
  std::size_t first_position = 0;
};

/// One physically contiguous-in-position run and the absolute position of its first row.
struct kv_run {
  tensor_view view;
  std::size_t first_position = 0;
};

/// The window as its runs, in position order: the one type every store hands out and every
/// kernel reads. Its rows are elements of one dtype (runs(): tensor_view runs) or, in a code
/// window (compressed()), codes of one compressed_format with their side planes (code_runs()).
/// Runs agree on heads, head_dim and format; positions strictly increase from run to run (a gap
/// is allowed only after pinned sink positions).
class windowed_kv {
 public:
  // Pinned sinks, the ring's head and tail, and (in a prefill) the chunk's own fresh rows.
  static constexpr std::size_t max_runs = 4;

  /// An empty window (no positions); prefill masks can produce one.
  windowed_kv() noexcept = default;
  /// A window of one run starting at absolute `first_position`; O(1).
  windowed_kv(tensor_view head, std::size_t first_position);
  /// A window of one run, or two when `tail` continues `head`'s positions (a wrapped ring); O(1).
  /// Throws std::invalid_argument when the runs disagree on heads, head_dim or dtype.
  windowed_kv(tensor_view head, std::optional<tensor_view> tail, std::size_t first_position);
  /// A window of up to max_runs runs (empty runs are dropped); checks geometry and that
  /// positions increase; O(runs).
  explicit windowed_kv(std::span<const kv_run> runs);
  /// A code window of up to max_runs runs of `format` (empty runs dropped); throws
  /// std::invalid_argument when there are more or positions do not increase; O(runs).
  windowed_kv(const compressed_format& format, std::span<const compressed_run> runs);

  /// The first run (throws std::out_of_range on an empty window).
  const tensor_view& head() const;
  /// The last run when there is more than one.
  std::optional<tensor_view> tail() const;
  // The accessors are `inline` for importers to inline them (see tensor_view's).
  /// The element runs in position order (none in a code window); O(1).
  inline std::span<const tensor_view> runs() const noexcept {
    return {views_.data(), compressed_ ? 0 : count_};
  }
  /// The code runs in position order (none in an element window); O(1).
  inline std::span<const compressed_view> code_runs() const noexcept {
    return {codes_.data(), compressed_ ? count_ : 0};
  }
  /// How many runs the window has, of either kind; O(1).
  inline std::size_t run_count() const noexcept { return count_; }
  /// Positions of run i (throws std::out_of_range past the runs); O(1).
  inline std::size_t run_positions(std::size_t i) const {
    if (i >= count_) refuse_run(i);
    return counts_[i];
  }
  /// Absolute position of run i's first row (throws std::out_of_range past the runs); O(1).
  inline std::size_t run_first_position(std::size_t i) const {
    if (i >= count_) refuse_run(i);
    return starts_[i];
  }
  /// Total positions over all runs.
  inline std::size_t length() const noexcept { return length_; }
  inline bool empty() const noexcept { return length_ == 0; }
  /// Whether consecutive positions are split across runs (the ring's end falls in the window).
  bool wrapped() const noexcept;
  /// Bytes of the rows the window covers: elements, or codes with their side planes; O(runs).
  std::size_t bytes() const noexcept;
  /// Absolute position of the oldest row (0 for an empty window).
  inline std::size_t first_position() const noexcept { return count_ ? starts_[0] : 0; }
  /// One past the absolute position of the newest row.
  inline std::size_t end_position() const noexcept {
    return count_ ? starts_[count_ - 1] + counts_[count_ - 1] : 0;
  }
  inline std::size_t heads() const noexcept {
    return compressed_ ? format_.heads : count_ ? views_[0].heads() : 0;
  }
  inline std::size_t head_dim() const noexcept {
    return compressed_ ? format_.head_dim : count_ ? views_[0].head_dim() : 0;
  }
  /// The element type of an element window (f32 for an empty one or a code window); O(1).
  inline dtype type() const noexcept {
    return !compressed_ && count_ ? views_[0].type() : dtype::f32;
  }
  /// Whether the rows are codes (a compressed store's own) rather than elements; O(1).
  inline bool compressed() const noexcept { return compressed_; }
  /// The codes' format of a code window (a default one for an element window); O(1).
  inline const compressed_format& format() const noexcept { return format_; }
  /// The row format: the element type's, or the codes' (int8, turboquant); O(1).
  kv_encoding encoding() const noexcept;
  /// The kernel family that reads the rows (format table); O(1).
  kernel_family family() const noexcept { return traits_of(encoding()).family; }
  /// Row (head h, position p of run i) as f32 in `out` (head_dim floats): an element row
  /// promoted, a code row decoded (O(head_dim log head_dim) with a Hadamard rotation, else
  /// O(head_dim²)). Throws std::out_of_range naming the index or size past its limit.
  void decode(std::size_t i, std::size_t h, std::size_t p, std::span<float> out) const;

  /// Copies the window into one contiguous [heads, length, head_dim] view in `arena` (a code
  /// window decoded to f32) and emits one adapter_inserted{"gather-kv-window", target, bytes};
  /// O(length * heads * head_dim), plus the decoding.
  /// `target` names what is gathered ("keys", "values") and must be a static string.
  tensor_view gather(scope& arena, trace::sink& sink, std::string_view target = "kv") const;
  /// The gathered window as a one-run windowed_kv over `arena` (same positions); as gather().
  windowed_kv gathered(scope& arena, trace::sink& sink, std::string_view target = "kv") const;

 private:
  void add(const tensor_view& v, std::size_t first_position);
  void add_start(std::size_t first_position, std::size_t positions);
  [[noreturn]] void refuse_run(std::size_t i) const;

  std::array<tensor_view, max_runs> views_{};      // element runs
  std::array<compressed_view, max_runs> codes_{};  // code runs
  std::array<std::size_t, max_runs> starts_{};     // absolute first position per run
  std::array<std::size_t, max_runs> counts_{};     // positions per run
  compressed_format format_{};                     // a code window's
  std::size_t count_ = 0;
  std::size_t length_ = 0;
  bool compressed_ = false;
};

}  // namespace ringkv
