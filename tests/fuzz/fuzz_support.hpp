// Shared by the fuzz targets: outcome classes of a call (support/outcome.hpp, shared with
// tests/model_test.cpp) and a failure that stops the fuzzer with a message. Include after
// `import ringkv;`.
#pragma once
#include "outcome.hpp"

namespace fuzz {

/// Prints the divergence and aborts, so libFuzzer saves the input that caused it.
[[noreturn]] inline void diverged(const char* what, std::size_t a, std::size_t b) {
  std::fprintf(stderr, "DIVERGENCE: %s (store %zu, reference %zu)\n", what, a, b);
  std::abort();
}

inline void require(bool ok, const char* what) {
  if (!ok) diverged(what, 0, 0);
}

using ringkv_test::outcome;

}  // namespace fuzz
