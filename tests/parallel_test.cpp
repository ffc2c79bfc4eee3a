#define BOOST_TEST_MODULE parallel
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/operations.hpp>

#include "count_new.hpp"
#include "hwy_targets.hpp"

import ringkv;

namespace kernels = ringkv::kernels;
namespace trace = ringkv::trace;
using ringkv::default_thread_pool;
using ringkv::windowed_attention;
using ringkv::windowed_kv;

namespace {

// ---- pools ----------------------------------------------------------------------------------

/// A caller-supplied pool: everything on the caller, tasks in reverse order; counts its use.
class reverse_pool final : public ringkv::thread_pool {
 public:
  explicit reverse_pool(std::size_t size) : size_(size) {}
  std::size_t size() const noexcept override { return size_; }
  void parallel_for(std::size_t n, ringkv::task_ref fn) override {
    ++calls;
    tasks += n;
    for (std::size_t i = n; i-- > 0;) fn(i);
  }
  std::size_t calls = 0, tasks = 0;

 private:
  std::size_t size_;
};

/// How often each index of [0, n) ran.
std::vector<std::size_t> runs_per_index(ringkv::thread_pool& pool, std::size_t n) {
  std::vector<std::atomic<std::size_t>> seen(n);
  pool.parallel_for(n, [&](std::size_t i) { seen[i].fetch_add(1, std::memory_order_relaxed); });
  std::vector<std::size_t> out;
  for (const auto& s : seen) out.push_back(s.load());
  return out;
}

bool each_once(const std::vector<std::size_t>& runs) {
  for (std::size_t r : runs)
    if (r != 1) return false;
  return true;
}

/// Spins for about `micros` microseconds (a task that takes time without sleeping).
void busy_for(std::chrono::microseconds micros) {
  const auto until = std::chrono::steady_clock::now() + micros;
  while (std::chrono::steady_clock::now() < until) {}
}

/// Runs size() tasks that each wait until all have started: they can only all meet if size()
/// threads run them at once, the caller being one of them. Returns whether they met (a broken
/// pool gives false after 5 s instead of hanging) and which thread ran each task.
std::pair<bool, std::vector<std::thread::id>> meet_at_once(ringkv::thread_pool& pool) {
  const std::size_t threads = pool.size();
  std::atomic<std::size_t> started{0};
  std::atomic<bool> all_met{true};
  std::vector<std::thread::id> ran_on(threads);
  pool.parallel_for(threads, [&](std::size_t i) {
    ran_on[i] = std::this_thread::get_id();
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (started.load() < threads)
      if (std::chrono::steady_clock::now() > deadline) {
        all_met = false;
        return;
      }
  });
  return {all_met.load(), ran_on};
}

// ---- a wrapped ring and its windows ---------------------------------------------------------

struct shape {
  std::size_t q_heads, kv_heads, head_dim, window, keep;
  bool learned_sinks;
};

std::string describe(const shape& s) {
  return "q " + std::to_string(s.q_heads) + " kv " + std::to_string(s.kv_heads) + " dim " +
         std::to_string(s.head_dim) + " W " + std::to_string(s.window) + " keep " +
         std::to_string(s.keep) + (s.learned_sinks ? " sinks" : "");
}

/// A default_kv_cache_store ring of capacity W (keep pinned) filled with cheap pseudo-random
/// rows (an LCG: the ring is wrapped several times, so millions of elements) and a query per
/// step; window(p) is the window of the token at position p as the store hands it out.
class ring {
 public:
  explicit ring(const shape& s)
      : s_(s),
        store_(
            ringkv::kv_cache_config{
                .layers = 1, .kv_heads = s.kv_heads, .head_dim = s.head_dim, .capacity = s.window},
            ringkv::store_options{.sliding_window = true, .keep = s.keep}),
        k_(s.kv_heads * s.head_dim), v_(k_.size()), q_(s.q_heads * s.head_dim),
        sinks_(s.learned_sinks ? s.q_heads : 0) {
    for (float& x : sinks_) x = next();
  }

