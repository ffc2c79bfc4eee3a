// ringkv.parallel: default_thread_pool. One call at a time: the caller fills a slot with the task
// and fresh claims, bumps the generation (workers spinning see it; sleeping ones are woken);
// everyone claims indices, its own share first (take_tasks); the caller returns when no worker
// is inside the call any more. No lock on that path: the mutex is only for sleeping and waking
// (and errors).
// A hand-off under the mutex costs small 2-thread steps more. Waits spin a while before they
// block, as decode steps come back to back: waking a blocked thread costs more than a small step.
// Re-measure: scripts/bench-targets --shapes '/256/' (2 threads ÷ 1).
module;
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "spin.h"
module ringkv.parallel;

namespace ringkv {
namespace {

// The pool whose tasks this thread is running now: a nested parallel_for on it runs inline.
thread_local const void* running_pool = nullptr;

/// Sets running_pool for the life of a call and restores the previous one.
class running_guard {
 public:
  explicit running_guard(const void* pool) noexcept
      : previous_(std::exchange(running_pool, pool)) {}
  ~running_guard() { running_pool = previous_; }
  running_guard(const running_guard&) = delete;
  running_guard& operator=(const running_guard&) = delete;

 private:
  const void* previous_;
};

/// How long a wait spins before it blocks: enough to catch the next step of a decode loop,
/// short enough that an idle pool stops burning a core almost at once.
constexpr std::chrono::microseconds spin_for{100};

/// Spins until done() or spin_for has passed; returns done(). done() is tried before the clock
/// is read: a caller whose workers have already left (and a worker whose next call has come)
/// goes on at once. Re-measure: build/release/bench/pool_bench --benchmark_filter=pool
template <class Done>
bool spin_until(Done&& done) {
  if (done()) return true;
  const auto until = std::chrono::steady_clock::now() + spin_for;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      spin::relax();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

std::size_t threads_for(std::size_t requested) {
  if (requested > 0) return requested;
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

}  // namespace

class default_thread_pool::shared {
 public:
  explicit shared(std::size_t threads) : threads_(threads) {
    workers_.reserve(threads - 1);
    for (std::size_t i = 1; i < threads; ++i)
      workers_.emplace_back([this, i](const std::stop_token& stop) { work(stop, i); });
  }
  // workers_ is the last member: its jthreads are stopped and joined before the rest goes.

  std::size_t size() const noexcept { return threads_; }

  bool runs_here() const noexcept { return running_pool == this; }

  void run(std::size_t n, const task_ref& fn) {
    const std::lock_guard one_call(call_mutex_);
    // A worker that joined the previous call late (claiming nothing) may still read its slot,
    // the one the call after this writes: it must have left before that slot is rewritten.
    await_no_worker();
    const std::uint64_t g = generation_.load(std::memory_order_relaxed) + 1;  // callers only
    call& c = calls_[g % 2];
    c.job = &fn;
    c.n = n;
    c.next.store(0, std::memory_order_relaxed);
    c.claimed.store(0, std::memory_order_relaxed);
    c.failed.store(false, std::memory_order_relaxed);
    generation_.store(g);  // publishes the slot
    if (sleepers_.load() != 0) {
      {
        const std::lock_guard lock(mutex_);
      }  // a sleeper is inside wait() or saw g
      wake_.notify_all();
    }
    {
      const running_guard guard(this);
      take_tasks(c, 0);
    }
    // Every index is claimed now; a worker that claimed one is counted in busy_ until done.
    await_no_worker();
    if (c.failed.load(std::memory_order_relaxed)) {
      std::exception_ptr error;
      {
        const std::lock_guard lock(mutex_);
        error = std::exchange(error_, nullptr);
      }
      std::rethrow_exception(error);
    }
  }

 private:
  static constexpr std::size_t max_shared_tasks = 64;  // the bits of call::claimed

  /// One call's task and counter. Two slots, by generation parity: a worker late for call g
  /// reads slot g % 2 while call g + 1 fills the other, and call g + 2 waits until it has left.
  struct call {
    const task_ref* job = nullptr;  // the caller's, alive for its call
    std::size_t n = 0;
    alignas(64) std::atomic<std::size_t> next{0};  // claimed by every thread: a line of its own
    std::atomic<std::uint64_t> claimed{0};         // n ≤ max_shared_tasks: bit i, index i taken
    std::atomic<bool> failed{false};
  };

  /// Runs indices until none is left: participant p (the caller 0, worker k k) first its own
  /// share [p·n/threads, (p+1)·n/threads), then whatever the others have not claimed. Calls of
  /// the same n give each participant the same share every time, so a decode step split by kv
  /// heads keeps each head's rows in one core's L2 step after step. Beyond 64 tasks, one
  /// counter for all (one counter for every call costs 2-thread steps whose rows fit the L2
  /// more). Re-measure: scripts/bench-targets --shapes '/256/'
  void take_tasks(call& c, std::size_t participant) {
    if (c.n > max_shared_tasks) {
      for (std::size_t i; (i = c.next.fetch_add(1)) < c.n;) run_one(c, i);
      return;
    }
    const std::size_t home = participant * c.n / threads_;
    for (std::size_t k = 0; k < c.n; ++k) {
      const std::size_t i = (home + k) % c.n;
      const std::uint64_t bit = std::uint64_t(1) << i;
      // The plain load skips indices seen taken without a locked instruction for each.
      if ((c.claimed.load(std::memory_order_relaxed) & bit) == 0 &&
          (c.claimed.fetch_or(bit) & bit) == 0)
        run_one(c, i);
    }
  }

  /// Runs task i, or skips it once a task of the call has failed.
  void run_one(call& c, std::size_t i) {
    if (c.failed.load(std::memory_order_relaxed)) return;
    try {
      (*c.job)(i);
    } catch (...) {
      keep(c, std::current_exception());  // rethrown by run(), on the caller's thread
    }
  }

  void keep(call& c, std::exception_ptr error) {
    const std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(error);
    c.failed.store(true, std::memory_order_relaxed);
  }

  /// The caller's wait until no worker is inside a call: spins, then sleeps on left_.
  // The orderings are sequentially consistent (free on x86 but for the stores): a worker
  // leaving (busy_ down, then caller_waiting_ read) and the caller going to sleep
  // (caller_waiting_ set, then busy_ read) cannot both miss each other.
  void await_no_worker() {
    const auto none = [this] { return busy_.load() == 0; };
    if (spin_until(none)) return;
    std::unique_lock lock(mutex_);
    caller_waiting_.store(true);
    left_.wait(lock, none);
    caller_waiting_.store(false, std::memory_order_relaxed);
  }

  /// A worker's wait for a call after `seen`: spins, then sleeps on wake_; false when stopped.
  bool await_call(std::uint64_t seen, std::stop_token& stop) {
    const auto called = [&] { return generation_.load() != seen; };
    if (spin_until([&] { return called() || stop.stop_requested(); })) return called();
    std::unique_lock lock(mutex_);
    sleepers_.fetch_add(1);  // then generation_ read in wait(): see run()
    const bool woken = wake_.wait(lock, stop, called);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return woken;
  }

  void work(std::stop_token stop, std::size_t participant) {
    const running_guard guard(this);
    for (std::uint64_t seen = 0; await_call(seen, stop);) {
      busy_.fetch_add(1);  // before reading which call to join: see call
      seen = generation_.load();
      take_tasks(calls_[seen % 2], participant);
      if (busy_.fetch_sub(1) == 1 && caller_waiting_.load()) {
        {
          const std::lock_guard lock(mutex_);
        }  // the caller is inside wait() or saw busy_ 0
        left_.notify_all();
      }
    }
  }

  const std::size_t threads_;
  std::mutex call_mutex_;  // serialises parallel_for calls from several threads
  std::mutex mutex_;       // for sleeping and waking, and error_
  std::condition_variable_any wake_;
  std::condition_variable left_;
  std::exception_ptr error_;  // the first exception of the current call
  call calls_[2];
  alignas(64) std::atomic<std::uint64_t> generation_{0};  // call count: workers wait for a change
  std::atomic<std::size_t> sleepers_{0};                  // workers asleep (or going) on wake_
  alignas(64) std::atomic<std::size_t> busy_{0};          // workers inside a call
  std::atomic<bool> caller_waiting_{false};               // run() asleep (or going) on left_
  std::vector<std::jthread> workers_;
};

default_thread_pool::default_thread_pool(std::size_t threads)
    : shared_(std::make_unique<shared>(threads_for(threads))) {}

default_thread_pool::~default_thread_pool() = default;

std::size_t default_thread_pool::size() const noexcept { return shared_->size(); }

void default_thread_pool::parallel_for(std::size_t n, task_ref fn) {
  if (n == 0) return;
  if (n == 1 || shared_->size() == 1 || shared_->runs_here()) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  shared_->run(n, fn);
}

}  // namespace ringkv
