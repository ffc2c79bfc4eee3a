// The pieces of one decode block in isolation, with its K/V rows hot in L1: the score tiles, the
// softmax step (max, vector Exp, sums), the V tiles, and the three in sequence as a step runs
// them, for head_dim 64/128 and 1, 4 or 8 query heads per kv head. `fma_peak` (eight independent
// FMA chains, no loads: this core's arithmetic) is the baseline, measured in the same run.
// An iteration is 64 repeats of the part (Time / 64 = one block). Counter multiply_adds_per_second:
// the part's multiply-adds (16 positions × heads × head_dim for the scores, as many for the V
// rows) per second. What it answers: how fast the kernel's own
// arithmetic runs when memory is out of the picture — a whole step's time minus this is what
// its loads from L2/L3/DRAM cost. `walk` runs the same pieces block after block over a whole
// window of 8 kv heads (one query head each) held in L2 or L3, against a streaming read of the
// same bytes: what the tiles, and the softmax step between them, cost once the rows must stream
// in (no ring, no prefetch, no validation: the kernel's arithmetic and nothing else); its part
// `core` runs the kernel's own phases as a step planned side by side with blocks of 64 does
// (AttendSpread, four kv heads at a time), so a step's time minus it is what the step around
// the phases costs. Compiled
// once per Highway target (skeleton.cc pattern), the kernel headers of src/ included as
// simd.cpp includes them.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

#include "kernels/simd.h"
#include "stream_read.h"

#ifndef RINGKV_TILE_BENCH_WORK_
#define RINGKV_TILE_BENCH_WORK_  // once, though foreach_target.h includes this file per target
namespace ringkv_bench {
/// Which piece of a block tile and walk run (the benchmarks' first argument): the whole block,
/// its score tiles, its softmax step, its V tiles, score and V tiles without the softmax step
/// (the weights are the raw scores), or (walk only) a streaming read of the same rows.
/// walk only: `core` is the decode kernel's own phases for one query head a kv head as a step
/// on a large_l3 machine runs them (AttendSpread: four kv heads side by side, blocks of 64).
enum part : int { block = 0, scores = 1, softmax = 2, values = 3, tiles = 4, roof = 5, core = 6 };

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
#include "kernels/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ringkv_bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace rs = ringkv::simd::HWY_NAMESPACE;

/// A chunk of `heads` query heads over 64-byte aligned scratch `work` (work_floats(dim, heads)
/// floats): q [heads, dim], scores [heads, 16], rescale, max and sum [heads], acc [heads, dim];
/// q set to small values, the state empty.
struct block_work {
  rs::chunk c;
  ringkv::simd::state s;