  /// Appends tokens until the ring holds position `last`; returns the last position written.
  std::size_t append_until(std::size_t last) {
    std::size_t p = store_.length(0);
    for (; store_.length(0) <= last;) {
      fill(k_);
      fill(v_);
      p = store_.append(0, k_, v_);
    }
    return p;
  }
  /// Appends one token and makes a fresh query; returns its position.
  std::size_t step() {
    const std::size_t p = append_until(store_.length(0));
    fill(q_);
    return p;
  }
  /// Appends tokens up to `position` (the ring wrapped if it is past W) and makes its query.
  std::size_t at(std::size_t position) {
    append_until(position - 1);
    return step();
  }
  std::size_t from(std::size_t p) const {
    return p + 1 > s_.window ? p + 1 - (s_.window - s_.keep) : 0;
  }
  windowed_kv keys(std::size_t p) const { return store_.key_window(0, from(p), p + 1); }
  windowed_kv values(std::size_t p) const { return store_.value_window(0, from(p), p + 1); }
  std::span<const float> query() const { return q_; }
  std::span<const float> sinks() const { return sinks_; }

 private:
  float next() { return float(int32_t(x_ = x_ * 1664525u + 1013904223u)) * 0x1.0p-31f; }
  void fill(std::vector<float>& row) {
    for (float& f : row) f = next();
  }

  shape s_;
  ringkv::default_kv_cache_store store_;
  std::vector<float> k_, v_, q_, sinks_;
  std::uint32_t x_ = 2463534242u;
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// out of one decode step of the ring's current token through `attention`.
std::vector<float> decoded(const windowed_attention& attention, const ring& r, std::size_t p,
                           std::size_t q_width) {
  std::vector<float> out(q_width);
  attention.decode_step(r.query(), r.keys(p), r.values(p), out, 0.0f, r.sinks());
  return out;
}

/// 8 query heads over 2 kv heads of 32 dims, a ring of W 3000 (steps split by segment on 3
/// threads); tests pick the position.
struct two_kv_heads {
  shape s{8, 2, 32, 3000, 0, false};
  ring r{s};
  std::size_t width = 8 * 32;
};

/// The bits every split must give: the step without a pool.
std::vector<float> unsplit(const ring& r, std::size_t p, std::size_t q_width) {
  return decoded(windowed_attention(), r, p, q_width);
}

}  // namespace

// ---- the pool -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(
    parallel_for_runs_each_index_once_for_no_one_few_and_many_more_tasks_than_threads) {
  for (std::size_t threads : {1, 2, 3, 8}) {
    default_thread_pool pool(threads);
    BOOST_TEST(pool.size() == threads);
    std::atomic<std::size_t> calls{0};
    pool.parallel_for(0, [&](std::size_t) { calls.fetch_add(1); });
    BOOST_TEST(calls.load() == 0u);
    for (std::size_t n : {1, 2, 3, 7, 8, 9, 63, 64, 65, 1000, 100000})
      BOOST_TEST(each_once(runs_per_index(pool, n)), threads << " threads, n " << n);
  }
}

BOOST_AUTO_TEST_CASE(a_pool_sized_from_the_hardware_has_at_least_one_thread) {
  default_thread_pool pool;
  const std::size_t hw = std::thread::hardware_concurrency();
  BOOST_TEST(pool.size() == (hw == 0 ? 1 : hw));
  BOOST_TEST(each_once(runs_per_index(pool, 64)));
}

