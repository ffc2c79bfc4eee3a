// Generator overhead: one decode step (append + window + attention) through ringkv::decode's
// stream against the same step written by hand, W = 4096, D = 128, 8 query heads over 2 or 8 kv
// heads, on a wrapped ring. Both run in this process, interleaved over repetitions; the program
// ends with the stream's overhead over the hand loop (median of the repetitions' CPU times).
// Only a release build's numbers mean anything.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>
#include <range/v3/view/cycle.hpp>

import ringkv;

namespace {
constexpr std::size_t head_dim = 128, window = 4096, q_heads = 8, pool_size = 64;

struct fixture {
  ringkv::default_kv_cache_store store;
  std::vector<float> data;  // [pool, q + k + v]
  std::vector<ringkv::token_qkv> tokens;

  explicit fixture(std::size_t kv_heads)
      : store({.layers = 1, .kv_heads = kv_heads, .head_dim = head_dim, .capacity = window},
              {.sliding_window = true}) {
    const std::size_t q = q_heads * head_dim, kv = kv_heads * head_dim;
    data.resize(pool_size * (q + 2 * kv));
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (float& x : data) x = normal(rng);
    const std::span<const float> all(data);
    for (std::size_t i = 0; i < pool_size; ++i) {
      auto row = all.subspan(i * (q + 2 * kv), q + 2 * kv);
      tokens.push_back({row.first(q), row.subspan(q, kv), row.subspan(q + kv, kv)});
    }
    for (std::size_t t = 0; t < window + window / 2; ++t)  // wrapped before measuring
      store.append(0, tokens[t % pool_size].k, tokens[t % pool_size].v);
  }
};

void hand_loop(benchmark::State& state) {
  fixture f(static_cast<std::size_t>(state.range(0)));
  const ringkv::windowed_attention attention;
  std::vector<float> out(q_heads * head_dim);
  std::size_t i = 0;
  for (auto _ : state) {
    const auto& t = f.tokens[i++ % pool_size];
    const std::size_t p = f.store.append(0, t.k, t.v);
    const std::size_t from = p + 1 - window;
    attention.decode_step(t.q, f.store.key_window(0, from, p + 1),
                          f.store.value_window(0, from, p + 1), out);
    benchmark::DoNotOptimize(out.data());
  }
}

void stream(benchmark::State& state) {
  fixture f(static_cast<std::size_t>(state.range(0)));
  auto rows = ringkv::decode(f.store, 0, ranges::views::cycle(f.tokens));
  auto it = rows.begin();
  for (auto _ : state) {
    ++it;
    benchmark::DoNotOptimize((*it).data());
  }
}

BENCHMARK(hand_loop)->Arg(2)->Arg(8)->Unit(benchmark::kMicrosecond)->Repetitions(7);
BENCHMARK(stream)->Arg(2)->Arg(8)->Unit(benchmark::kMicrosecond)->Repetitions(7);

// Keeps every repetition's CPU time per step, by case, to print the ratio at the end.
class ratio_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration)
        times_[r.run_name.function_name + "/" + r.run_name.args].push_back(r.GetAdjustedCPUTime());
  }
  double median(const std::string& key) {
    auto v = times_[key];
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    return v[v.size() / 2];
  }

 private:
  std::map<std::string, std::vector<double>> times_;
};
}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  ratio_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  for (const char* kv : {"2", "8"}) {
    const double hand = reporter.median(std::string("hand_loop/") + kv);
    const double gen = reporter.median(std::string("stream/") + kv);
    if (hand > 0 && gen > 0)
      std::printf("kv_heads %s: hand loop %.1f us, stream %.1f us, stream overhead %+.2f %%\n", kv,
                  hand, gen, 100.0 * (gen / hand - 1.0));
  }
  benchmark::Shutdown();
  return 0;
}
