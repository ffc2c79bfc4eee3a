// One step of a spinning wait, shared by default_thread_pool (parallel.cpp) and the minimal
// fork-join it is measured against (bench/pool_bench.cpp), so the two spin the same way.
#pragma once
#include <thread>

namespace ringkv::spin {

/// A pause hint to the core (its sibling thread runs on), or a yield where there is none; O(1).
inline void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace ringkv::spin