BOOST_AUTO_TEST_CASE(a_pool_of_one_runs_every_task_on_the_caller_in_order) {
  default_thread_pool pool(1);
  std::vector<std::size_t> order;
  std::set<std::thread::id> threads;
  pool.parallel_for(5, [&](std::size_t i) {
    order.push_back(i);
    threads.insert(std::this_thread::get_id());
  });
  BOOST_TEST(order == (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  BOOST_TEST(threads == std::set<std::thread::id>{std::this_thread::get_id()});
}

BOOST_AUTO_TEST_CASE(the_caller_and_every_worker_run_tasks_at_the_same_time) {
  for (std::size_t threads : {2, 3, 4}) {
    default_thread_pool pool(threads);
    const auto [all_met, ran_on] = meet_at_once(pool);
    BOOST_TEST(all_met, threads << " threads");
    const std::set<std::thread::id> distinct(ran_on.begin(), ran_on.end());
    BOOST_TEST(distinct.size() == threads);
    BOOST_TEST(distinct.count(std::this_thread::get_id()) == 1u);
  }
}

BOOST_AUTO_TEST_CASE(with_a_task_a_thread_each_call_after_call_runs_each_index_on_the_same_thread) {
  // Every task waits for all the others to start, so none can take a second one: each thread
  // runs the first index of its own share, the caller index 0.
  for (std::size_t threads : {2, 3, 4}) {
    default_thread_pool pool(threads);
    const auto [met, first] = meet_at_once(pool);
    BOOST_TEST(met, threads << " threads");
    BOOST_TEST((first[0] == std::this_thread::get_id()), threads << " threads");
    for (int call = 0; call < 20; ++call) {
      const auto [all_met, ran_on] = meet_at_once(pool);
      BOOST_TEST(all_met, threads << " threads, call " << call);
      BOOST_TEST((ran_on == first), threads << " threads, call " << call);
    }
  }
}

BOOST_AUTO_TEST_CASE(an_exception_in_a_task_reaches_the_caller_and_the_pool_stays_usable) {
  for (std::size_t threads : {1, 2, 3}) {
    default_thread_pool pool(threads);
    for (int round = 0; round < 3; ++round) {
      BOOST_CHECK_EXCEPTION(pool.parallel_for(100,
                                              [](std::size_t i) {
                                                if (i == 37) throw std::runtime_error("task 37");
                                              }),
                            std::runtime_error, [](const std::runtime_error& e) {
                              return e.what() == std::string("task 37");
                            });
      BOOST_TEST(each_once(runs_per_index(pool, 1000)), threads << " threads, round " << round);
    }
  }
}

BOOST_AUTO_TEST_CASE(when_several_tasks_throw_one_of_their_exceptions_reaches_the_caller) {
  default_thread_pool pool(3);
  std::string what;
  try {
    pool.parallel_for(64, [](std::size_t i) {
      if (i % 8 == 3) throw std::out_of_range("task " + std::to_string(i));
    });
  } catch (const std::out_of_range& e) {
    what = e.what();
  }
  const std::set<std::string> thrown{"task 3",  "task 11", "task 19", "task 27",
                                     "task 35", "task 43", "task 51", "task 59"};
  BOOST_TEST(thrown.count(what) == 1u, "caught '" << what << "'");
}

// Documented: after a task throws, tasks not yet started are skipped. Task 0 throws at once;
// the others take 200 µs each: running half of them would take 130 ms on three threads.
BOOST_AUTO_TEST_CASE(after_a_task_throws_the_tasks_not_yet_started_are_skipped) {
  default_thread_pool pool(3);
  std::atomic<std::size_t> ran{0};
  BOOST_CHECK_THROW(pool.parallel_for(2000,
                                      [&](std::size_t i) {
                                        if (i == 0) throw std::logic_error("first");
                                        busy_for(std::chrono::microseconds(200));
                                        ran.fetch_add(1);
                                      }),
                    std::logic_error);
  BOOST_TEST(ran.load() < 1000u);
}

BOOST_AUTO_TEST_CASE(a_task_that_calls_parallel_for_on_its_own_pool_runs_the_inner_tasks_inline) {
  default_thread_pool pool(2);
  std::vector<std::atomic<std::size_t>> seen(4 * 3);
  std::atomic<bool> same_thread{true};  // Boost.Test checks stay on the main thread
  pool.parallel_for(4, [&](std::size_t outer) {
    const std::thread::id me = std::this_thread::get_id();
    pool.parallel_for(3, [&](std::size_t inner) {
      if (std::this_thread::get_id() != me) same_thread = false;
      seen[outer * 3 + inner].fetch_add(1);
    });
  });
  BOOST_TEST(same_thread.load());
  for (const auto& s : seen) BOOST_TEST(s.load() == 1u);
}

BOOST_AUTO_TEST_CASE(callers_on_several_threads_share_one_pool_and_each_gets_all_its_tasks) {
  default_thread_pool pool(3);
  std::atomic<bool> ok{true};
  std::vector<std::jthread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int round = 0; round < 100; ++round)
        if (!each_once(runs_per_index(pool, 50))) ok = false;
    });
  callers.clear();  // joins
  BOOST_TEST(ok.load());
}

