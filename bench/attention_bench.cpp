// One decode step, one thread, 8 query heads over 8 or 2 kv heads, head_dim 64/128, windows of
// 256, 4096 and 32768 positions. Variants, measured in the same run:
//   roof      a streaming read of the same f32 K+V bytes, K then V (nothing can attend them faster)
//   roofp     the same bytes with K and V read in turn (two streams: faster past the L3); the
//             roof a variant is measured against is the faster of the two (x_roof and report.py)
//   pair      ringkv: windowed_attention::decode_step over a wrapped ring (the window's two runs)
//   pair2     pair split across a default_thread_pool of 2 threads (the caller and one worker);
//             roof2 / roof16_2 (and their paired p reads) are the streaming reads split the
//             same way, its x_roof's base
//   gathered  ringkv: decode_step_gathered (copy both runs into a scope, then attend one run)
//   scalar    a plain two-pass softmax (scores, then exp and V) per query head, scalar code
//   ggml, ggml2  ggml's CPU flash-attention decode loop re-written (ggml_style.h: per query head
//             and position a SIMD dot, a scalar online-softmax update, a SIMD multiply-add of
//             the V row), on 1 thread and on 2 (query heads split across the pool, as ggml
//             splits its rows): ggml's algorithm measured in the same minutes as ringkv
//   floor, floor2  roofp's read with the multiply-adds a step must do on those bytes (one per
//             query head of the kv head's group on every vector: the scores' and the V sums'),
//             nothing else (no sum across lanes, no exp, no rescale): a floor under any exact
//             decode step of the shape, on 1 and 2 threads. Where it is already above 1.25x
//             the roof, no kernel can be within 1.25x of it on this machine
//   floor_exp, floor2_exp  the floor with the exps a step must take besides: one vector exp
//             (Highway's, as the kernel's) per query head and Lanes positions, of values taken
//             from the chains; where it is above 1.25x the roof, so is any exact step
//   floor_f16, floor2_f16  the floor over the f16 rows: roof16's paired read, each vector
//             promoted to f32, then the same multiply-adds (the f16 steps' floor)
//   roof16    a streaming read of the same K+V stored at 2 bytes an element (f16 or bf16)
//   pair_f16, pair_bf16, pair2_f16  the pair path over K/V stored as f16 / bf16 (promoted in registers,
//             f32 accumulation); their x_roof is against roof16
// Counters: bytes_per_second = unique K+V bytes (as stored) per step / time; x_roof = time /
// the roof time of the same bytes.
// Run through scripts/bench (release build, JSON in build/bench/attention.json). Other windows:
// RINGKV_BENCH_WINDOWS=256,1024,2048,4096 (comma-separated positions; the default is the grid above).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "ggml_style.h"
#include "stream_read.h"

import ringkv;

namespace {

using ringkv::windowed_kv;

using ringkv::dtype;

struct shape {
  std::size_t dim, window, kv_heads;
  dtype type = dtype::f32;  // how K and V are stored
  std::size_t threads = 1;  // 2: the step (and its roof) split across a default_thread_pool(2)
  static constexpr std::size_t q_heads = 8;
  auto key() const { return std::tuple(dim, window, kv_heads, type); }
  std::size_t kv_bytes() const { return 2 * kv_heads * window * dim * ringkv::size_of(type); }
};

/// x in [-1, 1) as the bits of `type` (f16: x truncated to 10 fraction bits, ±2^-14 below
/// that, so the roof's f32 view of the bytes holds no subnormals; bf16: the top half of its f32
/// bits). Benchmark data, not a conversion to rely on.
std::uint16_t half_bits(float x, dtype type) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x);
  if (type == dtype::bf16) return std::uint16_t(b >> 16);
  const std::uint32_t exponent = (b >> 23) & 0xff;
  if (exponent < 127 - 14) return std::uint16_t(((b >> 16) & 0x8000) | 0x0400);
  return std::uint16_t(((b >> 16) & 0x8000) | ((exponent - 112) << 10) | ((b >> 13) & 0x3ff));
}

