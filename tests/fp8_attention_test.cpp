#define BOOST_TEST_MODULE fp8_attention
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "hwy_targets.hpp"

import ringkv;

#include "element_reference.hpp"

using namespace element_reference;
using ringkv::windowed_attention;
using ringkv::windowed_kv;
using ringkv_test::for_each_target;

namespace {

// ---- the test's own fp8 E4M3FN: value arithmetic (frexp, ldexp, nearbyint), no bit tricks ---

/// x rounded to E4M3FN: 4 significant bits, a quantum of at least 2^-9 (subnormals), ties to
/// even (nearbyint's default mode); magnitudes up to 464 (past it a store refuses them).
double rounded(float x) {
  if (x == 0) return x;
  int e = 0;
  std::frexp(double(x), &e);  // |x| = m · 2^e, m in [0.5, 1)
  const int quantum = std::max(e - 4, -9);
  return std::nearbyint(std::ldexp(double(x), -quantum)) * std::ldexp(1.0, quantum);
}

/// The byte of an E4M3FN value r (from rounded()): sign, 4 exponent bits biased by 7, 3 more.
std::uint8_t bits_of(double r) {
  const std::uint8_t sign = std::signbit(r) ? 0x80 : 0;
  const double a = std::abs(r);
  if (a < 0x1p-6) return sign | std::uint8_t(a * 0x1p9);  // subnormal: counts of 2^-9
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m · 2^e: exponent field e − 1 + 7, 3 more bits
  return sign | std::uint8_t((e - 1 + 7) << 3) | std::uint8_t((2 * m - 1) * 8);
}

/// The value of E4M3FN byte b (0x7f and 0xff, NaN, excluded by the callers).
double value_of(std::uint8_t b) {
  const int e = (b >> 3) & 0xf, m = b & 7;
  const double a = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1 + m / 8.0, e - 7);
  return b & 0x80 ? -a : a;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_format_table_describes_fp8_e4m3) {
  const ringkv::format_traits t = ringkv::traits_of(dtype::fp8_e4m3);
  BOOST_TEST(t.name == "fp8_e4m3");
  BOOST_TEST(t.element_bytes == 1u);
  BOOST_TEST((t.family == ringkv::kernel_family::elements));
  BOOST_TEST(!t.scale_plane);
  BOOST_TEST(t.unstorable == std::nextafter(464.0f, 1000.0f));
  // Every element type has its own snapshot tag.
  for (const dtype a : ringkv::all_dtypes)
    for (const dtype b : ringkv::all_dtypes)
      BOOST_TEST((a == b) ==
                 (ringkv::traits_of(a).snapshot_tag == ringkv::traits_of(b).snapshot_tag));
}