// Calls back to back, and some after a pause long enough for the workers to fall asleep (they
// spin 100 µs), so every hand-off runs: to a spinning worker, to a sleeping one, and with a
// worker still leaving the call before. A worker left asleep fails the meeting after 5 s; a
// caller left asleep hangs (the suite's CTest timeout fails it); a call's slot reused too early
// runs an index twice or not at all.
BOOST_AUTO_TEST_CASE(
    calls_back_to_back_or_after_the_workers_fall_asleep_each_run_every_index_once) {
  for (std::size_t threads : {2, 3}) {
    default_thread_pool pool(threads);
    std::size_t wrong = 0, not_met = 0;
    for (int call = 0; call < 4000; ++call) {
      if (!each_once(runs_per_index(pool, 2 + call % 7))) ++wrong;
      if (call % 100 == 99) {
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (!meet_at_once(pool).first) {  // every sleeper woken, or 5 s lost
          ++not_met;
          break;
        }
      }
    }
    BOOST_TEST(wrong == 0u, threads << " threads");
    BOOST_TEST(not_met == 0u, threads << " threads");
  }
}

BOOST_AUTO_TEST_CASE(the_pool_shuts_down_cleanly_idle_busy_or_right_after_a_call) {
  for (int round = 0; round < 50; ++round) {
    const std::size_t threads = 1 + round % 4;
    { default_thread_pool idle(threads); }
    {
      default_thread_pool used(threads);
      BOOST_TEST(each_once(runs_per_index(used, 1 + round)));
    }  // destroyed right after the call: workers may still be waking up for it
    {
      default_thread_pool failed(threads);
      BOOST_CHECK_THROW(failed.parallel_for(8, [](std::size_t) { throw std::runtime_error("x"); }),
                        std::runtime_error);
    }
  }
}

BOOST_AUTO_TEST_CASE(parallel_for_allocates_nothing_per_call) {
  default_thread_pool pool(3);
  std::vector<std::atomic<std::size_t>> seen(256);
  auto task = [&](std::size_t i) { seen[i].fetch_add(1, std::memory_order_relaxed); };
  pool.parallel_for(seen.size(), task);
  const ringkv_test::new_counter counter;
  for (int round = 0; round < 100; ++round) pool.parallel_for(seen.size(), task);
  BOOST_TEST(counter.calls() == 0u);
  for (const auto& s : seen) BOOST_TEST(s.load() == 101u);
}

void count_into_global(std::size_t i);
std::atomic<std::size_t> global_sum{0};
void count_into_global(std::size_t i) { global_sum.fetch_add(i); }

BOOST_AUTO_TEST_CASE(a_task_ref_calls_a_function_a_lambda_or_a_stateful_object_by_reference) {
  default_thread_pool pool(2);
  pool.parallel_for(10, count_into_global);
  BOOST_TEST(global_sum.load() == 45u);
  struct summing {
    std::atomic<std::size_t> sum{0};
    void operator()(std::size_t i) { sum.fetch_add(i + 1); }
  } object;
  pool.parallel_for(10, object);  // by reference: the object itself sums
  BOOST_TEST(object.sum.load() == 55u);
  const ringkv::task_ref ref = object;
  ref(100);
  BOOST_TEST(object.sum.load() == 156u);
}

// ---- split decode: the bits -----------------------------------------------------------------

// Each shape's window spans one segment (W 100) or several (3000, 5000) of a ring wrapped more
// than twice, with and without pinned sinks and learned sink logits. Pools of 1, 2, 3 and 8
// threads and a caller-supplied pool that runs the tasks backwards must give the bits of the
// step without a pool. Three consecutive steps move the window across segment boundaries.
BOOST_AUTO_TEST_CASE(
    split_decode_steps_on_wrapped_rings_are_bit_identical_for_1_2_3_and_8_threads) {
  std::vector<shape> shapes;
  for (std::size_t w : {100, 3000, 5000})
    for (std::size_t kv : {2, 8}) {
      shapes.push_back({8, kv, 64, w, 0, false});
      shapes.push_back({8, kv, 64, w, 4, true});
    }
  shapes.push_back({32, 1, 256, 3000, 0, false});  // a large group: chunks of query heads
  shapes.push_back({4, 4, 40, 2100, 1030, true});  // pinned sinks over a whole segment
  default_thread_pool one(1), two(2), three(3), eight(8);
  reverse_pool backwards(3);
  const windowed_attention plain;
  std::vector<windowed_attention> pooled;
  pooled.reserve(5);
  for (ringkv::thread_pool* pool :
       std::initializer_list<ringkv::thread_pool*>{&one, &two, &three, &eight, &backwards})
    pooled.emplace_back(ringkv::attention_options{.pool = pool});
  for (const shape& s : shapes) {
    ring r(s);
    r.append_until(2 * s.window + s.window / 3);
    for (int step = 0; step < 3; ++step) {
      const std::size_t p = r.step();
      BOOST_REQUIRE(r.keys(p).wrapped());
      const std::vector<float> expected = decoded(plain, r, p, s.q_heads * s.head_dim);
      for (std::size_t i = 0; i < pooled.size(); ++i)
        BOOST_TEST(same_bits(decoded(pooled[i], r, p, expected.size()), expected),
                   describe(s) << ", pool " << i << ", position " << p);
    }
  }
  BOOST_TEST(backwards.calls > 0u);
}

