// Prefill throughput, one layer, head_dim 128, 32 query heads over 8 kv heads, a ring of capacity
// W (1024 or 4096), f32, f16 or bf16 cache, on 1 or 2 threads:
//   prefill   windowed_attention::prefill over `scope`: the whole 4096-token prompt into a fresh
//             ring in chunks of `chunk` (512: a typical micro-batch; 4096: one call), or the
//             steady state: one chunk of `chunk` (512) queries at positions W … W + 511 after W
//             prompt tokens, each seeing a full window
//   token_by_token  the same queries as (append + decode_step) each: one decode a query, same
//             bits
//   prefill_own_store  prefill over tests/support/own_rows_store.hpp, a store written outside the
//             library that exposes its rows (stored_window): the tiled kernel, as for the default
//             store (f32, chunks of 512; compare with prefill of the same arguments, interleaved)
// Counters: tokens_per_second (wall time), and fraction_of_peak: the useful multiply-adds
// (2 · 32 · 128 · keys seen, per query) over the CPU time the run took on all its threads times
// the FMA peak of a core, measured in this process just before in CPU time (eight independent FMA
// chains, no loads: ringkv_bench::fma_chains) — CPU time, as the machine is shared: wall time
// counts other processes' turns. Only a release build's numbers mean anything. Re-measure:
// build/release/bench/prefill_bench --benchmark_repetitions=5 (and medians over processes).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <time.h>
#include <type_traits>
#include <utility>
#include <vector>

#include "random_prompt.hpp"
#include "stream_read.h"

import ringkv;

#include "own_rows_store.hpp"