/// Fills `st` with values in [-1, 1) from `next`, stored as `type`.
template <class Next>
void fill(ringkv::storage& st, dtype type, Next& next) {
  if (type == dtype::f32) {
    for (float& f : st.as<float>()) f = next();
    return;
  }
  for (std::uint16_t& h : st.as<std::uint16_t>()) h = half_bits(next(), type);
}

/// One layer's K and V as the store lays them out, [kv_heads][capacity = W][head_dim] each, after
/// 3.5 laps: the window of the newest W positions starts mid-ring, so it is two runs.
class wrapped_layer {
 public:
  explicit wrapped_layer(shape s)
      : s_(s), k_(s.kv_bytes() / 2, "bench-keys"), v_(s.kv_bytes() / 2, "bench-values"),
        query_(s.q_heads * s.dim), out_(s.q_heads * s.dim), scores_(s.window) {
    std::uint32_t x = 12345;
    auto next = [&x] { return (x = x * 1664525u + 1013904223u) * 0x1.0p-31f - 1.0f; };
    fill(k_, s.type, next);
    fill(v_, s.type, next);
    for (float& f : query_) f = 2.0f * next();
  }
  windowed_kv keys() { return window(k_); }
  windowed_kv values() { return window(v_); }
  std::span<const float> query() const { return query_; }
  std::span<float> out() { return out_; }
  std::span<float> scores() { return scores_; }
  const ringkv::storage& key_storage() const { return k_; }
  const ringkv::storage& value_storage() const { return v_; }

 private:
  windowed_kv window(ringkv::storage& st) {
    const std::size_t w = s_.window, half = w / 2, d = s_.dim, row = d * ringkv::size_of(s_.type);
    const ringkv::tensor_view head(st.data() + half * row, s_.type, s_.kv_heads, w - half, d, w * d,
                                   d);  // slots [W/2, W)
    const ringkv::tensor_view tail(st.data(), s_.type, s_.kv_heads, half, d, w * d,
                                   d);             // slots [0, W/2)
    return windowed_kv(head, tail, 3 * w - half);  // positions [2.5 W, 3.5 W)
  }

  shape s_;
  ringkv::storage k_, v_;      // [kv_heads, W, head_dim] each
  std::vector<float> query_;   // [q_heads, head_dim]
  std::vector<float> out_;     // [q_heads, head_dim]
  std::vector<float> scores_;  // [W] for the scalar reference
};

/// The layer of the shape being measured (variants of a shape run one after another; one layer
/// at a time keeps the largest shapes' 256 MB from piling up).
wrapped_layer& layer_for(shape s) {
  static std::unique_ptr<wrapped_layer> layer;
  static std::tuple<std::size_t, std::size_t, std::size_t, dtype> current;
  if (!layer || current != s.key()) {
    layer.reset();
    layer = std::make_unique<wrapped_layer>(s);
    current = s.key();
  }
  return *layer;
}

/// The pool of the two-thread variants (the caller and one worker).
ringkv::default_thread_pool& pool_of_two() {
  static ringkv::default_thread_pool pool(2);
  return pool;
}

/// part(from, n) over the layer's K/V storage as floats (n of K and n of V from element `from`),
/// on 1 thread, or on 2 with each taking half of K and half of V; the parts' sums added.
template <class Part>
float split_read(wrapped_layer& l, std::size_t threads, Part part) {
  const std::size_t n = l.key_storage().as<float>().size();
  if (threads == 1) return part(0, n);
  float sums[2] = {};
  pool_of_two().parallel_for(2, [&](std::size_t t) {
    const std::size_t half = n / 2;
    sums[t] = part(t * half, t ? n - half : half);
  });
  return sums[0] + sums[1];
}