// The split kinds, seen through the caller's pool: by kv heads when they divide among the
// threads (8 kv heads, 2 threads: 2 tasks), by (kv head, segment) otherwise (2 kv heads, 3
// threads: 2 × segments), inline for one kv head in one segment; the same bits every time.
BOOST_AUTO_TEST_CASE(the_split_is_by_kv_heads_when_they_divide_else_by_kv_head_and_segment) {
  struct expectation {
    shape s;
    std::size_t position, threads, calls, tasks;
  };
  // W 3000 at position 7000: positions 4001 … 7000, segments 3 … 6 (four). W 1000 at 7167:
  // positions 6168 … 7167, all in segment 6.
  for (const expectation& e : {expectation{{8, 8, 32, 3000, 0, false}, 7000, 2, 1, 2},
                               expectation{{8, 2, 32, 3000, 0, false}, 7000, 3, 1, 2 * 4},
                               expectation{{8, 1, 32, 3000, 0, false}, 7000, 2, 1, 4},
                               expectation{{8, 1, 32, 1000, 0, false}, 7167, 4, 0, 0},
                               expectation{{8, 2, 32, 1000, 0, false}, 7167, 4, 1, 2}}) {
    ring r(e.s);
    const std::size_t p = r.at(e.position);
    BOOST_REQUIRE(p == e.position);
    reverse_pool pool(e.threads);
    const windowed_attention attention(ringkv::attention_options{.pool = &pool});
    const std::size_t width = e.s.q_heads * e.s.head_dim;
    const std::vector<float> out = decoded(attention, r, p, width);
    BOOST_TEST(pool.calls == e.calls, describe(e.s));
    BOOST_TEST(pool.tasks == e.tasks, describe(e.s));
    BOOST_TEST(same_bits(out, unsplit(r, p, width)), describe(e.s));
  }
}

BOOST_AUTO_TEST_CASE(split_decode_is_bit_identical_on_every_simd_target) {
  const shape s{8, 2, 48, 2500, 3, true};
  ring r(s);
  const std::size_t p = r.at(6001);
  default_thread_pool three(3);
  const windowed_attention plain, pooled(ringkv::attention_options{.pool = &three});
  ringkv_test::for_each_target([&](const char* target) {
    const std::vector<float> expected = decoded(plain, r, p, s.q_heads * s.head_dim);
    BOOST_TEST(same_bits(decoded(pooled, r, p, expected.size()), expected), target);
  });
}

BOOST_FIXTURE_TEST_CASE(the_gather_path_with_a_pool_gives_the_same_bits, two_kv_heads) {
  const std::size_t p = r.at(8001);
  default_thread_pool three(3);
  const windowed_attention pooled(ringkv::attention_options{.pool = &three});
  std::vector<float> gathered(width);
  ringkv::scope arena(1 << 20);
  pooled.decode_step_gathered(r.query(), r.keys(p), r.values(p), gathered, arena);
  BOOST_TEST(same_bits(gathered, unsplit(r, p, gathered.size())));
}

// ---- split decode: scratch, allocation, threads -------------------------------------------

BOOST_AUTO_TEST_CASE(warm_split_decode_steps_allocate_nothing_and_the_trace_says_so) {
  for (std::size_t threads : {2, 3}) {
    const shape s{8, 2, 64, 3000, 0, false};
    ring r(s);
    std::size_t p = r.at(7001);
    default_thread_pool pool(threads);
    trace::recorder rec(256);
    const windowed_attention attention(ringkv::attention_options{.sink = &rec, .pool = &pool});
    std::vector<float> out(s.q_heads * s.head_dim);
    attention.decode_step(r.query(), r.keys(p), r.values(p), out);
    // The first step grew the scratch: one traced allocation, so the recorder is wired in.
    BOOST_REQUIRE(ranges::distance(rec.of<trace::allocation>()) == 1);
    for (const trace::allocation& a : rec.of<trace::allocation>())
      BOOST_TEST(a.site == "split-decode-scratch");
    rec.clear();
    const ringkv_test::new_counter counter;
    for (int step = 0; step < 16; ++step) {  // the window crosses a segment boundary on the way
      p = r.step();
      attention.decode_step(r.query(), r.keys(p), r.values(p), out);
    }
    BOOST_TEST(counter.calls() == 0u, threads << " threads");
    BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
  }
}

