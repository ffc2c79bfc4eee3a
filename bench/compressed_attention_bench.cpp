// One decode step, one thread, 8 query heads over 8 or 2 kv heads, head_dim 64/128, windows of
// 256, 4096 and 32768 positions over a wrapped ring (the attention benchmark's shapes). Variants:
//   f32       windowed_attention::decode_step over default_kv_cache_store's zero-copy window
//   tq4/3/2   compressed_kv_attention over a turboquant_kv_cache_store (key_bits = value_bits)
//   tq4qjl    the same, keys 3 codebook bits + 1 QJL bit, values 4 bits
//   int8      compressed_kv_attention over an int8_kv_cache_store
// Counters: bytes_per_token = the store's physical bytes / capacity (K and V, all kv heads, one
// layer, rotation and projection state included); bytes_per_second = the window's bytes per step.
// Only a release build's numbers mean anything.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

import ringkv;

namespace {

constexpr std::size_t q_heads = 8;
enum variant { f32, tq4, tq3, tq2, tq4qjl, int8, variants };
const char* const names[] = {"f32", "tq4", "tq3", "tq2", "tq4qjl", "int8"};

std::unique_ptr<ringkv::kv_cache_store> make(variant v, const ringkv::kv_cache_config& c) {
  const ringkv::store_options ring{.sliding_window = true};
  auto tq = [&](unsigned k, unsigned val, bool qjl) {
    return std::make_unique<ringkv::turboquant_kv_cache_store>(
        c, ringkv::turboquant_options{.key_bits = k, .value_bits = val, .qjl = qjl}, ring);
  };
  switch (v) {
    case f32:
      return std::make_unique<ringkv::default_kv_cache_store>(c, ring);
    case tq4:
      return tq(4, 4, false);
    case tq3:
      return tq(3, 3, false);
    case tq2:
      return tq(2, 2, false);
    case tq4qjl:
      return tq(4, 4, true);
    default:
      return std::make_unique<ringkv::int8_kv_cache_store>(c, ring);
  }
}

/// The store being measured, filled with 1.5 W random tokens so its window wraps; kept between
/// the benchmark's calls of the same case (building a 32768-position store takes a while).
ringkv::kv_cache_store& store_for(variant v, std::size_t d, std::size_t w, std::size_t kv) {
  static std::unique_ptr<ringkv::kv_cache_store> store;
  static std::string built;
  const std::string key = std::to_string(v) + "/" + std::to_string(d) + "/" + std::to_string(w) +
                          "/" + std::to_string(kv);
  if (built != key) {
    store.reset();
    store = make(v, {.layers = 1, .kv_heads = kv, .head_dim = d, .capacity = w});
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    std::vector<float> k(kv * d), val(kv * d);
    for (std::size_t t = 0; t < w + w / 2; ++t) {
      for (float& x : k) x = normal(rng);
      for (float& x : val) x = normal(rng);
      store->append(0, k, val);
    }
    built = key;
  }
  return *store;
}

void decode_step(benchmark::State& state) {
  const auto v = variant(state.range(0));
  const std::size_t d = state.range(1), w = state.range(2), kv = state.range(3);
  ringkv::kv_cache_store& s = store_for(v, d, w, kv);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> q(q_heads * d), out(q.size());
  for (float& x : q) x = normal(rng);
  const std::size_t n = s.length(0), from = n - w;
  const auto report = s.memory();
  if (v == f32) {
    const auto& st = static_cast<const ringkv::default_kv_cache_store&>(s);
    const ringkv::windowed_kv keys = st.key_window(0, from, n),
                              values = st.value_window(0, from, n);
    const ringkv::windowed_attention attention;
    for (auto _ : state) {
      attention.decode_step(q, keys, values, out);
      benchmark::DoNotOptimize(out.data());
    }
  } else {
    const auto& st = static_cast<const ringkv::compressed_kv_cache_store&>(s);
    const ringkv::compressed_window keys = st.compressed_key_window(0, from, n),
                                    values = st.compressed_value_window(0, from, n);
    const ringkv::compressed_kv_attention attention;
    for (auto _ : state) {
      attention.decode_step(q, keys, values, out);
      benchmark::DoNotOptimize(out.data());
    }
  }
  const double per_token = double(report.physical_bytes) / double(w);
  state.counters["bytes_per_token"] = per_token;
  state.counters["bytes_per_second"] = benchmark::Counter(
      per_token * double(w) * double(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(names[v]);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (long d : {64, 128})
    for (long w : {256, 4096, 32768})
      for (long kv : {8, 2})
        for (long v = 0; v < variants; ++v) b->Args({v, d, w, kv});
  b->ArgNames({"variant", "dim", "window", "kv_heads"});
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(decode_step)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
