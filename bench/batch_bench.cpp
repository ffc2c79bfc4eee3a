// Batched attention (attend_batch) against the same entries' steps one call at a time: B = 1, 4,
// 16, 64 sequences, each a ring of W = 256 or 4096 positions (wrapped), D 128, 8 query heads
// over 8 or 2 kv heads, f32 or f16 rows, one decode step an entry. Variants, interleaved in one
// process:
//   singles    B layer_attention::step calls in a loop on this thread (each step unsplit)
//   batch      one attend_batch of the B entries on this thread
//   batch_2    one attend_batch over a default_thread_pool(2)
//   single_2   B step calls each split over the pool of 2 (the single-sequence split, beside)
//   floor      each entry's K and V read once with its multiply-adds (stream_read.h), on this
//   floor_2    thread / spread over the pool of 2: what a second thread can give those bytes
//   peak       B tasks of FMA chains alone (~10 µs each, a W 256 entry's time), on this thread /
//   peak_2     over the pool of 2: what a second thread gives arithmetic through this pool
// Each iteration appends one token to every sequence's ring (its window keeps its size). Ratios
// to read: batch ÷ singles (per-batch overhead), batch ÷ batch_2 (what a second thread gives a
// batch), singles ÷ single_2 (what it gives one sequence's step).
// The pool's bookkeeping (pool/...): B = 16 sequences whose one dense layer holds 4096-4351
// positions, one attend_batch a step on this thread, over default dense stores (`stores`) or a
// kv_cache_pool's dense group in blocks of 256 (`pool`: a block mapped every 256 steps, the lock,
// the write hook); every 256 steps both truncate back to 4096, untimed. The
// `_append` variants only append the step's rows (no attention): the bookkeeping is
// (pool_append - stores_append) ÷ stores, the per-step cost the pool adds over plain stores.
// Only a release build's numbers mean anything. Re-measure:
//   build/release/bench/batch_bench --benchmark_enable_random_interleaving=true
//   --benchmark_repetitions=5 [--benchmark_filter=^pool/]
#include <benchmark/benchmark.h>

#include "stream_read.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

import ringkv;

