// A replaced global operator new that counts calls, for "no allocation" claims in tests.
#pragma once
#include <cstdint>

namespace ringkv_test {
/// Calls of any global operator new (all forms) since the program started; under
/// ThreadSanitizer, allocations of its allocator (operator new and malloc alike).
std::uint64_t new_calls() noexcept;

/// Counts the operator new calls made while it is alive.
class new_counter {
 public:
  new_counter() noexcept : start_(new_calls()) {}
  std::uint64_t calls() const noexcept { return new_calls() - start_; }

 private:
  std::uint64_t start_;
};
}  // namespace ringkv_test