/// Reads every byte of the layer's K and V (as floats, whatever they hold): K then V, or, `paired`,
/// the two in turn (two streams at once, faster past the L3); with 2 threads each thread reads
/// half of K and half of V.
float read_roof(wrapped_layer& l, std::size_t threads, bool paired) {
  const auto k = l.key_storage().as<float>(), v = l.value_storage().as<float>();
  return split_read(l, threads, [&](std::size_t from, std::size_t n) {
    if (paired) return ringkv_bench::stream_read_pair(k.data() + from, v.data() + from, n);
    return ringkv_bench::stream_read(k.data() + from, n) +
           ringkv_bench::stream_read(v.data() + from, n);
  });
}

/// Nanoseconds of the roof for this shape: the fastest of several timed batches of either read,
/// measured once.
double roof_nanos(shape s) {
  // Keyed by the bytes read: f16 and bf16 rows share one roof.
  static std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t, std::size_t>,
                  double>
      cache;
  const auto key = std::tuple(s.dim, s.window, s.kv_heads, ringkv::size_of(s.type), s.threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  wrapped_layer& l = layer_for(s);
  const std::size_t batch = std::max<std::size_t>(1, (std::size_t(64) << 20) / s.kv_bytes());
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 30; ++rep) {
    const bool paired = rep % 2 != 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < batch; ++i)
      benchmark::DoNotOptimize(read_roof(l, s.threads, paired));
    const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / double(batch));
  }
  return cache[key] = best;
}

/// Runs `step` as the benchmark loop and sets the counters every variant reports.
template <class Step>
void measure(benchmark::State& state, shape s, Step&& step) {
  const double roof = roof_nanos(s);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    step();
    benchmark::ClobberMemory();
  }
  const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
  state.SetBytesProcessed(std::int64_t(state.iterations() * s.kv_bytes()));
  state.counters["x_roof"] = dt.count() / double(state.iterations()) / roof;
  state.counters["kv_bytes"] = double(s.kv_bytes());
}

void roof(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  measure(state, s, [&] { benchmark::DoNotOptimize(read_roof(l, s.threads, false)); });
}

void roof_paired(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  measure(state, s, [&] { benchmark::DoNotOptimize(read_roof(l, s.threads, true)); });
}

/// The floor (fma_floor) or, with `exps`, the exp floor (f32 rows only) of the shape.
void floor_of(benchmark::State& state, shape s, bool exps) {
  wrapped_layer& l = layer_for(s);
  const auto k = l.key_storage().as<float>(), v = l.value_storage().as<float>();
  const std::size_t group = shape::q_heads / s.kv_heads;
  // The f16 layer's rows are read as f16 bits (two to a float of the view), each vector
  // promoted to f32 before its multiply-adds (bf16 rows promote otherwise: no floor of theirs).
  const auto* kh = reinterpret_cast<const std::uint16_t*>(k.data());
  const auto* vh = reinterpret_cast<const std::uint16_t*>(v.data());
  const bool f16 = s.type == dtype::f16;
  measure(state, s, [&] {
    benchmark::DoNotOptimize(split_read(l, s.threads, [&](std::size_t from, std::size_t n) {
      if (f16) return ringkv_bench::stream_fma_pair_f16(kh + 2 * from, vh + 2 * from, 2 * n, group);
      return exps ? ringkv_bench::stream_fma_exp_pair(k.data() + from, v.data() + from, n, group,
                                                      s.dim)
                  : ringkv_bench::stream_fma_pair(k.data() + from, v.data() + from, n, group);
    }));
  });
}

void fma_floor(benchmark::State& state, shape s) { floor_of(state, s, false); }
void exp_floor(benchmark::State& state, shape s) { floor_of(state, s, true); }

void pair(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  const ringkv::windowed_attention attention;
  const windowed_kv k = l.keys(), v = l.values();
  state.SetLabel(std::string(ringkv::kernels::target_name()));
  measure(state, s, [&] { attention.decode_step(l.query(), k, v, l.out()); });
}

void pair2(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  const ringkv::windowed_attention attention(ringkv::attention_options{.pool = &pool_of_two()});
  const windowed_kv k = l.keys(), v = l.values();
  state.SetLabel(std::string(ringkv::kernels::target_name()));
  attention.decode_step(l.query(), k, v, l.out());  // grows the split scratch once
  measure(state, s, [&] { attention.decode_step(l.query(), k, v, l.out()); });
}