BOOST_AUTO_TEST_CASE(an_fp8_store_holds_each_f32_input_rounded_once_to_nearest_even) {
  // Ties at 1 (down and up to even), the largest finite 448 and inputs rounding to it (the tie
  // 464 goes down to even), the smallest normal 2^-6, subnormals and their ties, values below
  // half the smallest subnormal, negatives; then inputs over 24 binades. The raw byte (through the
  // zero-copy window, after the ring wrapped) equals the test's own rounding, read_keys returns
  // its value.
  std::vector<float> probes = {
      0.0f,    -0.0f,   1.0f,        1.0625f, 1.1875f,  -1.0625f,  448.0f,   456.0f, 464.0f,
      -463.9f, 0x1p-6f, 0x1.fp-7f,   0x1p-9f, 0x1p-10f, 0x3p-10f,  0x1p-11f, 1e-10f, -0x5p-10f,
      0.1f,    -0.3f,   3.14159265f, 240.0f,  -17.0f,   0x1.1p-5f, 7.5f};
  for (std::size_t n = 0; probes.size() < 200; ++n)
    probes.push_back(std::ldexp(input(value_stream, n, 0, 0), int(n % 24) - 15));
  constexpr std::size_t kv = 2, dim = 20, capacity = 7;
  auto store = make_store(dtype::fp8_e4m3, kv, dim, capacity, true);
  std::vector<float> k(kv * dim), v(k.size());
  const auto key_at = [&](std::size_t p, std::size_t e) {
    return probes[(p * k.size() + e) % 200];
  };
  constexpr std::size_t length = 3 * capacity + 2;
  for (std::size_t p = 0; p < length; ++p) {
    for (std::size_t e = 0; e < k.size(); ++e) k[e] = key_at(p, e);
    store.append(0, k, v);
  }
  const std::size_t from = length - capacity;
  const windowed_kv w = store.key_window(0, from, length);
  BOOST_REQUIRE(w.wrapped());
  std::vector<float> back(kv * capacity * dim);
  store.read_keys(0, from, length, back);
  std::size_t p = from, checked = 0;
  for (std::size_t r = 0; r < w.run_count(); ++r)
    for (std::size_t j = 0; j < w.run_positions(r); ++j, ++p)
      for (std::size_t h = 0; h < kv; ++h)
        for (std::size_t i = 0; i < dim; ++i, ++checked) {
          const float x = key_at(p, h * dim + i);
          const double want = rounded(x);
          const auto stored = std::to_integer<std::uint8_t>(w.runs()[r].row_bytes(h, j)[i]);
          BOOST_TEST(stored == bits_of(want), "input " << x << " position " << p);
          BOOST_TEST(double(back[(h * capacity + (p - from)) * dim + i]) == want, "input " << x);
        }
  BOOST_TEST(checked == kv * capacity * dim);
}

BOOST_AUTO_TEST_CASE(every_fp8_value_reaches_every_target_exactly) {
  // All 252 finite non-zero codes and ±0: a window of one position returns its value row exactly
  // (weight 1), so each target's loader is checked against the test's own decoding.
  constexpr std::size_t dim = 19;  // whole vectors and a tail on every target
  std::vector<float> values;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) values.push_back(float(value_of(std::uint8_t(b))));
  const std::size_t positions = (values.size() + dim - 1) / dim;
  auto store = make_store(dtype::fp8_e4m3, 1, dim, positions, false);
  std::vector<float> k(dim), v(dim), out(2 * dim);
  const auto query = make_query(2, dim, 5);
  for (std::size_t p = 0; p < positions; ++p) {
    for (std::size_t i = 0; i < dim; ++i) v[i] = values[(p * dim + i) % values.size()];
    store.append(0, k, v);
    for_each_target([&](const char* target) {
      windowed_attention().decode_step(query, store.key_window(0, p, p + 1),
                                       store.value_window(0, p, p + 1), out);
      for (std::size_t e = 0; e < out.size(); ++e)
        // The accumulator starts at +0, and +0 + 1 · (−0) is +0: zeros compare by value.
        BOOST_TEST(
            (std::bit_cast<std::uint32_t>(out[e]) == std::bit_cast<std::uint32_t>(v[e % dim]) ||
             (out[e] == 0 && v[e % dim] == 0)),
            target << " position " << p << ": " << out[e] << " for " << v[e % dim]);
    });
  }
}

BOOST_AUTO_TEST_CASE(fp8_decode_matches_a_double_reference_on_the_rounded_rows_on_every_target) {
  for (const std::size_t kv : {2, 8})
    for (const std::size_t dim : {64, 128}) {
      auto store = make_store(dtype::fp8_e4m3, kv, dim, 320, true);
      fill_until(store, 1000);  // wrapped
      const auto query = make_query(8, dim, 7);
      std::vector<float> out(query.size());
      for (const std::size_t w : {1, 17, 300}) {
        const reference ref =
            attend_double(query, kv, dim, 1000 - w, 1000,
                          [](stream s, std::size_t p, std::size_t h, std::size_t i) {
                            return rounded(input(s, p, h, i));
                          });
        for_each_target([&](const char* target) {
          windowed_attention().decode_step(query, store.key_window(0, 1000 - w, 1000),
                                           store.value_window(0, 1000 - w, 1000), out);
          BOOST_TEST(relative_error(out, ref) <= f32_class,
                     target << " kv " << kv << " D " << dim << " W " << w);
        });
      }
    }
}