BOOST_FIXTURE_TEST_CASE(kernels_decode_refuses_a_scratch_too_small_with_out_untouched,
                        two_kv_heads) {
  const std::size_t p = r.at(5001);
  default_thread_pool pool(3);
  const std::size_t need = kernels::split_scratch_floats(8, 32, 3000);
  BOOST_TEST(need == (3000 / 1024 + 3) * 8 * (32 + 2));
  std::vector<float> scratch(need - 1), out(width, 7.0f);
  BOOST_CHECK_EXCEPTION(
      kernels::decode(r.query(), r.keys(p), r.values(p), out, 0.0f, {}, pool, scratch),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("scratch has") != std::string::npos &&
               std::string(e.what()).find("split_scratch_floats") != std::string::npos;
      });
  for (float x : out) BOOST_TEST(x == 7.0f);
  scratch.resize(need);
  kernels::decode(r.query(), r.keys(p), r.values(p), out, 0.0f, {}, pool, scratch);
  BOOST_TEST(same_bits(out, unsplit(r, p, out.size())));
}

// A pool call costs about what a tiny step does: less work than min_split_work stays on the
// caller. 8 query heads × 32 dims × W: W 128 is exactly the minimum.
BOOST_AUTO_TEST_CASE(a_step_with_less_than_the_minimum_work_runs_on_the_caller) {
  BOOST_REQUIRE(8 * 32 * 128 == kernels::min_split_work);
  for (const auto& [window, calls] : {std::pair<std::size_t, std::size_t>{127, 0}, {128, 1}}) {
    const shape s{8, 2, 32, window, 0, false};
    ring r(s);
    const std::size_t p = r.at(3 * window + 5);
    BOOST_REQUIRE(r.keys(p).length() == window);
    reverse_pool pool(2);
    const windowed_attention attention(ringkv::attention_options{.pool = &pool});
    const std::vector<float> out = decoded(attention, r, p, 8 * 32);
    BOOST_TEST(pool.calls == calls, "W " << window);
    BOOST_TEST(same_bits(out, unsplit(r, p, out.size())), "W " << window);
  }
}

// split_scratch_floats covers a window with one gap (after pinned sinks); a hand-made window of
// four runs, each across a segment boundary, spans 8 segments where the bound allows 3: the
// step splits by kv heads instead and keeps the bits.
BOOST_AUTO_TEST_CASE(a_window_with_more_gaps_than_the_scratch_allows_splits_by_kv_heads) {
  constexpr std::size_t q_heads = 6, kv_heads = 3, dim = 16, per_run = 100, runs = 4;
  constexpr std::size_t rows = runs * per_run;
  std::vector<float> k(kv_heads * rows * dim), v(k.size()), q(q_heads * dim);
  std::uint32_t x = 7;
  for (auto* buf : {&k, &v, &q})
    for (float& f : *buf) f = float(int32_t(x = x * 1664525u + 1013904223u)) * 0x1.0p-31f;
  const auto window_of = [&](std::vector<float>& buf) {
    std::vector<ringkv::kv_run> parts;
    for (std::size_t i = 0; i < runs; ++i)  // positions 1000 … 1099 of every 4096
      parts.push_back(
          {ringkv::tensor_view(reinterpret_cast<std::byte*>(buf.data() + i * per_run * dim),
                               ringkv::dtype::f32, kv_heads, per_run, dim, rows * dim, dim),
           i * 4096 + 1000});
    return windowed_kv(parts);
  };
  const windowed_kv keys = window_of(k), values = window_of(v);
  BOOST_REQUIRE(keys.runs().size() == runs);
  BOOST_REQUIRE(q_heads * rows * dim >= kernels::min_split_work);
  std::vector<float> expected(q_heads * dim), out(expected.size());
  kernels::decode(q, keys, values, expected);
  std::vector<float> scratch(kernels::split_scratch_floats(q_heads, dim, rows));
  BOOST_REQUIRE(scratch.size() < 8 * q_heads * (dim + 2));
  reverse_pool pool(2);  // 3 kv heads on 2 threads: by segment, were there room
  kernels::decode(q, keys, values, out, 0.0f, {}, pool, scratch);
  BOOST_TEST(pool.calls == 1u);
  BOOST_TEST(pool.tasks == 2u);
  BOOST_TEST(same_bits(out, expected));
}