  block_work(std::size_t dim, std::size_t heads, float* work) {
    constexpr std::size_t B = ringkv::simd::block_positions;
    c.count = heads;
    c.padded_dim = dim;                            // a multiple of 16 here
    float* q = work;                               // [heads, dim]
    c.scores = q + heads * dim;                    // [heads, B]
    c.rescale = c.scores + heads * B;              // [heads]
    float* max = c.rescale + padded_heads(heads);  // [heads]
    float* sum = max + padded_heads(heads);        // [heads]
    float* acc = sum + padded_heads(heads);        // [heads, dim]
    for (std::size_t i = 0; i < heads * dim; ++i) q[i] = 1e-3f * float(i % 7);
    for (std::size_t h = 0; h < heads; ++h) {
      max[h] = rs::minus_infinity;
      sum[h] = 0.0f;
      c.rescale[h] = 1.0f;
    }
    for (std::size_t i = 0; i < heads * dim; ++i) acc[i] = 0.0f;
    c.q = q;
    s = {max, sum, acc};
  }
  float result() const { return s.acc[0] + s.sum[0] + c.scores[0]; }
};

/// b's K and V rows: `rows` rows of `dim` floats from k and v.
void PointRows(rs::block_rows& b, const float* k, const float* v, std::size_t dim,
               std::size_t rows) {
  b.n = rows;
  for (std::size_t j = 0; j < rows; ++j) {
    b.k[j] = reinterpret_cast<const std::byte*>(k + j * dim);
    b.v[j] = reinterpret_cast<const std::byte*>(v + j * dim);
  }
}

/// One block's parts for the chunk's heads over rows b: the score tiles for block, scores and
/// tiles; the softmax step for block and softmax; the V tiles for block, values and tiles. Out
/// of line, so both callers share one copy of the tiles per target: inlined into each, they
/// made this file take 2.4x as long to compile under the asan preset.
HWY_NOINLINE void RunBlock(int which, std::size_t dim, const rs::chunk& c, const rs::block_rows& b,
                           const ringkv::simd::state& s) {
  const rs::DF d;
  rs::line_feed idle;
  if (which == block || which == scores || which == tiles)
    rs::ScoreBlock<rs::row_loader<float>>(d, dim, c, b, idle);
  if (which == block || which == softmax) rs::ExpBlock(c, s);
  if (which == block || which == values || which == tiles)
    rs::AccumulateBlock<rs::row_loader<float>>(d, dim, c, b, s, idle);
}

/// Repeats one part `repeats` times over one block of 16 rows (`k`, `v`: [16, dim]) for `heads`
/// query heads; `work` is 64-byte aligned scratch of work_floats(dim, heads) floats. Returns a
/// value of the result so the work cannot be dropped.
float RunPartImpl(int which, std::size_t dim, std::size_t heads, std::size_t repeats,
                  const float* k, const float* v, float* work) {
  block_work w(dim, heads, work);
  rs::block_rows b;
  PointRows(b, k, v, dim, ringkv::simd::block_positions);
  RunBlock(block, dim, w.c, b, w.s);  // scores and rescales that every part can start from
  for (std::size_t r = 0; r < repeats; ++r) RunBlock(which, dim, w.c, b, w.s);
  return w.result();
}

/// One step's walk over a window with its rows in L2 or L3 rather than hot: one query head per
/// kv head, kv head after kv head, block after block over `positions` rows (`k`, `v`:
/// [kv_heads, positions, dim]), as the kernel's one-head chunks take them (no ring, no prefetch).
/// which: block (scores, softmax step, V tiles), scores, values, or tiles (scores and V tiles,
/// no softmax step between them: the weights are the raw scores).
float WalkImpl(int which, std::size_t dim, std::size_t positions, std::size_t kv_heads,
               const float* k, const float* v, float* work) {
  constexpr std::size_t B = ringkv::simd::block_positions;
  block_work w(dim, 1, work);
  rs::block_rows b;
  for (std::size_t h = 0; h < kv_heads; ++h)
    for (std::size_t p = 0; p + B <= positions; p += B) {
      const std::size_t at = (h * positions + p) * dim;
      PointRows(b, k + at, v + at, dim, B);
      RunBlock(which, dim, w.c, b, w.s);
    }
  return w.result();
}

/// The kernel's phases over `k`, `v` ([kv_heads, positions, dim], kv_heads a multiple of
/// side_by_side_heads) for one query head a kv head: AttendSpread chunk after chunk as DecodeT
/// runs it for a step planned side by side with blocks of 64 — everything a step does but the
/// ring's runs, validation, planning, the split and the final normalisation; `work` as WalkImpl's,
/// for side_by_side_heads heads. Only for whole vectors of dim and at least one block of rows.
float CoreImpl(std::size_t dim, std::size_t positions, std::size_t kv_heads, const float* k,
               const float* v, float* work) {
  namespace s = ringkv::simd;
  constexpr std::size_t heads = s::side_by_side_heads;
  s::problem p;
  p.q_heads = p.kv_heads = kv_heads;
  p.head_dim = dim;
  p.block = s::wide_block_positions;
  p.side_by_side = true;
  for (auto [w, rows] : {std::pair{&p.keys, k}, std::pair{&p.values, v}}) {
    w->run_count = 1;
    w->runs[0] = {reinterpret_cast<const std::byte*>(rows), positions * dim * sizeof(float),
                  dim * sizeof(float), 0, positions};
  }
  block_work w(dim, heads, work);
  w.c.block = p.block;
  float sum = 0.0f;
  for (std::size_t h = 0; h < kv_heads; h += heads) {
    w.c.kv_head = w.c.q0 = h;
    rs::ClearRows(heads, dim, w.s);
    rs::AttendSpread<rs::row_loader<float>>(p, w.c, 0, positions, w.s);
    sum += w.s.acc[0];
  }
  return sum;
}

}  // namespace ringkv_bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ringkv_bench {
namespace {

HWY_EXPORT(RunPartImpl);
HWY_EXPORT(WalkImpl);
HWY_EXPORT(CoreImpl);

constexpr std::size_t repeats_per_iteration = 64;
constexpr std::size_t rows = ringkv::simd::block_positions;

struct aligned_free {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using floats = std::unique_ptr<float[], aligned_free>;

floats aligned_floats(std::size_t n) { return floats(new (std::align_val_t{64}) float[n]); }

/// n floats of K rows (into k) and of V rows (into v), in [−0.5, 0.5), neither repeating soon.
void fill_rows(floats& k, floats& v, std::size_t n) {
  k = aligned_floats(n);
  v = aligned_floats(n);
  for (std::size_t i = 0; i < n; ++i) {
    k[i] = float((i * 37) % 101) / 101.0f - 0.5f;
    v[i] = float((i * 53) % 103) / 103.0f - 0.5f;
  }
}

/// Args: part (block, scores, softmax or values), head_dim, query heads per kv head.
void tile(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const std::size_t dim = state.range(1), heads = state.range(2);
  floats k, v;
  fill_rows(k, v, rows * dim);
  floats work = aligned_floats(work_floats(dim, heads));
  for (auto _ : state)
    benchmark::DoNotOptimize(HWY_DYNAMIC_DISPATCH(RunPartImpl)(
        which, dim, heads, repeats_per_iteration, k.get(), v.get(), work.get()));
  const double per_phase = double(rows * heads * dim);
  const double phases = which == block ? 2.0 : which == softmax ? 0.0 : 1.0;
  state.counters["multiply_adds_per_second"] =
      benchmark::Counter(phases * per_phase * double(repeats_per_iteration),
                         benchmark::Counter::kIsIterationInvariantRate);
}

constexpr std::size_t walk_kv_heads = 8;

/// Args: part (block, tiles, scores, values, or roof: a streaming read of the window's K and V,
/// stream_read.h), head_dim, window positions per kv head (8 kv heads, one query head each).
/// Bytes processed: the rows the part reads.
void walk(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const std::size_t dim = state.range(1), positions = state.range(2);
  const std::size_t n = walk_kv_heads * positions * dim;  // [kv_heads, positions, dim]
  floats k, v;
  fill_rows(k, v, n);
  floats work = aligned_floats(work_floats(dim, ringkv::simd::side_by_side_heads));
  for (auto _ : state)
    benchmark::DoNotOptimize(
        which == roof   ? stream_read(k.get(), n) + stream_read(v.get(), n)
        : which == core ? HWY_DYNAMIC_DISPATCH(CoreImpl)(dim, positions, walk_kv_heads, k.get(),
                                                         v.get(), work.get())
                        : HWY_DYNAMIC_DISPATCH(WalkImpl)(which, dim, positions, walk_kv_heads,
                                                         k.get(), v.get(), work.get()));
  const bool both = which != scores && which != values;
  state.SetBytesProcessed(std::int64_t(state.iterations() * n * sizeof(float) * (both ? 2 : 1)));
}

void fma_peak(benchmark::State& state) {
  constexpr std::size_t steps = 1 << 16;
  for (auto _ : state) benchmark::DoNotOptimize(fma_chains(steps));
  const double lanes = double(fma_lanes());
  state.counters["multiply_adds_per_second"] =
      benchmark::Counter(8.0 * lanes * steps, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(fma_peak);
BENCHMARK(tile)
    ->ArgNames({"part", "D", "heads"})
    ->ArgsProduct({{block, scores, softmax, values}, {64, 128}, {1, 4, 8}});
BENCHMARK(walk)
    ->ArgNames({"part", "D", "W"})
    ->ArgsProduct({{roof, block, tiles, scores, values, core}, {64, 128}, {64, 256, 1024}})
    ->UseRealTime();

}  // namespace
}  // namespace ringkv_bench

BENCHMARK_MAIN();
#endif  // HWY_ONCE
