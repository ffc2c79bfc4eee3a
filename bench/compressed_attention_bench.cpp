// One decode step over compressed K/V against ringkv's own f16 and f32 paths, in one process:
// 8 query heads over 8 or 2 kv heads, head_dim 64/128, the newest W = 256, 4096 or 32768
// positions of a ring that has wrapped (1.5 W tokens appended), on 1 and 2 threads. Names
// compressed/D:<d>/W:<w>/kv:<kv>/<variant>; a `_2` variant splits the step over a
// default_thread_pool(2) (the caller and one worker). Variants:
//   f32, f16  windowed_attention::decode_step over default_kv_cache_store's zero-copy window
//             (f16 rows promoted in registers, f32 accumulation): the references
//   fp8       the same over fp8 E4M3 rows (one byte an element, promoted in registers)
//   tq4/3/2   compressed_kv_attention over a turboquant_kv_cache_store (key_bits = value_bits)
//   tq4qjl    the same, keys 3 codebook bits + 1 QJL bit, values 4 bits
//   int8      compressed_kv_attention over an int8_kv_cache_store
//   floor_int8  the int8 rows' floor: K and V bytes of the same window read in turn, each vector
//             converted to f32 and multiplied into one chain per query head of the group, one
//             vector exp per head and Lanes positions (bench/stream_read.h): the least an exact
//             step over int8 rows does in f32 arithmetic. Where it is slower than f16, so is any
//             such step.
//   read_int8  the int8 rows' bytes read and summed (as floats of the same bytes), nothing else,
//             in the kernel's order (per kv head a segment's K rows, then its V rows): the least
//             time any step over them takes on that many threads, hence the most a second thread
//             can give a step that takes T on one (T ÷ this on 2 threads).
// Every store of a shape gets the same tokens and the same query; the stores of the shape being
// measured are kept between variants, so one process's repetitions can interleave them
// (--benchmark_enable_random_interleaving=true; run one shape a process:
// bench/compressed_targets.py does, and takes each ratio to f16 within one process).
// Counters: bytes_per_token = the store's physical bytes / W (K and V, all kv heads, one layer,
// rotations and QJL projections included); kv_bytes = the bytes of the window the step reads.
// Only a release build's numbers mean anything.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "hwy/targets.h"
#include "kernels/quant/quant_simd.h"
#include "stream_read.h"

import ringkv;