// Two threads step one pooled object at once: one of them may find the scratch taken and run
// on its own thread; both get the bits of a step without a pool.
BOOST_FIXTURE_TEST_CASE(one_pooled_object_serves_two_threads_at_once_with_the_same_bits,
                        two_kv_heads) {
  const std::size_t p = r.at(7001);
  const std::vector<float> expected = unsplit(r, p, width);
  default_thread_pool pool(3);
  const windowed_attention shared(ringkv::attention_options{.pool = &pool});
  std::atomic<std::size_t> mismatches{0};
  {
    std::vector<std::jthread> callers;
    for (int c = 0; c < 2; ++c)
      callers.emplace_back([&] {
        for (int step = 0; step < 20; ++step)
          if (!same_bits(decoded(shared, r, p, expected.size()), expected)) ++mismatches;
      });
  }
  BOOST_TEST(mismatches.load() == 0u);
}

BOOST_FIXTURE_TEST_CASE(a_copied_attention_keeps_the_pool_and_the_bits, two_kv_heads) {
  const std::size_t p = r.at(4001);
  reverse_pool pool(3);
  const windowed_attention original(ringkv::attention_options{.pool = &pool});
  const windowed_attention copy = original;
  const std::vector<float> out = decoded(copy, r, p, width);
  BOOST_TEST(pool.calls == 1u);
  BOOST_TEST(same_bits(out, unsplit(r, p, out.size())));
}

// ---- the stream ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(
    the_stream_with_a_pool_yields_the_same_bits_and_allocates_only_for_the_first_token) {
  constexpr std::size_t q_heads = 4, kv_heads = 2, dim = 32, window = 1100, tokens = 2600;
  std::vector<float> q(tokens * q_heads * dim), k(tokens * kv_heads * dim), v(k.size());
  std::uint32_t x = 99;
  for (auto* buf : {&q, &k, &v})
    for (float& f : *buf) f = float(int32_t(x = x * 1664525u + 1013904223u)) * 0x1.0p-31f;
  std::vector<ringkv::token_qkv> input;
  for (std::size_t i = 0; i < tokens; ++i)
    input.push_back({std::span<const float>(q).subspan(i * q_heads * dim, q_heads * dim),
                     std::span<const float>(k).subspan(i * kv_heads * dim, kv_heads * dim),
                     std::span<const float>(v).subspan(i * kv_heads * dim, kv_heads * dim)});
  auto make_store = [] {
    return ringkv::default_kv_cache_store(
        ringkv::kv_cache_config{
            .layers = 1, .kv_heads = kv_heads, .head_dim = dim, .capacity = window},
        ringkv::store_options{.sliding_window = true});
  };
  auto plain_store = make_store(), pooled_store = make_store();
  std::vector<float> expected;
  for (std::span<const float> row : ringkv::decode(plain_store, 0, input))
    expected.insert(expected.end(), row.begin(), row.end());
  default_thread_pool pool(3);  // 2 kv heads on 3 threads: split by segment past 1024 tokens
  trace::recorder rec(64);
  std::size_t i = 0, mismatches = 0, allocations_after_first = 0;
  std::uint64_t before = 0;
  for (std::span<const float> row :
       ringkv::decode(pooled_store, 0, input, ringkv::decode_options{.pool = &pool}, rec)) {
    if (i == 0) {  // the first token has been appended and attended
      before = ringkv_test::new_calls();
      rec.clear();
    }
    if (std::memcmp(row.data(), expected.data() + i * row.size(), row.size_bytes()) != 0)
      ++mismatches;
    ++i;
  }
  allocations_after_first = ringkv_test::new_calls() - before;
  BOOST_TEST(i == tokens);
  BOOST_TEST(mismatches == 0u);
  BOOST_TEST(allocations_after_first == 0u);
  BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
}
