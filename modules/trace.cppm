// ringkv.trace — what the library allocates and copies, as events a sink receives and a
// recorder keeps, delivered as a range.
module;
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <span>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>
#include <range/v3/view/concat.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/transform.hpp>
export module ringkv.trace;

// The trace's ranges are range-v3 views. Their iterator comparisons are free templates in
// namespace ranges that an importer would only see by including range-v3 itself; re-export them
// so `import ringkv;` alone is enough to range-for over events() and of<E>().
export namespace ranges {
using ranges::operator==;
using ranges::operator!=;
}  // namespace ranges

export namespace ringkv::trace {

// Names are string_views over static strings (literals): an event never allocates.
struct allocation {
  std::string_view site;
  std::size_t bytes = 0;
  std::uint64_t sequence = 0;  // the pool sequence it concerns (kv_cache_pool); 0: none
};
struct release {
  std::string_view site;
  std::size_t bytes = 0;
  std::uint64_t sequence = 0;  // the pool sequence it concerns (kv_cache_pool); 0: none
};
/// A copy that changes layout or format on a kernel's path (e.g. "gather-kv-window").
struct adapter_inserted {
  std::string_view kind;
  std::string_view target;
  std::size_t bytes = 0;
  std::uint64_t sequence = 0;  // the pool sequence it concerns (kv_cache_pool); 0: none
};
struct scope_reset {
  std::size_t live_before = 0;
  std::size_t live_after = 0;
};
struct kernel_run {
  std::string_view kernel;
  std::size_t bytes_read = 0;
  std::size_t bytes_written = 0;
  std::int64_t nanos = 0;
  std::uint64_t sequence = 0;  // the pool sequence it concerns (kv_cache_pool); 0: none
};

using event = std::variant<allocation, release, adapter_inserted, scope_reset, kernel_run>;

/// Where events go. Producers test enabled() first, so a disabled trace costs one branch.
class sink {
 public:
  virtual ~sink() = default;
  /// Whether emit() wants events at all; O(1).
  virtual bool enabled() const noexcept = 0;
  /// Whether the sink also wants a kernel_run per kernel call (timed; off by default).
  virtual bool wants_kernel_runs() const noexcept { return false; }
  /// Receives one event; must not throw for a well-behaved producer to stay noexcept.
  virtual void emit(const event& e) = 0;
};

/// A process-wide sink that is never enabled; O(1), no allocation.
sink& null_sink() noexcept;

/// Forwards every event to another sink with its `sequence` set: what one sequence of a pool
/// emits (its stores, and attention given this sink) names it. O(1) an event, no allocation.
class sequence_sink final : public sink {
 public:
  sequence_sink(sink& to, std::uint64_t sequence) noexcept : to_(&to), sequence_(sequence) {}
  bool enabled() const noexcept override { return to_->enabled(); }
  bool wants_kernel_runs() const noexcept override { return to_->wants_kernel_runs(); }
  void emit(const event& e) override;
  std::uint64_t sequence() const noexcept { return sequence_; }

 private:
  sink* to_;
  std::uint64_t sequence_;
};

/// An event with the time it was recorded (nanoseconds since the recorder was created).
struct stamped_event {
  std::int64_t at_nanos = 0;
  event what;
};

// Named function objects rather than lambdas: range-v3 copies and default-constructs its
// callables, which clang refuses for lambdas that come from a module interface.
namespace detail {
struct event_of {
  const event& operator()(const stamped_event& s) const noexcept { return s.what; }
};
template <class E>
struct holds {
  bool operator()(const event& e) const noexcept { return std::holds_alternative<E>(e); }
};
template <class E>
struct as {
  const E& operator()(const event& e) const noexcept { return *std::get_if<E>(&e); }
};
}  // namespace detail

/// Keeps the newest `capacity` events in a ring allocated once at construction.
class recorder final : public sink {
 public:
  /// Allocates room for `capacity` events once (capacity > 0, else std::invalid_argument).
  explicit recorder(std::size_t capacity, bool kernel_runs = false);

  bool enabled() const noexcept override { return true; }
  bool wants_kernel_runs() const noexcept override { return kernel_runs_; }
  /// Stores the event, overwriting the oldest when full; O(1), never allocates.
  void emit(const event& e) override;

  /// The held events oldest-first, with their time: the ring's two runs joined; O(1).
  auto stamped() const {
    auto [older, newer] = runs();
    return ranges::views::concat(older, newer);
  }
  /// The held events oldest-first as a range of `const event&`; O(1) to build.
  auto events() const { return stamped() | ranges::views::transform(detail::event_of{}); }
  /// Only the events of type E, as a range of `const E&`; O(1) to build.
  template <class E>
  auto of() const {
    return events() | ranges::views::filter(detail::holds<E>{}) |
           ranges::views::transform(detail::as<E>{});
  }

  /// Sum of the bytes of the held allocation events; O(held events).
  std::size_t allocated_bytes() const {
    std::size_t total = 0;
    for (const allocation& a : of<allocation>()) total += a.bytes;
    return total;
  }
  /// Sum of the bytes of the held adapter_inserted events (copies on a kernel's path).
  std::size_t copied_bytes() const {
    std::size_t total = 0;
    for (const adapter_inserted& a : of<adapter_inserted>()) total += a.bytes;
    return total;
  }

  std::size_t capacity() const noexcept { return ring_.size(); }
  std::size_t size() const noexcept { return held_; }
  /// Events ever emitted since construction or clear().
  std::uint64_t emitted() const noexcept { return emitted_; }
  /// Events overwritten because the ring was full.
  std::uint64_t dropped() const noexcept { return emitted_ - held_; }
  /// Forgets all events and the counters; keeps the buffer.
  void clear() noexcept;

 private:
  std::pair<std::span<const stamped_event>, std::span<const stamped_event>> runs() const noexcept;

  std::vector<stamped_event> ring_;  // [capacity]
  std::size_t next_ = 0;             // slot the next event goes to
  std::size_t held_ = 0;
  std::uint64_t emitted_ = 0;
  bool kernel_runs_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Writes one event as a Chrome trace JSON object (Perfetto UI opens the file).
void write_chrome_event(std::ostream& os, const event& e, std::int64_t at_nanos, bool first);
/// Writes the opening of a Chrome trace JSON document.
void begin_chrome_trace(std::ostream& os);
/// Writes the closing of a Chrome trace JSON document.
void end_chrome_trace(std::ostream& os);

/// Writes a Chrome trace JSON document of `events` (a range of stamped_event, or of event, then
/// one microsecond apart); O(events).
template <class Range>
  requires(!std::is_base_of_v<recorder, std::remove_cvref_t<Range>>)
void write_chrome_trace(std::ostream& os, Range&& events) {
  begin_chrome_trace(os);
  bool first = true;
  std::int64_t index = 0;
  for (const auto& e : events) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(e)>, stamped_event>)
      write_chrome_event(os, e.what, e.at_nanos, first);
    else
      write_chrome_event(os, e, index * 1000, first);
    first = false;
    ++index;
  }
  end_chrome_trace(os);
}

/// Writes a recorder's held events as a Chrome trace JSON document; O(events).
inline void write_chrome_trace(std::ostream& os, const recorder& r) {
  write_chrome_trace(os, r.stamped());
}

}  // namespace ringkv::trace