void gathered(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  const ringkv::windowed_attention attention;
  const windowed_kv k = l.keys(), v = l.values();
  ringkv::scope arena(s.kv_bytes() + 4096);
  state.SetLabel(std::string(ringkv::kernels::target_name()));
  measure(state, s, [&] {
    attention.decode_step_gathered(l.query(), k, v, l.out(), arena);
    arena.reset();
  });
}

/// The textbook decode step, scalar: per query head, all scores and their max, then exp, the
/// denominator and the weighted V rows (K and V are read once per query head).
void scalar_two_pass(std::span<const float> query, const windowed_kv& k, const windowed_kv& v,
                     std::span<float> out, std::span<float> scores, std::size_t q_heads) {
  const std::size_t dim = k.head_dim(), group = q_heads / k.heads();
  const float scale = 1.0f / std::sqrt(float(dim));
  for (std::size_t h = 0; h < q_heads; ++h) {
    const float* q = query.data() + h * dim;
    float* o = out.data() + h * dim;
    float m = -std::numeric_limits<float>::infinity();
    std::size_t j = 0;
    for (const ringkv::tensor_view& run : k.runs())
      for (std::size_t p = 0; p < run.positions(); ++p, ++j) {
        const float* row = run.row<float>(h / group, p).data();
        float dot = 0;
        for (std::size_t i = 0; i < dim; ++i) dot += q[i] * row[i];
        scores[j] = dot * scale;
        m = std::max(m, scores[j]);
      }
    float sum = 0;
    std::fill(o, o + dim, 0.0f);
    j = 0;
    for (const ringkv::tensor_view& run : v.runs())
      for (std::size_t p = 0; p < run.positions(); ++p, ++j) {
        const float w = std::exp(scores[j] - m);
        const float* row = run.row<float>(h / group, p).data();
        sum += w;
        for (std::size_t i = 0; i < dim; ++i) o[i] += w * row[i];
      }
    for (std::size_t i = 0; i < dim; ++i) o[i] /= sum;
  }
}

void scalar(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  const windowed_kv k = l.keys(), v = l.values();
  measure(state, s, [&] { scalar_two_pass(l.query(), k, v, l.out(), l.scores(), shape::q_heads); });
}

/// The window's runs as ggml_style_decode reads them: K and V runs of the same positions.
std::vector<ringkv_bench::ggml_run> ggml_runs(const windowed_kv& k, const windowed_kv& v) {
  std::vector<ringkv_bench::ggml_run> runs;
  for (std::size_t r = 0; r < k.runs().size(); ++r) {
    const ringkv::tensor_view &kr = k.runs()[r], &vr = v.runs()[r];
    runs.push_back(
        {kr.row<float>(0, 0).data(), vr.row<float>(0, 0).data(), kr.positions(), kr.head_stride()});
  }
  return runs;
}

void ggml(benchmark::State& state, shape s) {
  wrapped_layer& l = layer_for(s);
  const windowed_kv k = l.keys(), v = l.values();
  const auto runs = ggml_runs(k, v);
  const std::size_t group = shape::q_heads / s.kv_heads, share = shape::q_heads / s.threads;
  const float scale = 1.0f / std::sqrt(float(s.dim));
  // Each thread's [dim] accumulator 16 KiB from the other's: 256 bytes apart, the 2-thread
  // D 64 steps took 2.3x as long, which would flatter ringkv.
  constexpr std::size_t apart = 4096;
  std::vector<float> acc(s.threads * apart);  // [threads, apart]
  const auto heads = [&](std::size_t t) {
    ringkv_bench::ggml_style_decode(l.query().data(), t * share, (t + 1) * share, group, s.dim,
                                    runs, scale, l.out().data(), acc.data() + t * apart);
  };
  // A baseline that computed something else would measure nothing: its rows must be ringkv's
  // within f32 rounding of a different summation order.
  for (std::size_t t = 0; t < s.threads; ++t) heads(t);
  std::vector<float> expected(l.out().size());
  ringkv::windowed_attention().decode_step(l.query(), k, v, expected);
  float worst = 0, largest = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(expected[i] - l.out()[i]));
    largest = std::max(largest, std::abs(expected[i]));
  }
  if (!(worst <= 1e-4f * largest))
    return state.SkipWithError("ggml_style_decode disagrees with ringkv");
  if (s.threads == 1) return measure(state, s, [&] { heads(0); });
  measure(state, s, [&] { pool_of_two().parallel_for(2, heads); });
}

