// The cost of one parallel_for on default_thread_pool(2) against a minimal fork-join measured in
// the same process: one spinning worker, one cache line for the call and one for done (no
// sleeping, no errors, no nesting: the least any pool must do). Tasks:
//   empty     nothing: the round trip alone
//   read      each of the two tasks reads its own half of a 1 MiB buffer (L2-resident: the size
//             of a D 64 / W 256 / kv 8 step's K and V)
// The minimal worker spins only while its benchmark runs (it is joined at the end), so it does
// not take a core from the pool's benchmarks. Run: build/release/bench/pool_bench.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "parallel/spin.h"
#include "stream_read.h"

import ringkv;

namespace {

/// One worker spinning on a generation; run(fn) runs fn(0) here and fn(1) there.
class minimal_fork_join {
 public:
  minimal_fork_join() : worker_([this] { work(); }) {}
  ~minimal_fork_join() {
    stop_.store(true);
    worker_.join();
  }

  template <class F>
  void run(F& fn) {
    job_ = &fn;
    invoke_ = [](void* f, std::size_t i) { (*static_cast<F*>(f))(i); };
    generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    fn(0);
    while (done_.load(std::memory_order_acquire) != generation_.load(std::memory_order_relaxed))
      ringkv::spin::relax();
  }

 private:
  void work() {
    for (std::uint64_t seen = 0;;) {
      std::uint64_t g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        if (stop_.load(std::memory_order_relaxed)) return;
        ringkv::spin::relax();
      }
      invoke_(job_, 1);
      done_.store(seen = g, std::memory_order_release);
    }
  }

  void* job_ = nullptr;
  void (*invoke_)(void*, std::size_t) = nullptr;
  alignas(64) std::atomic<std::uint64_t> generation_{0};
  alignas(64) std::atomic<std::uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::thread worker_;  // last: started once the rest is built
};

ringkv::default_thread_pool& pool_of_two() {
  static ringkv::default_thread_pool pool(2);
  return pool;
}

/// The task of each variant: nothing, or half of a 1 MiB buffer each.
struct tasks {
  explicit tasks(bool read) : data(read ? (1 << 20) / sizeof(float) : 0, 1.0f) {}
  std::vector<float> data;  // [2, 128 Ki floats]
  float sums[2] = {};
  void operator()(std::size_t t) {
    const std::size_t half = data.size() / 2;
    if (half) sums[t] = ringkv_bench::stream_read(data.data() + t * half, half);
  }
};

void pool(benchmark::State& state) {
  tasks t(state.range(0) != 0);
  for (auto _ : state) {
    pool_of_two().parallel_for(2, t);
    benchmark::DoNotOptimize(t.sums);
  }
}

void minimal(benchmark::State& state) {
  tasks t(state.range(0) != 0);
  minimal_fork_join fork_join;
  for (auto _ : state) {
    fork_join.run(t);
    benchmark::DoNotOptimize(t.sums);
  }
}

void one_thread(benchmark::State& state) {
  tasks t(state.range(0) != 0);
  for (auto _ : state) {
    t(0);
    t(1);
    benchmark::DoNotOptimize(t.sums);
  }
}

}  // namespace

// Arg 0: empty tasks; 1: each reads its 512 KiB half.
BENCHMARK(pool)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Repetitions(5);
BENCHMARK(minimal)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Repetitions(5);
BENCHMARK(one_thread)->Arg(1)->Unit(benchmark::kMicrosecond)->Repetitions(5);
BENCHMARK_MAIN();
