// Shared by the fuzz targets: outcome classes of a call (as tests/model_test.cpp) and a failure
// that stops the fuzzer with a message. Include after `import ringkv;`.
#pragma once

namespace fuzz {

/// Prints the divergence and aborts, so libFuzzer saves the input that caused it.
[[noreturn]] inline void diverged(const char* what, std::size_t a, std::size_t b) {
  std::fprintf(stderr, "DIVERGENCE: %s (store %zu, reference %zu)\n", what, a, b);
  std::abort();
}

inline void require(bool ok, const char* what) {
  if (!ok) diverged(what, 0, 0);
}

/// 0 success, 1 cache_full, 2 out_of_range, 3 invalid_argument; anything else escapes (a crash).
template <class F>
int outcome(F&& f) {
  try {
    f();
    return 0;
  } catch (const ringkv::cache_full&) {
    return 1;
  } catch (const std::out_of_range&) {
    return 2;
  } catch (const std::invalid_argument&) {
    return 3;
  }
}

}  // namespace fuzz