BOOST_AUTO_TEST_CASE(an_fp8_ring_gives_the_bits_of_a_dense_store_and_its_prefill_those_of_decode) {
  // A ring of 37 after several laps against a dense store of every position, W 30, every wrap
  // point; and prefill in chunks of 13 against the decode stream, on 1 and 2 threads.
  constexpr std::size_t kv = 2, dim = 44, end = 150;
  auto ring = make_store(dtype::fp8_e4m3, kv, dim, 37, true);
  auto dense = make_store(dtype::fp8_e4m3, kv, dim, end, false);
  const auto query = make_query(8, dim, 7);
  std::vector<float> a(query.size()), b(query.size());
  for (std::size_t p = 31; p <= end; ++p) {
    fill_until(ring, p);
    fill_until(dense, p);
    windowed_attention().decode_step(query, ring.key_window(0, p - 30, p),
                                     ring.value_window(0, p - 30, p), a);
    windowed_attention().decode_step(query, dense.key_window(0, p - 30, p),
                                     dense.value_window(0, p - 30, p), b);
    BOOST_TEST(same_bits(a, b), "end " << p);
  }
  std::vector<float> q(end * query.size()), k(end * kv * dim), v(k.size());
  for (std::size_t e = 0; e < q.size(); ++e) q[e] = input(query_stream, e / 352, 0, e % 352);
  for (std::size_t e = 0; e < k.size(); ++e) {
    k[e] = 8.0f * input(key_stream, e / 88, 1, e % 88);
    v[e] = input(value_stream, e / 88, 1, e % 88);
  }
  std::vector<ringkv::token_qkv> tokens;
  for (std::size_t t = 0; t < end; ++t)
    tokens.push_back({std::span(q).subspan(t * 352, 352), std::span(k).subspan(t * 88, 88),
                      std::span(v).subspan(t * 88, 88)});
  auto streamed = make_store(dtype::fp8_e4m3, kv, dim, 37, true);
  std::vector<float> want;
  for (std::span<const float> row : ringkv::decode(streamed, 0, tokens))
    want.insert(want.end(), row.begin(), row.end());
  for (const std::size_t threads : {1, 2}) {
    ringkv::default_thread_pool pool(threads);
    auto prefilled = make_store(dtype::fp8_e4m3, kv, dim, 37, true);
    ringkv::layer_attention layer(prefilled, 0, {.pool = &pool});
    std::vector<float> got(want.size());
    for (std::size_t t = 0; t < end; t += 13) {
      const std::size_t n = std::min<std::size_t>(13, end - t);
      layer.prefill(std::span(q).subspan(t * 352, n * 352), std::span(k).subspan(t * 88, n * 88),
                    std::span(v).subspan(t * 88, n * 88), std::span(got).subspan(t * 352, n * 352));
    }
    BOOST_TEST(same_bits(got, want), threads << " threads");
  }
}

BOOST_AUTO_TEST_CASE(an_fp8_store_refuses_an_input_past_464_and_holds_464_as_448) {
  auto store = make_store(dtype::fp8_e4m3, 1, 8, 4, true);
  fill_until(store, 6);
  std::vector<float> k(8, 1.0f), v(8, 1.0f), before(4 * 8), after(4 * 8);
  store.read_keys(0, 2, 6, before);
  k[3] = std::nextafter(464.0f, 1000.0f);
  BOOST_CHECK_EXCEPTION(store.append(0, k, v), std::invalid_argument, [](const auto& e) {
    const std::string m = e.what();
    return m.find("append: key[3] = 464.000031 is too large for fp8_e4m3 (largest finite 448") !=
           std::string::npos;
  });
  k[3] = 1.0f;
  v[0] = -500.0f;
  BOOST_CHECK_THROW(store.append(0, k, v), std::invalid_argument);
  BOOST_TEST(store.length(0) == 6u);
  store.read_keys(0, 2, 6, after);
  BOOST_TEST(after == before, boost::test_tools::per_element());
  k[3] = 464.0f;
  v[0] = -464.0f;
  store.append(0, k, v);
  std::vector<float> key(8), value(8);
  store.read_keys(0, 6, 7, key);
  store.read_values(0, 6, 7, value);
  BOOST_TEST(key[3] == 448.0f);
  BOOST_TEST(value[0] == -448.0f);
}