namespace {
constexpr std::size_t prompt_tokens = 4096, head_dim = 128, q_heads = 32, kv_heads = 8;
constexpr std::size_t q_row = q_heads * head_dim, kv_row = kv_heads * head_dim;
constexpr std::size_t steady_queries = 512;

struct prompt : random_prompt {
  static constexpr std::size_t tokens = prompt_tokens + steady_queries;  // W + 512 at most
  // Inside the class, unqualified q_row / kv_row name the base's members, which are not yet
  // initialised here: the widths are this file's namespace constants.
  prompt() : random_prompt(tokens, ::q_row, ::kv_row, 17) {}
};

const prompt& the_prompt() {
  static const prompt p;
  return p;
}

/// CPU seconds `clock` (CLOCK_THREAD_CPUTIME_ID or CLOCK_PROCESS_CPUTIME_ID) has counted.
double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

/// Multiply-adds a CPU second of this core does at best: the fastest of a few runs of the FMA
/// chains, measured now in this thread's CPU time (the machine's speed drifts between minutes,
/// and it is shared: wall time would count other processes' turns).
double fma_peak_per_second() {
  constexpr std::size_t repeats = std::size_t(1) << 22;
  double best = 0.0;
  for (int run = 0; run < 5; ++run) {
    const double start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    benchmark::DoNotOptimize(ringkv_bench::fma_chains(repeats));
    const double took = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - start;
    best = std::max(best, 8.0 * double(ringkv_bench::fma_lanes()) * double(repeats) / took);
  }
  return best;
}

ringkv::dtype type_of(std::int64_t code) {
  return code == 2 ? ringkv::dtype::bf16 : code == 1 ? ringkv::dtype::f16 : ringkv::dtype::f32;
}

ringkv::kv_cache_config config_of(std::size_t window, ringkv::dtype type) {
  return {.layers = 1,
          .kv_heads = kv_heads,
          .head_dim = head_dim,
          .capacity = window,
          .key_type = type,
          .value_type = type};
}

/// A fresh ring of `window` positions: ringkv's default store or the test's own.
template <class Store>
Store fresh_ring(std::size_t window, ringkv::dtype type) {
  if constexpr (std::is_same_v<Store, store_test::own_rows_store>)
    return Store(config_of(window, type), true);
  else
    return Store(config_of(window, type), {.sliding_window = true});
}

/// What one benchmark runs: its queries [first, first + tokens) after `first` prompt tokens.
struct run_shape {
  std::size_t window, first, tokens;
  ringkv::dtype type;
  std::size_t threads;
};

enum scope_kind : std::int64_t { whole_prompt = 0, steady = 1 };

run_shape shape_of(const benchmark::State& state) {
  const std::size_t window = std::size_t(state.range(0));
  const bool is_steady = state.range(3) == steady;
  return {window, is_steady ? window : 0, is_steady ? steady_queries : prompt_tokens,
          type_of(state.range(1)), std::size_t(state.range(4))};
}

/// A ring holding the prompt's first `s.first` tokens (prefilled in chunks of 512).
template <class Store = ringkv::default_kv_cache_store>
Store ring_before(const run_shape& s, const ringkv::windowed_attention& attention,
                  ringkv::scope& arena) {
  auto store = fresh_ring<Store>(s.window, s.type);
  const prompt& p = the_prompt();
  std::vector<float> out(steady_queries * q_row);
  for (std::size_t t = 0; t < s.first; t += steady_queries) {
    const std::size_t n = std::min(steady_queries, s.first - t);
    arena.reset();
    attention.prefill(store, 0, p.qs(t, n), p.ks(t, n), p.vs(t, n),
                      std::span<float>(out).first(n * q_row), {.arena = &arena});
  }
  return store;
}

/// The counters of a run of `s`'s queries that took `cpu` CPU seconds of every thread in all:
/// tokens a (wall) second, and the useful multiply-adds over what the CPU time could have done at
/// the peak (a thread that spins waiting counts as not computing).
void count(benchmark::State& state, const run_shape& s, double peak, double cpu) {
  double keys = 0.0;
  for (std::size_t p = s.first; p < s.first + s.tokens; ++p)
    keys += double(std::min(p + 1, s.window));
  state.counters["tokens_per_second"] =
      benchmark::Counter(double(s.tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fraction_of_peak"] =
      2.0 * q_heads * head_dim * keys * double(state.iterations()) / (peak * cpu);
  state.counters["peak_gfma_per_cpu_second"] = peak * 1e-9;
}

template <class Store>
void prefill_into(benchmark::State& state) {
  const run_shape s = shape_of(state);
  const std::size_t chunk = std::size_t(state.range(2));
  const prompt& p = the_prompt();
  std::optional<ringkv::default_thread_pool> pool;
  if (s.threads > 1) pool.emplace(s.threads);
  const ringkv::windowed_attention attention(
      ringkv::attention_options{nullptr, pool ? &*pool : nullptr});
  ringkv::scope arena(2 * chunk * kv_row * sizeof(float) + (1 << 16));
  std::vector<float> out(chunk * q_row);
  const double peak = fma_peak_per_second();
  double cpu = 0.0;
  for (auto _ : state) {
    state.PauseTiming();
    auto store = ring_before<Store>(s, attention, arena);
    const double start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    state.ResumeTiming();
    for (std::size_t t = s.first; t < s.first + s.tokens; t += chunk) {
      const std::size_t n = std::min(chunk, s.first + s.tokens - t);
      arena.reset();
      attention.prefill(store, 0, p.qs(t, n), p.ks(t, n), p.vs(t, n),
                        std::span<float>(out).first(n * q_row), {.arena = &arena});
      benchmark::DoNotOptimize(out.data());
    }
    state.PauseTiming();
    cpu += cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - start;
    state.ResumeTiming();
  }
  count(state, s, peak, cpu);
}

void prefill(benchmark::State& state) { prefill_into<ringkv::default_kv_cache_store>(state); }
void prefill_own_store(benchmark::State& state) { prefill_into<store_test::own_rows_store>(state); }

void token_by_token(benchmark::State& state) {
  const run_shape s = shape_of(state);
  const prompt& p = the_prompt();
  const ringkv::windowed_attention attention;
  ringkv::scope arena(1 << 16);
  std::vector<float> out(q_row);
  const double peak = fma_peak_per_second();
  double cpu = 0.0;
  for (auto _ : state) {
    state.PauseTiming();
    auto store = ring_before(s, attention, arena);
    const double start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    state.ResumeTiming();
    for (std::size_t t = s.first; t < s.first + s.tokens; ++t) {
      const std::size_t pos = store.append(0, p.ks(t, 1), p.vs(t, 1));
      const std::size_t from = pos + 1 > s.window ? pos + 1 - s.window : 0;
      attention.decode_step(p.qs(t, 1), store.key_window(0, from, pos + 1),
                            store.value_window(0, from, pos + 1), out);
      benchmark::DoNotOptimize(out.data());
    }
    state.PauseTiming();
    cpu += cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - start;
    state.ResumeTiming();
  }
  count(state, s, peak, cpu);
}

void grid(benchmark::internal::Benchmark* b, bool chunked) {
  b->ArgNames({"W", "type", "chunk", "scope", "threads"});
  for (const int window : {1024, 4096})
    for (const int type : {0, 1, 2})  // f32, f16, bf16
      for (const int threads : chunked ? std::vector<int>{1, 2} : std::vector<int>{1}) {
        if (chunked) {
          b->Args({window, type, 512, whole_prompt, threads});
          b->Args({window, type, 4096, whole_prompt, threads});
        }
        b->Args({window, type, chunked ? 512 : 1, steady, threads});
      }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
}

BENCHMARK(prefill)->Apply([](benchmark::internal::Benchmark* b) { grid(b, true); });
BENCHMARK(token_by_token)->Apply([](benchmark::internal::Benchmark* b) { grid(b, false); });
BENCHMARK(prefill_own_store)->Apply([](benchmark::internal::Benchmark* b) {
  b->ArgNames({"W", "type", "chunk", "scope", "threads"});
  for (const int window : {1024, 4096})
    for (const int threads : {1, 2})
      for (const int scope : {whole_prompt, steady}) b->Args({window, 0, 512, scope, threads});
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
});
}  // namespace

BENCHMARK_MAIN();