/// The windows to measure: RINGKV_BENCH_WINDOWS (positions, comma-separated, e.g.
/// "256,1024,2048,4096") or the default grid (256, 4096, 32768); refuses a list it cannot read.
std::vector<std::size_t> windows() {
  const char* list = std::getenv("RINGKV_BENCH_WINDOWS");
  if (list == nullptr || *list == '\0') return {256, 4096, 32768};
  std::vector<std::size_t> w;
  for (const char* p = list;;) {
    char* end = nullptr;
    const unsigned long n = std::strtoul(p, &end, 10);
    if (end == p || n == 0 || (*end != ',' && *end != '\0'))
      throw std::invalid_argument(std::string("RINGKV_BENCH_WINDOWS: expected positive window "
                                              "sizes separated by commas, got \"") +
                                  list + '"');
    w.push_back(n);
    if (*end == '\0') return w;
    p = end + 1;
  }
}

/// The fastest repetition: on a machine shared with other work, the least disturbed one.
double fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  using variant = std::tuple<const char*, void (*)(benchmark::State&, shape), dtype, std::size_t>;
  // roof16 reads the f16 layer: f16 and bf16 rows are the same bytes.
  constexpr std::array<variant, 23> variants{{{"roof", roof, dtype::f32, 1},
                                              {"pair", pair, dtype::f32, 1},
                                              {"gathered", gathered, dtype::f32, 1},
                                              {"scalar", scalar, dtype::f32, 1},
                                              {"roof2", roof, dtype::f32, 2},
                                              {"pair2", pair2, dtype::f32, 2},
                                              {"roof16", roof, dtype::f16, 1},
                                              {"pair_f16", pair, dtype::f16, 1},
                                              {"roof16_2", roof, dtype::f16, 2},
                                              {"pair2_f16", pair2, dtype::f16, 2},
                                              {"pair_bf16", pair, dtype::bf16, 1},
                                              {"ggml", ggml, dtype::f32, 1},
                                              {"ggml2", ggml, dtype::f32, 2},
                                              {"roofp", roof_paired, dtype::f32, 1},
                                              {"roof2p", roof_paired, dtype::f32, 2},
                                              {"roof16p", roof_paired, dtype::f16, 1},
                                              {"roof16_2p", roof_paired, dtype::f16, 2},
                                              {"floor", fma_floor, dtype::f32, 1},
                                              {"floor2", fma_floor, dtype::f32, 2},
                                              {"floor_exp", exp_floor, dtype::f32, 1},
                                              {"floor2_exp", exp_floor, dtype::f32, 2},
                                              {"floor_f16", fma_floor, dtype::f16, 1},
                                              {"floor2_f16", fma_floor, dtype::f16, 2}}};
  std::vector<std::size_t> grid_windows;
  try {
    grid_windows = windows();
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  for (std::size_t dim : {64, 128})
    for (std::size_t window : grid_windows)
      for (std::size_t kv : {8, 2}) {
        const std::string name = "decode/D:" + std::to_string(dim) +
                                 "/W:" + std::to_string(window) + "/kv:" + std::to_string(kv) + "/";
        for (const auto& [label, fn, type, threads] : variants)
          benchmark::RegisterBenchmark((name + label).c_str(), fn,
                                       shape{dim, window, kv, type, threads})
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime()
              ->ComputeStatistics("min", fastest);
      }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
