// ringkv.window — a window of the cache as the runs it physically is: one run, two when it
// crosses the end of a ring, plus the pinned run of attention sinks. Nothing is copied unless a
// caller asks for gather().
module;
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
export module ringkv.window;
export import ringkv.tensor;

export namespace ringkv {

/// One physically contiguous-in-position run and the absolute position of its first row.
struct kv_run {
  tensor_view view;
  std::size_t first_position = 0;
};

/// The window as its runs, in position order. Runs agree on heads, head_dim and dtype; positions
/// strictly increase from run to run (a gap is allowed only after pinned sink positions).
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

  /// The first run (throws std::out_of_range on an empty window).
  const tensor_view& head() const;
  /// The last run when there is more than one.
  std::optional<tensor_view> tail() const;
  // The accessors are `inline` for importers to inline them (see tensor_view's).
  /// The runs in position order; O(1).
  inline std::span<const tensor_view> runs() const noexcept { return {views_.data(), count_}; }
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
  /// Absolute position of the oldest row (0 for an empty window).
  inline std::size_t first_position() const noexcept { return count_ ? starts_[0] : 0; }
  /// One past the absolute position of the newest row.
  inline std::size_t end_position() const noexcept {
    return count_ ? starts_[count_ - 1] + views_[count_ - 1].positions() : 0;
  }
  inline std::size_t heads() const noexcept { return count_ ? views_[0].heads() : 0; }
  inline std::size_t head_dim() const noexcept { return count_ ? views_[0].head_dim() : 0; }
  inline dtype type() const noexcept { return count_ ? views_[0].type() : dtype::f32; }

  /// Copies the window into one contiguous [heads, length, head_dim] view in `arena` and emits
  /// one adapter_inserted{"gather-kv-window", target, bytes}; O(length * heads * head_dim).
  /// `target` names what is gathered ("keys", "values") and must be a static string.
  tensor_view gather(scope& arena, trace::sink& sink, std::string_view target = "kv") const;
  /// The gathered window as a one-run windowed_kv over `arena` (same positions); as gather().
  windowed_kv gathered(scope& arena, trace::sink& sink, std::string_view target = "kv") const;

 private:
  void add(const tensor_view& v, std::size_t first_position);
  [[noreturn]] void refuse_run(std::size_t i) const;

  std::array<tensor_view, max_runs> views_{};
  std::array<std::size_t, max_runs> starts_{};
  std::size_t count_ = 0;
  std::size_t length_ = 0;
};

}  // namespace ringkv