namespace {
constexpr std::size_t head_dim = 128, q_heads = 8;

/// B sequences of one shape, their layers, and one token's rows for each.
struct batch {
  std::vector<std::unique_ptr<ringkv::default_kv_cache_store>> stores;
  std::vector<std::unique_ptr<ringkv::layer_attention>> alone, pooled;
  std::vector<float> q, k, v, out;
  std::vector<ringkv::batch_entry> entries;
};

ringkv::thread_pool& pool_of_two() {
  static ringkv::default_thread_pool pool(2);
  return pool;
}

/// The batch of a shape, built once and kept (the largest, 64 × W 4096 f32, takes 2 GiB).
batch& batch_for(std::size_t b, std::size_t w, std::size_t kv, ringkv::dtype type) {
  static std::map<std::tuple<std::size_t, std::size_t, std::size_t, ringkv::dtype>,
                  std::unique_ptr<batch>>
      made;
  auto& slot = made[{b, w, kv, type}];
  if (slot) return *slot;
  slot = std::make_unique<batch>();
  batch& x = *slot;
  const std::size_t qw = q_heads * head_dim, kw = kv * head_dim;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const auto fill = [&](std::vector<float>& rows, std::size_t n) {
    rows.resize(n);
    for (float& e : rows) e = normal(rng);
  };
  fill(x.q, b * qw);
  fill(x.k, b * kw);
  fill(x.v, b * kw);
  x.out.resize(b * qw);
  std::vector<float> ks, vs;
  fill(ks, kw);
  fill(vs, kw);
  for (std::size_t i = 0; i < b; ++i) {
    x.stores.push_back(std::make_unique<ringkv::default_kv_cache_store>(
        ringkv::kv_cache_config{.layers = 1,
                                .kv_heads = kv,
                                .head_dim = head_dim,
                                .capacity = w,
                                .key_type = type,
                                .value_type = type},
        ringkv::store_options{.sliding_window = true}));
    for (std::size_t t = 0; t < w + w / 2 + i; ++t) x.stores.back()->append(0, ks, vs);
    x.alone.push_back(std::make_unique<ringkv::layer_attention>(*x.stores.back(), 0));
    x.pooled.push_back(std::make_unique<ringkv::layer_attention>(
        *x.stores.back(), 0, ringkv::layer_options{.pool = &pool_of_two()}));
    x.entries.push_back({x.alone.back().get(), std::span(x.q).subspan(i * qw, qw),
                         std::span(x.k).subspan(i * kw, kw), std::span(x.v).subspan(i * kw, kw),
                         std::span(x.out).subspan(i * qw, qw)});
  }
  return x;
}

enum variant : std::uint8_t { singles, whole, whole_2, single_2, floor_1, floor_2, peak_1, peak_2 };

/// The floor of entry i's step: its window's K and V read once with the multiply-adds its query
/// heads take (and an exp a score for f32 rows), stream_read.h's roofs.
float entry_floor(const batch& x, std::size_t i, std::size_t kv, ringkv::dtype type) {
  const ringkv::default_kv_cache_store& s = *x.stores[i];
  const std::size_t n = s.key_storage(0).bytes() / ringkv::size_of(type), group = q_heads / kv;
  if (type == ringkv::dtype::f16)
    return ringkv_bench::stream_fma_pair_f16(s.key_storage(0).as<std::uint16_t>().data(),
                                             s.value_storage(0).as<std::uint16_t>().data(), n,
                                             group);
  return ringkv_bench::stream_fma_exp_pair(s.key_storage(0).as<float>().data(),
                                           s.value_storage(0).as<float>().data(), n, group,
                                           head_dim);
}

constexpr std::size_t pool_sequences = 16, dense_length = 4096, regrow = 256;

/// B dense sequences of one shape, in default stores or in a pool, with their layers and rows.
struct dense_batch {
  std::unique_ptr<ringkv::kv_cache_pool> pool;
  std::vector<std::unique_ptr<ringkv::kv_cache_store>> own;
  std::vector<ringkv::kv_cache_store*> stores;
  std::vector<std::unique_ptr<ringkv::layer_attention>> layers;
  std::vector<float> q, k, v, out;
  std::vector<ringkv::batch_entry> entries;
};

dense_batch& dense_batch_for(bool pooled, std::size_t kv, ringkv::dtype type) {
  static std::map<std::tuple<bool, std::size_t, ringkv::dtype>, std::unique_ptr<dense_batch>> made;
  auto& slot = made[{pooled, kv, type}];
  if (slot) return *slot;
  slot = std::make_unique<dense_batch>();
  dense_batch& x = *slot;
  const ringkv::kv_cache_config c{.layers = 1,
                                  .kv_heads = kv,
                                  .head_dim = head_dim,
                                  .capacity = 2 * dense_length,
                                  .key_type = type,
                                  .value_type = type};
  if (pooled)
    x.pool = std::make_unique<ringkv::kv_cache_pool>(std::size_t(3) << 30,
                                                     std::vector<ringkv::kv_pool_group>{{c, {}}});
  const std::size_t qw = q_heads * head_dim, kw = kv * head_dim;
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  for (auto* rows : {&x.q, &x.k, &x.v}) {
    rows->resize(pool_sequences * (rows == &x.q ? qw : kw));
    for (float& e : *rows) e = normal(rng);
  }
  x.out.resize(pool_sequences * qw);
  for (std::size_t i = 0; i < pool_sequences; ++i) {
    if (pooled) {
      x.stores.push_back(&x.pool->store(x.pool->add()));
    } else {
      x.own.push_back(std::make_unique<ringkv::default_kv_cache_store>(c));
      x.stores.push_back(x.own.back().get());
    }
    for (std::size_t t = 0; t < dense_length; ++t)
      x.stores.back()->append(0, std::span(x.k).first(kw), std::span(x.v).first(kw));
    x.layers.push_back(std::make_unique<ringkv::layer_attention>(*x.stores.back(), 0));
    x.entries.push_back({x.layers.back().get(), std::span(x.q).subspan(i * qw, qw),
                         std::span(x.k).subspan(i * kw, kw), std::span(x.v).subspan(i * kw, kw),
                         std::span(x.out).subspan(i * qw, qw)});
  }
  return x;
}

void run_dense(benchmark::State& state, bool pooled, bool attend, std::size_t kv,
               ringkv::dtype type) {
  dense_batch& x = dense_batch_for(pooled, kv, type);
  for (auto _ : state) {
    if (attend) {
      ringkv::attend_batch(x.entries);
    } else {
      for (const ringkv::batch_entry& e : x.entries) e.layer->store().append(0, e.keys, e.values);
    }
    if (x.stores[0]->length(0) == dense_length + regrow) {
      state.PauseTiming();  // once every `regrow` steps: a decode step never truncates
      for (ringkv::kv_cache_store* s : x.stores) s->truncate(0, dense_length);
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(x.out.data());
  }
}

void run(benchmark::State& state, variant which, std::size_t b, std::size_t w, std::size_t kv,
         ringkv::dtype type) {
  batch& x = batch_for(b, w, kv, type);
  for (auto _ : state) {
    switch (which) {
      case singles:
      case single_2:
        for (std::size_t i = 0; i < b; ++i) {
          const ringkv::batch_entry& e = x.entries[i];
          (which == singles ? x.alone : x.pooled)[i]->step({e.queries, e.keys, e.values}, e.out);
        }
        break;
      case whole:
        ringkv::attend_batch(x.entries);
        break;
      case whole_2:
        ringkv::attend_batch(x.entries, &pool_of_two());
        break;
      case floor_1:
        for (std::size_t i = 0; i < b; ++i) benchmark::DoNotOptimize(entry_floor(x, i, kv, type));
        break;
      case floor_2:
        pool_of_two().parallel_for(
            b, [&](std::size_t i) { benchmark::DoNotOptimize(entry_floor(x, i, kv, type)); });
        break;
      case peak_1:
        for (std::size_t i = 0; i < b; ++i)
          benchmark::DoNotOptimize(ringkv_bench::fma_chains(8000));
        break;
      case peak_2:
        pool_of_two().parallel_for(
            b, [&](std::size_t i) { benchmark::DoNotOptimize(ringkv_bench::fma_chains(8000)); });
        break;
    }
    benchmark::DoNotOptimize(x.out.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  constexpr const char* names[] = {"singles", "batch",   "batch_2", "single_2",
                                   "floor",   "floor_2", "peak",    "peak_2"};
  for (const ringkv::dtype type : {ringkv::dtype::f32, ringkv::dtype::f16})
    for (const std::size_t w : {256, 4096})
      for (const std::size_t kv : {8, 2})
        for (const std::size_t b : {1, 4, 16, 64})
          for (const variant which :
               {singles, whole, whole_2, single_2, floor_1, floor_2, peak_1, peak_2}) {
            const std::string name = "batch/" + std::string(ringkv::name_of(type)) +
                                     "/W:" + std::to_string(w) + "/kv:" + std::to_string(kv) +
                                     "/B:" + std::to_string(b) + "/" + names[which];
            benchmark::RegisterBenchmark(
                name.c_str(), [=](benchmark::State& s) { run(s, which, b, w, kv, type); })
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
          }
  for (const ringkv::dtype type : {ringkv::dtype::f32, ringkv::dtype::f16})
    for (const std::size_t kv : {8, 2})
      for (const bool attend : {true, false})
        for (const bool pooled : {false, true}) {
          const std::string name = "pool/" + std::string(ringkv::name_of(type)) +
                                   "/kv:" + std::to_string(kv) + "/B:16/" +
                                   (pooled ? "pool" : "stores") + (attend ? "" : "_append");
          benchmark::RegisterBenchmark(
              name.c_str(), [=](benchmark::State& s) { run_dense(s, pooled, attend, kv, type); })
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
