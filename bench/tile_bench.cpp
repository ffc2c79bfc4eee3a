// The pieces of one decode block in isolation, with its K/V rows hot in L1: the score tiles, the
// softmax step (max, vector Exp, sums), the V tiles, and the three in sequence as a step runs
// them, for head_dim 64/128 and 1, 4 or 8 query heads per kv head. `fma_peak` (eight independent
// FMA chains, no loads: this core's arithmetic) is the baseline, measured in the same run.
// An iteration is 64 repeats of the part (Time / 64 = one block). Counter multiply_adds_per_second:
// the part's multiply-adds (16 positions × heads × head_dim for the scores, as many for the V
// rows) per second. What it answers: how fast the kernel's own
// arithmetic runs when memory is out of the picture — a whole step's time minus this is what
// its loads from L2/L3/DRAM cost. Compiled once per Highway target (skeleton.cc pattern), the
// kernel headers of src/ included as simd.cpp includes them.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "simd.h"

#ifndef RINGKV_TILE_BENCH_WORK_
#define RINGKV_TILE_BENCH_WORK_  // once, though foreach_target.h includes this file per target
namespace ringkv_bench {
/// Floats of RunPart's scratch: q [heads, dim], scores [heads, 16], rescale, max and sum [heads]
/// each padded to 16 floats (so acc stays 64-byte aligned), acc [heads, dim].
constexpr std::size_t padded_heads(std::size_t heads) {
  return (heads + ringkv::simd::block_positions - 1) / ringkv::simd::block_positions *
         ringkv::simd::block_positions;
}
constexpr std::size_t work_floats(std::size_t dim, std::size_t heads) {
  return 2 * heads * dim + heads * ringkv::simd::block_positions + 3 * padded_heads(heads);
}
}  // namespace ringkv_bench
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tile_bench.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv_bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace rs = ringkv::simd::HWY_NAMESPACE;

/// Which piece of a block RunPart repeats.
enum part : int { block = 0, scores = 1, softmax = 2, values = 3 };

/// Repeats one part `repeats` times over one block of 16 rows (`k`, `v`: [16, dim]) for `heads`
/// query heads; `work` is 64-byte aligned scratch of work_floats(dim, heads) floats. Returns a
/// value of the result so the work cannot be dropped.
float RunPartImpl(int which, std::size_t dim, std::size_t heads, std::size_t repeats,
                  const float* k, const float* v, float* work) {
  const rs::DF d;
  constexpr std::size_t B = ringkv::simd::block_positions;
  rs::chunk c;
  c.count = heads;
  c.padded_dim = dim;  // a multiple of 16 here
  float* q = work;                          // [heads, dim]
  c.scores = q + heads * dim;               // [heads, B]
  c.rescale = c.scores + heads * B;         // [heads]
  float* max = c.rescale + padded_heads(heads);  // [heads]
  float* sum = max + padded_heads(heads);        // [heads]
  float* acc = sum + padded_heads(heads);        // [heads, dim]
  for (std::size_t i = 0; i < heads * dim; ++i) q[i] = 1e-3f * float(i % 7);
  for (std::size_t h = 0; h < heads; ++h) {
    max[h] = rs::minus_infinity;
    sum[h] = 0.0f;
  }
  for (std::size_t i = 0; i < heads * dim; ++i) acc[i] = 0.0f;
  c.q = q;
  const ringkv::simd::state s{max, sum, acc};
  rs::block_rows b;
  b.n = B;
  for (std::size_t j = 0; j < B; ++j) {
    b.k[j] = reinterpret_cast<const std::byte*>(k + j * dim);
    b.v[j] = reinterpret_cast<const std::byte*>(v + j * dim);
  }
  rs::line_feed idle;
  rs::ScoreBlock<rs::row_loader<float>>(d, dim, c, b, idle);
  rs::ExpBlock(c, s);
  for (std::size_t r = 0; r < repeats; ++r) {
    if (which == block || which == scores) rs::ScoreBlock<rs::row_loader<float>>(d, dim, c, b, idle);
    if (which == block || which == softmax) rs::ExpBlock(c, s);
    if (which == block || which == values)
      rs::AccumulateBlock<rs::row_loader<float>>(d, dim, c, b, s, idle);
  }
  return acc[0] + sum[0] + c.scores[0];
}

/// Eight independent FMA chains, `repeats` steps: one multiply-add per lane each.
float FmaPeakImpl(std::size_t repeats) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.999999f), e = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (std::size_t r = 0; r < repeats; ++r) {
    a0 = hn::MulAdd(a0, m, e);
    a1 = hn::MulAdd(a1, m, e);
    a2 = hn::MulAdd(a2, m, e);
    a3 = hn::MulAdd(a3, m, e);
    a4 = hn::MulAdd(a4, m, e);
    a5 = hn::MulAdd(a5, m, e);
    a6 = hn::MulAdd(a6, m, e);
    a7 = hn::MulAdd(a7, m, e);
  }
  const auto sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                           hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

std::size_t FmaLanesImpl() { return hn::Lanes(hn::ScalableTag<float>()); }

}  // namespace ringkv_bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv_bench {
namespace {

HWY_EXPORT(RunPartImpl);
HWY_EXPORT(FmaPeakImpl);
HWY_EXPORT(FmaLanesImpl);

constexpr std::size_t repeats_per_iteration = 64;
constexpr std::size_t rows = ringkv::simd::block_positions;

struct aligned_free {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using floats = std::unique_ptr<float[], aligned_free>;

floats aligned_floats(std::size_t n) {
  return floats(new (std::align_val_t{64}) float[n]);
}

/// Args: part (0 the whole block, 1 score tiles, 2 softmax step, 3 V tiles), head_dim, query
/// heads per kv head.
void tile(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const std::size_t dim = state.range(1), heads = state.range(2);
  floats k = aligned_floats(rows * dim), v = aligned_floats(rows * dim);
  for (std::size_t i = 0; i < rows * dim; ++i) {
    k[i] = float((i * 37) % 101) / 101.0f - 0.5f;
    v[i] = float((i * 53) % 103) / 103.0f - 0.5f;
  }
  floats work = aligned_floats(work_floats(dim, heads));
  for (auto _ : state)
    benchmark::DoNotOptimize(HWY_DYNAMIC_DISPATCH(RunPartImpl)(
        which, dim, heads, repeats_per_iteration, k.get(), v.get(), work.get()));
  const double per_phase = double(rows * heads * dim);
  const double phases = which == 0 ? 2.0 : which == 2 ? 0.0 : 1.0;
  state.counters["multiply_adds_per_second"] = benchmark::Counter(
      phases * per_phase * double(repeats_per_iteration),
      benchmark::Counter::kIsIterationInvariantRate);
}

void fma_peak(benchmark::State& state) {
  constexpr std::size_t steps = 1 << 16;
  for (auto _ : state) benchmark::DoNotOptimize(HWY_DYNAMIC_DISPATCH(FmaPeakImpl)(steps));
  const double lanes = double(HWY_DYNAMIC_DISPATCH(FmaLanesImpl)());
  state.counters["multiply_adds_per_second"] = benchmark::Counter(
      8.0 * lanes * steps, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(fma_peak);
BENCHMARK(tile)
    ->ArgNames({"part", "D", "heads"})
    ->ArgsProduct({{0, 1, 2, 3}, {64, 128}, {1, 4, 8}});

}  // namespace
}  // namespace ringkv_bench

BENCHMARK_MAIN();
#endif  // HWY_ONCE
