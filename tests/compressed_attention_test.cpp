#define BOOST_TEST_MODULE compressed_attention
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>

#include "count_new.hpp"
#include "hwy_targets.hpp"
#include "kernels/quant/quant_simd.h"

import ringkv;

#include "store_support.hpp"

namespace trace = ringkv::trace;
using ringkv::compressed_kv_cache_store;
using ringkv::compressed_window;
using ringkv::kv_cache_config;
using ringkv::store_options;
using ringkv::turboquant_kv_cache_store;
using ringkv::turboquant_options;
using store_test::mentions;

namespace {

/// Each target the compressed kernel was compiled for (AVX3_DL too, which the f32 kernels lack).
template <class Body>
void for_each_target(Body&& body) {
  ringkv_test::for_each_target(body, ringkv::simd::compressed_targets());
}

kv_cache_config shape(std::size_t d, std::size_t capacity, std::size_t kv_heads) {
  return {.layers = 1, .kv_heads = kv_heads, .head_dim = d, .capacity = capacity};
}

std::vector<float> gaussian(std::mt19937& rng, std::size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// Appends `tokens` random K/V rows to every store given (the same rows to each).
void fill(std::initializer_list<ringkv::kv_cache_store*> stores, std::size_t tokens,
          std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::size_t row = (*stores.begin())->config().row_floats();
  for (std::size_t t = 0; t < tokens; ++t) {
    const auto k = gaussian(rng, row), v = gaussian(rng, row);
    for (auto* s : stores) s->append(0, k, v);
  }
}

/// Plain double-precision softmax attention over f32 rows [kv_heads, n, d] (GQA).
std::vector<double> reference(std::span<const float> q, std::span<const float> keys,
                              std::span<const float> values, std::size_t kv_heads, std::size_t d,
                              float scale) {
  const std::size_t q_heads = q.size() / d, n = keys.size() / (kv_heads * d);
  std::vector<double> out(q.size(), 0.0);
  for (std::size_t h = 0; h < q_heads; ++h) {
    const std::size_t kv = h / (q_heads / kv_heads);
    std::vector<double> s(n);
    double m = -INFINITY, sum = 0;
    for (std::size_t j = 0; j < n; ++j) {
      double dot = 0;
      for (std::size_t i = 0; i < d; ++i) dot += double(q[h * d + i]) * keys[(kv * n + j) * d + i];
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    for (std::size_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < d; ++i)
        out[h * d + i] += s[j] / sum * values[(kv * n + j) * d + i];
  }
  return out;
}

double relative_error(std::span<const float> got, std::span<const double> want) {
  double e = 0, n = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    n += want[i] * want[i];
  }
  return std::sqrt(e / n);
}

std::vector<float> read_all(const ringkv::kv_cache_store& s, bool keys, std::size_t from,
                            std::size_t to) {
  std::vector<float> out(s.config().row_floats() * (to - from));
  keys ? s.read_keys(0, from, to, out) : s.read_values(0, from, to, out);
  return out;
}

std::vector<float> attend(const compressed_kv_cache_store& s, std::span<const float> q,
                          std::size_t from, std::size_t to) {
  std::vector<float> out(q.size());
  ringkv::compressed_kv_attention().decode_step(q, s.compressed_key_window(0, from, to),
                                                s.compressed_value_window(0, from, to), out);
  return out;
}

struct variant {
  const char* name;
  std::unique_ptr<compressed_kv_cache_store> (*make)(const kv_cache_config&, store_options);
};
template <unsigned K, unsigned V, bool Q>
std::unique_ptr<compressed_kv_cache_store> tq(const kv_cache_config& c, store_options o) {
  return std::make_unique<turboquant_kv_cache_store>(
      c, turboquant_options{.key_bits = K, .value_bits = V, .qjl = Q, .seed = 7}, o);
}
std::unique_ptr<compressed_kv_cache_store> i8(const kv_cache_config& c, store_options o) {
  return std::make_unique<ringkv::int8_kv_cache_store>(c, o);
}
const variant variants[] = {{"turboquant 2-bit", tq<2, 2, false>},
                            {"turboquant 3-bit", tq<3, 3, false>},
                            {"turboquant 4-bit", tq<4, 4, false>},
                            {"turboquant 4-bit keys with QJL (3+1)", tq<4, 4, true>},
                            {"int8", i8}};

}  // namespace

BOOST_AUTO_TEST_CASE(the_kernel_matches_a_double_reference_over_the_dequantized_rows) {
  // The kernel's own arithmetic, apart from quantization: against the rows the store reads back.
  // int8 within its query's rounding to 16 bits and, where V rows are summed in integers (AVX-512
  // VNNI), its weights' (the output by about 3e-5 and 6e-5, under 1 % of int8's own error);
  // TurboQuant within its keys' 7-bit score tables (a score off by at most half a table
  // step a coordinate; the attention output by 2-4 %).
  // kv 8: one query head a kv head (3-bit V rows of whole 128-coordinate chunks expand as such)
  for (std::size_t d : {64u, 96u, 128u, 5u, 256u})
    for (std::size_t kv_heads : {2u, 8u})
      for (const variant& v : variants) {
        const std::size_t q_heads = 8, n = 150;
        auto s = v.make(shape(d, n, kv_heads), {});
        fill({s.get()}, n, 3);
        std::mt19937 rng(9);
        const auto q = gaussian(rng, q_heads * d);
        const auto want = reference(q, read_all(*s, true, 0, n), read_all(*s, false, 0, n),
                                    kv_heads, d, 1.0f / std::sqrt(float(d)));
        const bool exact = std::string(v.name) == "int8";
        for_each_target([&](const char* target) {
          const double e = relative_error(attend(*s, q, 0, n), want);
          BOOST_TEST_CONTEXT(v.name << ", D " << d << ", kv " << kv_heads << ", " << target) {
            BOOST_TEST(e < (exact ? 1e-4 : 0.06));
          }
        });
      }
}

BOOST_AUTO_TEST_CASE(score_tables_add_at_most_a_tenth_to_the_exact_codebooks_error) {
  // Per bit width, the attention output's error against the f32 store's (double references over
  // 8 queries, peaked like real attention): the exact-codebook step's (the double reference over
  // the dequantized rows, which an exact kernel meets to f32 rounding) and this kernel's, whose
  // key scores come from 7-bit tables. Issue 55 allows 10 % more error at 4 bits.
  for (std::size_t d : {64u, 128u}) {
    const std::size_t kv_heads = 2, q_heads = 8, n = 512;
    ringkv::default_kv_cache_store f32(shape(d, n, kv_heads));
    fill({&f32}, n, 47);
    const auto k0 = read_all(f32, true, 0, n), v0 = read_all(f32, false, 0, n);
    const float scale = 1.0f / std::sqrt(float(d));
    // Scores spread by about 1, 2 and 4 (softmax flat over the window to peaked on a few
    // keys), and queries that resemble one key (one-hot).
    std::mt19937 rng(53);
    std::vector<std::vector<float>> queries;
    for (float sigma : {1.0f, 2.0f, 4.0f})
      for (int i = 0; i < 4; ++i) queries.push_back(gaussian(rng, q_heads * d, sigma));
    for (int i = 0; i < 4; ++i) {
      std::vector<float> q = gaussian(rng, q_heads * d, 0.5f);
      for (std::size_t h = 0; h < q_heads; ++h)
        for (std::size_t j = 0; j < d; ++j)
          q[h * d + j] += 2.0f * k0[(h / 4 * n + (31 * h + 97 * i) % n) * d + j];
      queries.push_back(q);
    }
    for (const variant& v : variants) {
      auto s = v.make(shape(d, n, kv_heads), {});
      fill({s.get()}, n, 47);
      const auto kq = read_all(*s, true, 0, n), vq = read_all(*s, false, 0, n);
      double e_exact = 0;  // mean relative errors over the queries
      std::vector<decltype(reference(queries[0], k0, v0, kv_heads, d, scale))> wants, codebooks;
      for (const auto& q : queries) {
        wants.push_back(reference(q, k0, v0, kv_heads, d, scale));
        codebooks.push_back(reference(q, kq, vq, kv_heads, d, scale));
        const std::vector<float> rounded(codebooks.back().begin(), codebooks.back().end());
        e_exact += relative_error(rounded, wants.back());
      }
      e_exact /= double(queries.size());
      // every target: 3-bit keys are scored from pair tables where a byte permute reads 64 entries
      for_each_target([&](const char* target) {
        double e_kernel = 0, e_table = 0;
        for (std::size_t i = 0; i < queries.size(); ++i) {
          const auto got = attend(*s, queries[i], 0, n);
          e_kernel += relative_error(got, wants[i]);
          e_table += relative_error(got, codebooks[i]);
        }
        e_kernel /= double(queries.size());
        e_table /= double(queries.size());
        BOOST_TEST_MESSAGE("D " << d << ", " << v.name << ", " << target
                                << ": error vs f32, exact codebook " << e_exact << ", this kernel "
                                << e_kernel << " (x" << e_kernel / e_exact
                                << "); against the exact codebook " << e_table);
        BOOST_TEST_CONTEXT(v.name << ", D " << d << ", " << target) {
          BOOST_TEST(e_kernel <= 1.10 * e_exact);
        }
      });
    }
  }
}

BOOST_AUTO_TEST_CASE(error_against_the_f32_store_falls_as_bits_grow) {
  for (std::size_t d : {64u, 96u, 128u}) {
    const std::size_t kv_heads = 2, q_heads = 8, n = 256;
    ringkv::default_kv_cache_store f32(shape(d, n, kv_heads));
    fill({&f32}, n, 5);
    std::mt19937 rng(11);
    // A peaked query (it resembles some keys), as real attention is, and a flat random one.
    std::vector<float> q = gaussian(rng, q_heads * d, 0.5f);
    const auto k0 = read_all(f32, true, 0, n);
    for (std::size_t h = 0; h < q_heads; ++h)
      for (std::size_t i = 0; i < d; ++i) q[h * d + i] += 2.0f * k0[(h / 4 * n + 17 * h) * d + i];
    const auto want =
        reference(q, k0, read_all(f32, false, 0, n), kv_heads, d, 1.0f / std::sqrt(float(d)));
    double previous = INFINITY;
    for (const variant& v : variants) {
      auto s = v.make(shape(d, n, kv_heads), {});
      fill({s.get()}, n, 5);
      const double e = relative_error(attend(*s, q, 0, n), want);
      BOOST_TEST_MESSAGE("D " << d << ", " << v.name << ": relative error vs f32 " << e);
      if (std::string(v.name).find("QJL") == std::string::npos) {
        BOOST_TEST_CONTEXT(v.name << ", D " << d) { BOOST_TEST(e < previous); }
        previous = e;
      }
      BOOST_TEST(e < 0.5);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_wrapped_ring_gives_the_bits_of_a_never_wrapped_store) {
  // D 64 with two query heads a kv head; D 128 with one (3-bit V rows in 128-coordinate chunks)
  const std::size_t kv_heads = 2, capacity = 37;
  std::size_t compared = 0;
  for (const auto& [d, q_heads] : {std::pair<std::size_t, std::size_t>{64, 4}, {128, 2}})
    for (std::size_t keep : {0u, 3u})
      for (std::size_t wrap = 0; wrap < capacity - keep; wrap += 3)
        for (const variant& v : variants) {
          // Both see the same tokens; the ring wrapped twice and `wrap` more, the other never.
          const std::size_t tokens = 2 * capacity + wrap;
          const store_options ring_options{.sliding_window = true, .keep = keep};
          auto ring = v.make(shape(d, capacity, kv_heads), ring_options);
          auto flat = v.make(shape(d, tokens + 1, kv_heads), ring_options);
          fill({ring.get(), flat.get()}, tokens, 17);
          const std::size_t from = tokens - (capacity - keep);
          const compressed_window rk = ring->compressed_key_window(0, from, tokens),
                                  rv = ring->compressed_value_window(0, from, tokens),
                                  fk = flat->compressed_key_window(0, from, tokens),
                                  fv = flat->compressed_value_window(0, from, tokens);
          BOOST_TEST_CONTEXT(v.name << ", D " << d << ", keep " << keep << ", wrap " << wrap) {
            std::mt19937 rng(13);
            const auto q = gaussian(rng, q_heads * d);
            BOOST_TEST(store_test::positions_of(rk) == store_test::positions_of(fk),
                       boost::test_tools::per_element());
            BOOST_TEST(!fk.wrapped());
            if ((tokens - keep) % (capacity - keep) != 0) BOOST_TEST(rk.wrapped());
            std::vector<float> a(q.size()), b(q.size(), 1.0f);
            ringkv::compressed_kv_attention().decode_step(q, rk, rv, a);
            ringkv::compressed_kv_attention().decode_step(q, fk, fv, b);
            BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
            ++compared;
          }
        }
  BOOST_TEST(compared > 100u);
}

namespace {

/// What sixteen warm append + decode steps over a filled ring of head_dim d made, the
/// attention's sink `rec`: operator new calls and trace events, and whether the output is finite.
struct step_counts {
  std::uint64_t calls, events;
  bool finite;
};
step_counts sixteen_steps(compressed_kv_cache_store& s, std::size_t d, std::size_t kv_heads,
                          trace::recorder& rec) {
  fill({&s}, 150, 19);
  const ringkv::compressed_kv_attention attention({.sink = &rec});
  std::mt19937 rng(23);
  const auto q = gaussian(rng, 8 * d), k = gaussian(rng, kv_heads * d),
             v = gaussian(rng, kv_heads * d);
  std::vector<float> out(q.size());
  rec.clear();
  const ringkv_test::new_counter counter;
  for (int step = 0; step < 16; ++step) {
    const std::size_t p = s.append(0, k, v);
    const auto w = s.query_window(p);
    attention.decode_step(q, s.compressed_key_window(0, w.from, w.to),
                          s.compressed_value_window(0, w.from, w.to), out);
  }
  return {counter.calls(), rec.emitted(), std::isfinite(out[0])};
}

}  // namespace

BOOST_AUTO_TEST_CASE(sixteen_steps_over_a_wrapped_compressed_ring_allocate_and_copy_nothing) {
  // The store's sink wired too: its appends trace nothing once warm.
  trace::recorder rec(64);
  turboquant_kv_cache_store s(shape(128, 64, 2), {.key_bits = 4, .value_bits = 4, .qjl = true},
                              {.sliding_window = true, .keep = 4, .slack = 2}, rec);
  const step_counts made = sixteen_steps(s, 128, 2, rec);
  BOOST_TEST(made.calls == 0u);
  BOOST_TEST(made.events == 0u);
  BOOST_TEST(made.finite);
}

BOOST_AUTO_TEST_CASE(every_compressed_kind_steps_over_a_wrapped_ring_without_allocating) {
  // Each layout (2-, 3-, 4-bit groups and rows, QJL signs, int8 rows), with rows a whole number
  // of chunks (D 128) and not (D 96: tails copied into the scratch), the attention's trace
  // sink wired: no operator new and no trace event per step.
  // (kv 8: one query head a kv head, 3-bit V rows of D 128 in 128-coordinate chunks)
  for (std::size_t d : {96u, 128u})
    for (std::size_t kv : {2u, 8u})
      for (const variant& v : variants) {
        trace::recorder rec(64);
        auto s = v.make(shape(d, 64, kv), {.sliding_window = true, .keep = 4, .slack = 2});
        const step_counts made = sixteen_steps(*s, d, kv, rec);
        BOOST_TEST_CONTEXT(v.name << ", D " << d << ", kv " << kv) {
          BOOST_TEST(made.calls == 0u);
          BOOST_TEST(made.events == 0u);
          BOOST_TEST(made.finite);
        }
      }
}

BOOST_AUTO_TEST_CASE(a_pool_splits_a_step_by_query_heads_with_the_bits_of_one_thread) {
  // 2 threads take whole kv heads (kv 8, 2) or share one kv head's group (kv 1, 3 query heads
  // a kv head); 3 threads split groups unevenly. Every head's bits must be those of one call.
  ringkv::default_thread_pool two(2), three(3);
  std::size_t compared = 0;
  for (std::size_t d : {64u, 128u, 40u})
    for (std::size_t kv : {8u, 2u, 1u, 3u})
      for (const variant& v : variants) {
        const std::size_t q_heads = kv == 3 ? 9 : 8, n = 300;
        auto s = v.make(shape(d, n, kv), {.sliding_window = true});
        fill({s.get()}, n + 77, 31);
        std::mt19937 rng(37);
        const auto q = gaussian(rng, q_heads * d);
        const std::vector<float> sinks(q_heads, 0.25f);
        const std::size_t end = s->length(0), from = end - n;
        const auto k = s->compressed_key_window(0, from, end);
        const auto val = s->compressed_value_window(0, from, end);
        for_each_target([&](const char* target) {
          std::vector<float> one(q.size()), a(q.size(), 1.0f), b(q.size(), 2.0f);
          ringkv::compressed_kv_attention().decode_step(q, k, val, one, 0.0f, sinks);
          ringkv::compressed_kv_attention({.pool = &two}).decode_step(q, k, val, a, 0.0f, sinks);
          ringkv::compressed_kv_attention({.pool = &three}).decode_step(q, k, val, b, 0.0f, sinks);
          BOOST_TEST_CONTEXT(v.name << ", D " << d << ", kv " << kv << ", " << target) {
            BOOST_TEST(std::memcmp(one.data(), a.data(), a.size() * sizeof(float)) == 0);
            BOOST_TEST(std::memcmp(one.data(), b.data(), b.size() * sizeof(float)) == 0);
          }
          ++compared;
        });
      }
  BOOST_TEST(compared >= 60u);
}

BOOST_AUTO_TEST_CASE(pooled_steps_over_a_wrapped_compressed_ring_allocate_nothing) {
  ringkv::default_thread_pool pool(2);
  for (const variant& v : variants) {
    const kv_cache_config c = shape(128, 2048, 2);
    auto s = v.make(c, {.sliding_window = true, .keep = 4});
    fill({s.get()}, 3000, 41);
    const ringkv::compressed_kv_attention attention({.pool = &pool});
    std::mt19937 rng(43);
    const auto q = gaussian(rng, 8 * 128), k = gaussian(rng, 256), val = gaussian(rng, 256);
    std::vector<float> out(q.size());
    const auto step = [&] {
      const std::size_t p = s->append(0, k, val);
      const auto w = s->query_window(p);
      attention.decode_step(q, s->compressed_key_window(0, w.from, w.to),
                            s->compressed_value_window(0, w.from, w.to), out);
    };
    step();  // the pool's first call may set up what its workers keep
    const ringkv_test::new_counter counter;
    for (int i = 0; i < 8; ++i) step();
    const std::uint64_t calls = counter.calls();  // before the context's message allocates
    BOOST_TEST_CONTEXT(v.name) { BOOST_TEST(calls == 0u); }
    BOOST_TEST(std::isfinite(out[0]));
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused_and_out_is_untouched) {
  turboquant_kv_cache_store s(shape(16, 8, 2), {.key_bits = 3, .value_bits = 3, .qjl = true});
  ringkv::int8_kv_cache_store other(shape(8, 8, 2));
  fill({&s}, 6, 29);
  fill({&other}, 6, 29);
  const ringkv::compressed_kv_attention a;
  std::vector<float> q(4 * 16, 0.5f), out(4 * 16, 7.0f), small(4 * 16 - 1, 7.0f);
  const auto k = s.compressed_key_window(0, 0, 6), v = s.compressed_value_window(0, 0, 6);
  auto refused = [&](auto&& call, std::initializer_list<const char*> words) {
    BOOST_CHECK_EXCEPTION(call(), std::invalid_argument,
                          [&](const auto& e) { return mentions(e, words); });
    BOOST_TEST((out == std::vector<float>(4 * 16, 7.0f)));
    BOOST_TEST((small == std::vector<float>(4 * 16 - 1, 7.0f)));
  };
  refused(
      [&] {
        a.decode_step(q, s.compressed_key_window(0, 0, 0), s.compressed_value_window(0, 0, 0), out);
      },
      {"compressed_kv_attention", "empty"});
  refused([&] { a.decode_step(q, k, s.compressed_value_window(0, 1, 6), out); },
          {"same positions"});
  refused([&] { a.decode_step(q, k, other.compressed_value_window(0, 0, 6), out); },
          {"head_dim 8"});
  refused([&] { a.decode_step(q, v, k, out); }, {"QJL"});
  refused(
      [&] {
        a.decode_step(std::span(q).first(3 * std::size_t{16}), k, v,
                      std::span(out).first(3 * std::size_t{16}));
      },
      {"q_heads 3", "kv_heads 2"});
  refused([&] { a.decode_step(q, k, v, small); }, {"out has 63"});
  refused([&] { a.decode_step(q, k, v, out, -1.0f); }, {"scale -1.000000", "finite and >= 0"});
  refused([&] { a.decode_step(q, k, v, out, 0.0f, std::span(q).first(3)); }, {"sinks has 3"});
  turboquant_kv_cache_store wide(shape(512, 2, 1), {});
  fill({&wide}, 1, 1);
  std::vector<float> wq(512), wo(512, 7.0f);
  BOOST_CHECK_EXCEPTION(a.decode_step(wq, wide.compressed_key_window(0, 0, 1),
                                      wide.compressed_value_window(0, 0, 1), wo),
                        std::invalid_argument, [](const auto& e) {
                          return mentions(e, {"head_dim 512", "max_head_dim 256"});
                        });
  BOOST_TEST((wo == std::vector<float>(512, 7.0f)));
}

// A compressed store's windows are the one window type: windowed_attention attends them with the
// compressed kernel's bits (its pool too), the element kernels refuse them by name, and the
// compressed kernel refuses element rows; every refusal leaves out untouched.
BOOST_AUTO_TEST_CASE(code_windows_are_windowed_kv_attended_by_windowed_attention_too) {
  const store_options ring{.sliding_window = true};
  turboquant_kv_cache_store s(shape(16, 8, 2), {.key_bits = 3, .value_bits = 4, .qjl = true}, ring);
  ringkv::default_kv_cache_store plain(shape(16, 8, 2), ring);
  fill({&s, &plain}, 11, 41);  // wrapped rings
  const ringkv::windowed_kv k = *s.stored_window(ringkv::kv_side::keys, 0, 4, 11);
  const ringkv::windowed_kv v = *s.stored_window(ringkv::kv_side::values, 0, 4, 11);
  BOOST_TEST(k.compressed());
  BOOST_TEST((k.family() == ringkv::kernel_family::turboquant));
  BOOST_TEST(k.run_count() == 2u);
  std::mt19937 rng(3);
  const std::vector<float> q = gaussian(rng, 4 * 16);
  std::vector<float> want(q.size()), got(q.size(), 7.0f), pooled(q.size());
  ringkv::compressed_kv_attention().decode_step(q, k, v, want);
  ringkv::windowed_attention().decode_step(q, k, v, got);
  BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  ringkv::default_thread_pool pool(2);
  ringkv::windowed_attention(ringkv::attention_options{nullptr, &pool})
      .decode_step(q, k, v, pooled);
  BOOST_TEST(std::memcmp(pooled.data(), want.data(), got.size() * sizeof(float)) == 0);

  std::fill(got.begin(), got.end(), 7.0f);
  const ringkv::windowed_kv ek = plain.key_window(0, 4, 11), ev = plain.value_window(0, 4, 11);
  BOOST_CHECK_EXCEPTION(ringkv::kernels::decode(q, k, v, got), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"keys are turboquant codes"}); });
  BOOST_CHECK_EXCEPTION(
      ringkv::compressed_kv_attention().decode_step(q, ek, ev, got), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"keys are f32 and values f32", "reads codes"}); });
  BOOST_CHECK_EXCEPTION(ringkv::windowed_attention().decode_step(q, k, ev, got),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"values f32", "reads codes"}); });
  BOOST_TEST((got == std::vector<float>(q.size(), 7.0f)));
}
