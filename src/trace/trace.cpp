module;
#include <chrono>
#include <cstddef>
#include <ostream>
#include <span>
#include <utility>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
module ringkv.trace;

namespace ringkv::trace {
namespace {
class disabled_sink final : public sink {
 public:
  bool enabled() const noexcept override { return false; }
  void emit(const event&) override {}
};

// JSON string escaping for the few characters a site name could carry.
void write_json_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (char c : s) {
    if (c == '"' || c == '\\')
      os << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20)
      os << ' ';
    else
      os << c;
  }
  os << '"';
}

// Microseconds with three decimals, as Chrome's "ts"/"dur" expect, without stream state.
void write_micros(std::ostream& os, std::int64_t nanos) {
  if (nanos < 0) {
    os << '-';
    nanos = -nanos;
  }
  const auto frac = nanos % 1000;
  os << nanos / 1000 << '.' << char('0' + frac / 100) << char('0' + frac / 10 % 10)
     << char('0' + frac % 10);
}

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;
}  // namespace

sink& null_sink() noexcept {
  static disabled_sink s;
  return s;
}

void sequence_sink::emit(const event& e) {
  event tagged = e;
  std::visit(
      [this](auto& x) {
        if constexpr (requires { x.sequence; }) x.sequence = sequence_;
      },
      tagged);
  to_->emit(tagged);
}

recorder::recorder(std::size_t capacity, bool kernel_runs) : kernel_runs_(kernel_runs) {
  if (capacity == 0) throw std::invalid_argument("ringkv::trace::recorder: capacity must be > 0");
  ring_.resize(capacity);
}

void recorder::emit(const event& e) {
  const auto now = std::chrono::steady_clock::now() - start_;
  ring_[next_] =
      stamped_event{std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(), e};
  next_ = next_ + 1 == ring_.size() ? 0 : next_ + 1;
  if (held_ < ring_.size()) ++held_;
  ++emitted_;
}

void recorder::clear() noexcept {
  next_ = 0;
  held_ = 0;
  emitted_ = 0;
}

std::pair<std::span<const stamped_event>, std::span<const stamped_event>> recorder::runs()
    const noexcept {
  const std::span<const stamped_event> all(ring_);
  if (held_ < ring_.size()) return {all.first(held_), {}};
  return {all.subspan(next_), all.first(next_)};  // oldest is at next_ once full
}

void begin_chrome_trace(std::ostream& os) {
  os << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
}
void end_chrome_trace(std::ostream& os) { os << "\n]}\n"; }

void write_chrome_event(std::ostream& os, const event& e, std::int64_t at_nanos, bool first) {
  if (!first) os << ",\n";
  auto head = [&](std::string_view name, std::string_view cat, char ph) {
    os << "{\"name\":";
    write_json_string(os, name);
    os << ",\"cat\":\"" << cat << "\",\"ph\":\"" << ph << "\",\"pid\":1,\"tid\":1,\"ts\":";
    write_micros(os, at_nanos);
    if (ph == 'i') os << ",\"s\":\"t\"";
  };
  std::visit(overloaded{
                 [&](const allocation& a) {
                   head(a.site, "allocation", 'i');
                   os << ",\"args\":{\"bytes\":" << a.bytes << "}}";
                 },
                 [&](const release& r) {
                   head(r.site, "release", 'i');
                   os << ",\"args\":{\"bytes\":" << r.bytes << "}}";
                 },
                 [&](const adapter_inserted& a) {
                   head(a.kind, "adapter", 'i');
                   os << ",\"args\":{\"target\":";
                   write_json_string(os, a.target);
                   os << ",\"bytes\":" << a.bytes << "}}";
                 },
                 [&](const scope_reset& s) {
                   head("scope_reset", "scope", 'i');
                   os << ",\"args\":{\"live_before\":" << s.live_before
                      << ",\"live_after\":" << s.live_after << "}}";
                 },
                 [&](const kernel_run& k) {
                   // A complete event that ends at the moment it was recorded.
                   os << "{\"name\":";
                   write_json_string(os, k.kernel);
                   os << ",\"cat\":\"kernel\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":";
                   write_micros(os, at_nanos - k.nanos);
                   os << ",\"dur\":";
                   write_micros(os, k.nanos);
                   os << ",\"args\":{\"bytes_read\":" << k.bytes_read
                      << ",\"bytes_written\":" << k.bytes_written << "}}";
                 },
             },
             e);
}

}  // namespace ringkv::trace
