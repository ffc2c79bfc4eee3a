// Prefill throughput: a 4096-token prompt into a fresh ring of capacity W (1024 or 4096), one
// layer, head_dim 128, 32 query heads over 8 kv heads, f32 or f16 cache, one thread.
//   prefill/<chunk>  windowed_attention::prefill in chunks of `chunk` tokens (512: a typical
//                    micro-batch; 4096: the whole prompt in one call, 4 W for W = 1024)
//   token_by_token   the same prompt as 4096 × (append + decode_step): the baseline, same bits
// Counter tokens_per_second. Only a release build's numbers mean anything.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <random>
#include <span>
#include <vector>

import ringkv;

namespace {
constexpr std::size_t prompt_tokens = 4096, head_dim = 128, q_heads = 32, kv_heads = 8;
constexpr std::size_t q_row = q_heads * head_dim, kv_row = kv_heads * head_dim;

struct prompt {
  std::vector<float> q, k, v;  // [tokens, q_row], [tokens, kv_row] × 2
  prompt() : q(prompt_tokens * q_row), k(prompt_tokens * kv_row), v(prompt_tokens * kv_row) {
    std::mt19937 rng(17);
    std::normal_distribution<float> normal;
    for (auto* buf : {&q, &k, &v})
      for (float& x : *buf) x = normal(rng);
  }
};

const prompt& the_prompt() {
  static const prompt p;
  return p;
}

ringkv::default_kv_cache_store fresh_ring(std::size_t window, ringkv::dtype type) {
  return ringkv::default_kv_cache_store({.layers = 1,
                                         .kv_heads = kv_heads,
                                         .head_dim = head_dim,
                                         .capacity = window,
                                         .key_type = type,
                                         .value_type = type},
                                        {.sliding_window = true});
}

ringkv::dtype type_of(benchmark::State& state) {
  return state.range(1) == 16 ? ringkv::dtype::f16 : ringkv::dtype::f32;
}

void prefill(benchmark::State& state) {
  const std::size_t window = std::size_t(state.range(0)), chunk = std::size_t(state.range(2));
  const prompt& p = the_prompt();
  const ringkv::windowed_attention attention;
  ringkv::scope arena(2 * chunk * kv_row * sizeof(float));
  std::vector<float> out(chunk * q_row);
  for (auto _ : state) {
    state.PauseTiming();
    auto store = fresh_ring(window, type_of(state));
    state.ResumeTiming();
    for (std::size_t t = 0; t < prompt_tokens; t += chunk) {
      arena.reset();
      attention.prefill(store, 0, std::span<const float>(p.q).subspan(t * q_row, chunk * q_row),
                        std::span<const float>(p.k).subspan(t * kv_row, chunk * kv_row),
                        std::span<const float>(p.v).subspan(t * kv_row, chunk * kv_row), out,
                        {.arena = &arena});
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["tokens_per_second"] =
      benchmark::Counter(double(prompt_tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void token_by_token(benchmark::State& state) {
  const std::size_t window = std::size_t(state.range(0));
  const prompt& p = the_prompt();
  const ringkv::windowed_attention attention;
  std::vector<float> out(q_row);
  for (auto _ : state) {
    state.PauseTiming();
    auto store = fresh_ring(window, type_of(state));
    state.ResumeTiming();
    for (std::size_t t = 0; t < prompt_tokens; ++t) {
      const std::size_t pos =
          store.append(0, std::span<const float>(p.k).subspan(t * kv_row, kv_row),
                       std::span<const float>(p.v).subspan(t * kv_row, kv_row));
      const std::size_t from = pos + 1 > window ? pos + 1 - window : 0;
      attention.decode_step(std::span<const float>(p.q).subspan(t * q_row, q_row),
                            store.key_window(0, from, pos + 1),
                            store.value_window(0, from, pos + 1), out);
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["tokens_per_second"] =
      benchmark::Counter(double(prompt_tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void grid(benchmark::internal::Benchmark* b, bool chunked) {
  b->ArgNames({"W", "bits", chunked ? "chunk" : "one"});
  for (const int window : {1024, 4096})
    for (const int bits : {32, 16})
      for (const int chunk : chunked ? std::vector<int>{512, 4096} : std::vector<int>{1})
        b->Args({window, bits, chunk});
  b->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
}

BENCHMARK(prefill)->Apply([](benchmark::internal::Benchmark* b) { grid(b, true); });
BENCHMARK(token_by_token)->Apply([](benchmark::internal::Benchmark* b) { grid(b, false); });
}  // namespace

BENCHMARK_MAIN();