BOOST_AUTO_TEST_CASE(fp8s_output_error_against_f32_inputs_sits_beside_f16_bf16_and_int8) {
  // The attention output of each cache format against the double reference on the original f32
  // inputs (8 query heads over 2 kv heads, D 128, W 1024, a wrapped ring): what storing the rows
  // costs. fp8 keeps 4 significant bits (unit roundoff u = 2^-4): the half suite's bound,
  // ((1 + u)·e^(2δ) − 1) · Σ p|v| with δ the largest score change, plus its subnormals' quantum.
  constexpr std::size_t kv = 2, dim = 128, w = 1024, end = w + 300;
  const auto query = make_query(8, dim, 7);
  const reference exact = attend_double(query, kv, dim, end - w, end,
                                        [](stream s, std::size_t p, std::size_t h, std::size_t i) {
                                          return double(input(s, p, h, i));
                                        });
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = kv, .head_dim = dim, .capacity = w};
  const auto error_of = [&](ringkv::kv_cache_store& store) {
    fill_until(store, end);
    std::vector<float> out(query.size());
    ringkv::windowed_attention().decode_step(
        query, *store.stored_window(ringkv::kv_side::keys, 0, end - w, end),
        *store.stored_window(ringkv::kv_side::values, 0, end - w, end), out);
    return relative_error(out, exact);
  };
  std::vector<std::pair<std::string, double>> errors;
  for (const dtype t : ringkv::all_dtypes) {
    auto store = make_store(t, kv, dim, w, true);
    errors.emplace_back(std::string(ringkv::name_of(t)), error_of(store));
  }
  ringkv::int8_kv_cache_store int8(c, {.sliding_window = true});
  errors.emplace_back("int8", error_of(int8));
  ringkv::turboquant_kv_cache_store tq4(c, {}, {.sliding_window = true});
  errors.emplace_back("turboquant 4-bit", error_of(tq4));
  for (const auto& [name, e] : errors)
    BOOST_TEST_MESSAGE("max relative output error against the f32 inputs, " << name << ": " << e);
  const auto error = [&](const char* name) {
    return std::find_if(errors.begin(), errors.end(),
                        [&](const auto& x) { return x.first == name; })
        ->second;
  };
  BOOST_TEST(error("f32") <= f32_class);
  BOOST_TEST(error("f16") < error("bf16"));
  BOOST_TEST(error("bf16") < error("fp8_e4m3"));
  // δ: the largest change of a scaled score when the keys are rounded to fp8.
  double delta = 0;
  for (std::size_t h = 0; h < 8; ++h)
    for (std::size_t p = end - w; p < end; ++p) {
      double d = 0;
      for (std::size_t i = 0; i < dim; ++i)
        d += double(query[h * dim + i]) *
             (rounded(input(key_stream, p, h / 4, i)) - input(key_stream, p, h / 4, i));
      delta = std::max(delta, std::abs(d) / std::sqrt(double(dim)));
    }
  // Each value moves by at most u·|v|, or by 2^-10 (half the subnormal quantum) below 2^-6.
  const double u = 0x1p-4;
  const double least = *std::min_element(exact.magnitude.begin(), exact.magnitude.end());
  const double bound =
      (1 + u) * std::exp(2 * delta) - 1 + std::exp(2 * delta) * 0x1p-10 / least + f32_class;
  BOOST_TEST_MESSAGE("fp8 bound " << bound << " (largest score change " << delta << ")");
  BOOST_TEST(error("fp8_e4m3") <= bound);
}