namespace {

constexpr std::size_t q_heads = 8;
enum kind : std::uint8_t {
  f32,
  f16,
  fp8,
  tq4,
  tq3,
  tq2,
  tq4qjl,
  int8,
  floor_int8,
  read_int8,
  kinds
};
constexpr std::array<const char*, kinds> names = {
    "f32", "f16", "fp8", "tq4", "tq3", "tq2", "tq4qjl", "int8", "floor_int8", "read_int8"};

/// Whether variant k is a default store of element rows (attended by the element kernels).
constexpr bool elements(kind k) { return k == f32 || k == f16 || k == fp8; }

struct shape {
  std::size_t dim, window, kv_heads;
  auto key() const { return std::tuple(dim, window, kv_heads); }
};

std::unique_ptr<ringkv::kv_cache_store> make(kind k, const shape& s) {
  const ringkv::kv_cache_config c{
      .layers = 1, .kv_heads = s.kv_heads, .head_dim = s.dim, .capacity = s.window};
  const ringkv::store_options ring{.sliding_window = true};
  auto tq = [&](unsigned bits, bool qjl) {
    return std::make_unique<ringkv::turboquant_kv_cache_store>(
        c, ringkv::turboquant_options{.key_bits = bits, .value_bits = bits, .qjl = qjl}, ring);
  };
  const auto of = [&](ringkv::dtype t) {
    ringkv::kv_cache_config h = c;
    h.key_type = h.value_type = t;
    return std::make_unique<ringkv::default_kv_cache_store>(h, ring);
  };
  switch (k) {
    case f32:
      return of(ringkv::dtype::f32);
    case f16:
      return of(ringkv::dtype::f16);
    case fp8:
      return of(ringkv::dtype::fp8_e4m3);
    case tq4:
      return tq(4, false);
    case tq3:
      return tq(3, false);
    case tq2:
      return tq(2, false);
    case tq4qjl:
      return tq(4, true);
    default:
      return std::make_unique<ringkv::int8_kv_cache_store>(c, ring);
  }
}

/// Uniform values in [-1, 1) from a fixed seed (cheap: a 32768-position shape appends 49,152
/// tokens to each store).
struct uniform {
  std::uint32_t x;
  float operator()() { return float(x = x * 1664525u + 1013904223u) * 0x1.0p-31f - 1.0f; }
};

/// The stores of the shape being measured, each built and filled on first use with the same
/// 1.5 W tokens (so its window wraps); one shape at a time keeps the largest from piling up.
ringkv::kv_cache_store& store_for(kind k, const shape& s) {
  static std::array<std::unique_ptr<ringkv::kv_cache_store>, kinds> stores;
  static std::tuple<std::size_t, std::size_t, std::size_t> current{};
  if (current != s.key()) {
    for (auto& st : stores) st.reset();
    current = s.key();
  }
  if (!stores[k]) {
    stores[k] = make(k, s);
    uniform next{12345};
    std::vector<float> key(s.kv_heads * s.dim), value(key.size());
    for (std::size_t t = 0; t < s.window + s.window / 2; ++t) {
      for (float& x : key) x = next();
      for (float& x : value) x = next();
      stores[k]->append(0, key, value);
    }
  }
  return *stores[k];
}

/// The pool of the two-thread variants.
ringkv::thread_pool& pool_of_two() {
  static ringkv::default_thread_pool pool(2);
  return pool;
}

/// The floor's int8 K and V of the shape: [kv_heads, W, head_dim] each, values in [-127, 127].
struct int8_rows {
  std::vector<std::int8_t> k, v;
  explicit int8_rows(const shape& s) : k(s.kv_heads * s.window * s.dim), v(k.size()) {
    uniform next{99};
    for (auto* a : {&k, &v})
      for (std::int8_t& x : *a) x = std::int8_t(127.0f * next());
  }
};

/// The floor over `rows`, on 1 thread or split in two halves of K and V across the pool.
float int8_floor(const int8_rows& rows, const shape& s, std::size_t threads) {
  const std::size_t n = rows.k.size(), group = q_heads / s.kv_heads;
  if (threads == 1)
    return ringkv_bench::stream_fma_exp_pair_int8(rows.k.data(), rows.v.data(), n, group, s.dim);
  float sums[2] = {};
  pool_of_two().parallel_for(2, [&](std::size_t t) {
    const std::size_t from = t * n / 2;
    sums[t] = ringkv_bench::stream_fma_exp_pair_int8(rows.k.data() + from, rows.v.data() + from,
                                                     n / 2, group, s.dim);
  });
  return sums[0] + sums[1];
}

/// The bytes of the int8 K and V of the shape, as floats (1.0f): what read_int8 reads.
struct read_rows {
  std::vector<float> k, v;
  explicit read_rows(const shape& s)
      : k(s.kv_heads * s.window * s.dim / sizeof(float), 1.0f), v(k.size(), 1.0f) {}
};

/// Reads [from, to) of `rows` in the kernel's order: a segment's K rows of a kv head, then its
/// V rows (`segment` floats each).
float read_segments(const read_rows& rows, std::size_t from, std::size_t to, std::size_t segment) {
  float sum = 0;
  for (std::size_t i = from; i < to; i += segment) {
    const std::size_t n = std::min(segment, to - i);
    sum += ringkv_bench::stream_read(rows.k.data() + i, n);
    sum += ringkv_bench::stream_read(rows.v.data() + i, n);
  }
  return sum;
}

/// Reads `rows` on 1 thread or split in two halves (whole kv heads where they divide) across the
/// pool.
float read_floor(const read_rows& rows, const shape& s, std::size_t threads) {
  const std::size_t n = rows.k.size();
  const std::size_t segment = ringkv::kernels::segment_positions * s.dim / sizeof(float);
  if (threads == 1) return read_segments(rows, 0, n, segment);
  float sums[2] = {};
  pool_of_two().parallel_for(2, [&](std::size_t t) {
    sums[t] = read_segments(rows, t * n / 2, (t + 1) * n / 2, segment);
  });
  return sums[0] + sums[1];
}

/// One cached instance of T for the shape being measured (the floors' rows).
template <class T>
const T& rows_for(const shape& s) {
  static std::unique_ptr<T> cached;
  static std::tuple<std::size_t, std::size_t, std::size_t> cached_shape{};
  if (!cached || cached_shape != s.key()) {
    cached.reset();
    cached = std::make_unique<T>(s);
    cached_shape = s.key();
  }
  return *cached;
}

/// The target the compressed kernel dispatches to here: the best one compiled for it (which may
/// exceed the f32 kernels', e.g. AVX3_DL) and supported by the CPU.
std::string compressed_target() {
  const std::int64_t usable = ringkv::simd::compressed_targets() & hwy::SupportedTargets();
  return hwy::TargetName(usable & -usable);  // lower bits are better targets
}

/// The fastest repetition: on a machine shared with other work, the least disturbed one.
double fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void decode_step(benchmark::State& state, kind k, shape s, std::size_t threads) {
  if (k == floor_int8) {
    const int8_rows& rows = rows_for<int8_rows>(s);
    for (auto _ : state) benchmark::DoNotOptimize(int8_floor(rows, s, threads));
    state.counters["kv_bytes"] = double(2 * rows.k.size());
    return;
  }
  if (k == read_int8) {
    const read_rows& rows = rows_for<read_rows>(s);
    for (auto _ : state) benchmark::DoNotOptimize(read_floor(rows, s, threads));
    state.counters["kv_bytes"] = double(2 * rows.k.size() * sizeof(float));
    return;
  }
  ringkv::kv_cache_store& st = store_for(k, s);
  uniform next{777};
  std::vector<float> q(q_heads * s.dim), out(q.size());
  for (float& x : q) x = 2.0f * next();
  const std::size_t n = st.length(0), from = n - s.window;
  const ringkv::attention_options options{.pool = threads > 1 ? &pool_of_two() : nullptr};
  std::size_t bytes = 0;
  // Every store's own window (one type, elements or codes), no cast to a concrete store.
  const ringkv::windowed_kv keys = *st.stored_window(ringkv::kv_side::keys, 0, from, n);
  const ringkv::windowed_kv values = *st.stored_window(ringkv::kv_side::values, 0, from, n);
  if (elements(k)) {
    const ringkv::windowed_attention attention(options);
    attention.decode_step(q, keys, values, out);  // grows the split scratch once
    for (auto _ : state) {
      attention.decode_step(q, keys, values, out);
      benchmark::DoNotOptimize(out.data());
    }
    bytes = keys.bytes() + values.bytes();
  } else {
    const ringkv::compressed_kv_attention attention(options);
    for (auto _ : state) {
      attention.decode_step(q, keys, values, out);
      benchmark::DoNotOptimize(out.data());
    }
    bytes = st.memory().physical_bytes;
  }
  state.counters["bytes_per_token"] = double(st.memory().physical_bytes) / double(s.window);
  state.counters["kv_bytes"] = double(bytes);
  state.SetLabel(elements(k) ? std::string(ringkv::kernels::target_name()) : compressed_target());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (std::size_t dim : {64, 128})
    for (std::size_t window : {256, 4096, 32768})
      for (std::size_t kv : {8, 2}) {
        const std::string name = "compressed/D:" + std::to_string(dim) +
                                 "/W:" + std::to_string(window) + "/kv:" + std::to_string(kv) + "/";
        for (std::size_t threads : {1, 2})
          for (std::size_t k = 0; k < kinds; ++k)
            benchmark::RegisterBenchmark(
                (name + names[k] + (threads == 2 ? "_2" : "")).c_str(),
                [k, s = shape{dim, window, kv}, threads](benchmark::State& state) {
                  decode_step(state, kind(k), s, threads);
                })
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime()
                ->ComputeStatistics("min", fastest);
      }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
