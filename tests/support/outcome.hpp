// The outcome class of a store call, shared by the model test and the fuzz targets, which
// compare a store's outcome with the reference model's. Include after `import ringkv;`.
#pragma once
#include <stdexcept>

namespace ringkv_test {

/// 0 success, 1 cache_full, 2 out_of_range, 3 invalid_argument; anything else escapes.
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

}  // namespace ringkv_test
