#define BOOST_TEST_MODULE quant
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>

#include "count_new.hpp"

import ringkv;

#include "store_support.hpp"

namespace trace = ringkv::trace;
using ringkv::kv_cache_config;
using ringkv::kv_side;
using ringkv::store_options;
using ringkv::turboquant_kv_cache_store;
using ringkv::turboquant_options;
using store_test::mentions;

namespace {

kv_cache_config shape(std::size_t head_dim, std::size_t capacity, std::size_t heads = 1,
                      std::size_t layers = 1) {
  return {.layers = layers, .kv_heads = heads, .head_dim = head_dim, .capacity = capacity};
}

turboquant_options bits(unsigned b, bool qjl = false, std::uint64_t seed = 1) {
  return {.key_bits = b, .value_bits = b, .qjl = qjl, .seed = seed};
}

// A uniformly random unit vector (normalised Gaussian), in double then rounded.
std::vector<float> unit_vector(std::mt19937_64& rng, std::size_t d) {
  std::normal_distribution<double> normal;
  std::vector<double> x(d);
  double n = 0;
  for (double& v : x) {
    v = normal(rng);
    n += v * v;
  }
  std::vector<float> out(d);
  for (std::size_t i = 0; i < d; ++i) out[i] = float(x[i] / std::sqrt(n));
  return out;
}

double dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// One Lloyd step for the density ∝ (1 − x²)^((d − 3)/2), written plainly: composite Simpson's
// rule over each cell between midpoints, centroid = ∫x f / ∫f; and the quantizer's mean squared
// error for one coordinate, Σ ∫(x − c_i)² f / ∫f over the cells, from the same integrals.
struct lloyd {
  std::vector<double> next;  // the centroids one step on
  double mse = 0;            // of the centroids given
};
lloyd lloyd_step(const std::vector<float>& c, std::size_t d) {
  const double alpha = (double(d) - 3) / 2;
  auto f = [&](double x) { return std::pow(std::max(0.0, 1 - x * x), alpha); };
  lloyd out;
  double total = 0, error = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double a = i == 0 ? -1.0 : (double(c[i - 1]) + c[i]) / 2;
    const double b = i + 1 == c.size() ? 1.0 : (double(c[i]) + c[i + 1]) / 2;
    const int n = 20000;
    const double h = (b - a) / n;
    double m0 = 0, m1 = 0, m2 = 0;
    for (int k = 0; k <= n; ++k) {
      const double x = a + k * h, w = (k == 0 || k == n) ? 1 : (k % 2 ? 4 : 2);
      m0 += w * f(x);
      m1 += w * x * f(x);
      m2 += w * x * x * f(x);
    }
    out.next.push_back(m1 / m0);
    total += m0 * h;
    error += (m2 - 2 * c[i] * m1 + double(c[i]) * c[i] * m0) * h;
  }
  out.mse = error / total;
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(codebooks_are_symmetric_and_stationary_under_one_lloyd_iteration) {
  for (std::size_t d : {3u, 64u, 96u, 128u})
    for (unsigned b = 1; b <= 4; ++b) {
      BOOST_TEST_CONTEXT("dim " << d << ", bits " << b) {
        const ringkv::codebook& book = ringkv::lloyd_max_codebook(d, b);
        BOOST_TEST(&book == &ringkv::lloyd_max_codebook(d, b));  // cached
        BOOST_REQUIRE(book.centroids.size() == (1u << b));
        BOOST_TEST(book.boundaries.size() == (1u << b) - 1);
        for (std::size_t i = 0; i < book.centroids.size(); ++i) {
          BOOST_TEST(book.centroids[i] == -book.centroids[book.centroids.size() - 1 - i]);
          if (i > 0) BOOST_TEST(book.centroids[i] > book.centroids[i - 1]);
        }
        const lloyd step = lloyd_step(book.centroids, d);
        const std::vector<double>& next = step.next;
        BOOST_TEST_MESSAGE("dim " << d << ", bits " << b << ": coordinate MSE "
                                  << book.coordinate_mse << ", integrated here " << step.mse);
        // Both integrate the same smooth density (Simpson here, 20,000 steps a cell); the MSE is
        // stationary in the centroids, so their float rounding does not show: 1e-6 relative.
        BOOST_TEST(std::fabs(book.coordinate_mse - step.mse) <= 1e-6 * step.mse);
        double moved = 0;
        for (std::size_t i = 0; i < next.size(); ++i)
          moved = std::max(moved, std::fabs(next[i] - book.centroids[i]));
        // float centroids: a step moves them by no more than their rounding (~1e-7 relative).
        BOOST_TEST(moved * std::sqrt(double(d)) < 1e-6);
        BOOST_TEST(book.encode(book.centroids[0]) == 0u);
        BOOST_TEST(book.encode(book.centroids.back()) == book.centroids.size() - 1);
      }
    }
  BOOST_CHECK_EXCEPTION(ringkv::lloyd_max_codebook(64, 5), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"bits 5", "1..4"}); });
  BOOST_CHECK_EXCEPTION(ringkv::lloyd_max_codebook(0, 2), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"dim must be > 0"}); });
}

BOOST_AUTO_TEST_CASE(a_rotation_refuses_rows_of_another_size_and_a_dense_one_refuses_in_place) {
  const ringkv::random_rotation dense(6, 1), hadamard(8, 1);
  std::vector<float> in(8, 0.5f), out(8, 7.0f);
  const std::vector<float> out_before = out;
  BOOST_CHECK_EXCEPTION(
      dense.apply(std::span(in).first(5), std::span(out).first(6)), std::invalid_argument,
      [](const auto& e) {
        return mentions(e, {"random_rotation::apply:", "in has 5 floats and out 6", "dim = 6"});
      });
  BOOST_CHECK_EXCEPTION(
      hadamard.apply_inverse(in, std::span(out).first(7)), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"apply_inverse", "out 7", "dim = 8"}); });
  BOOST_CHECK_EXCEPTION(dense.apply(std::span(in).first(6), std::span(in).subspan(2, 6)),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"out overlaps in"}); });
  BOOST_TEST(out == out_before, boost::test_tools::per_element());
  BOOST_TEST(std::count(in.begin(), in.end(), 0.5f) == 8);
  // In place is the Hadamard transform's own use: allowed, and the same as out of place.
  std::vector<float> x{1, 2, 3, 4, 5, 6, 7, 8}, y(8);
  hadamard.apply(x, y);
  hadamard.apply(x, x);
  BOOST_TEST(x == y, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(rotations_are_orthogonal_and_their_inverse_is_exact) {
  std::mt19937_64 rng(3);
  for (std::size_t d : {64u, 96u, 7u}) {
    const ringkv::random_rotation r(d, 42);
    BOOST_TEST(r.hadamard() == (d == 64));
    BOOST_TEST(r.bytes() == (d == 64 ? d : d * d) * 4);
    const auto x = unit_vector(rng, d);
    std::vector<float> y(d), back(d);
    r.apply(x, y);
    r.apply_inverse(y, back);
    double err = 0;
    for (std::size_t i = 0; i < d; ++i) err = std::max(err, std::fabs(double(back[i]) - x[i]));
    BOOST_TEST_MESSAGE("rotation D " << d << ": |y·y − 1| " << std::fabs(dot(y, y) - 1.0)
                                     << ", round-trip error " << err);
    // f32 rounding only: entries rounded once and D-term f32 sums (D ≤ 96) on a unit vector,
    // ~√D·2^-24 ≈ 6e-7 at most in practice (observed ≤ 7e-8); a wrong entry costs ~1/√D.
    BOOST_TEST(std::fabs(dot(y, y) - 1.0) < 1e-5);
    BOOST_TEST(err < 1e-5);
    // Every coordinate moves: a partial rotation would leave some of e_last's zeros in place.
    std::vector<float> e(d, 0.0f);
    e[d - 1] = 1;
    r.apply(e, y);
    BOOST_TEST(std::count(y.begin(), y.end(), 0.0f) == 0);
  }
}

BOOST_AUTO_TEST_CASE(distortion_on_random_unit_vectors_is_within_the_papers_bound) {
  const double paper[] = {0, 0, 0.117, 0.030, 0.009};  // optimal quantizer, Zandieh et al. 2025
  const std::size_t n = 10000;
  for (std::size_t d : {64u, 96u, 128u}) {
    std::mt19937_64 rng(d);
    std::vector<float> all(n * d);
    for (std::size_t i = 0; i < n; ++i) {
      const auto u = unit_vector(rng, d);
      std::copy(u.begin(), u.end(), all.begin() + i * d);
    }
    for (unsigned b = 2; b <= 4; ++b) {
      turboquant_kv_cache_store s(shape(d, n), bits(b));
      for (std::size_t i = 0; i < n; ++i) {
        const std::span<const float> row(all.data() + i * d, d);
        s.append(0, row, row);
      }
      std::vector<float> back(n * d);
      s.read_keys(0, 0, n, back);
      double mse = 0;
      for (std::size_t i = 0; i < n * d; ++i) mse += std::pow(double(back[i]) - all[i], 2);
      mse /= double(n);
      const double bound = std::sqrt(3.0) * std::acos(-1.0) / 2 * std::pow(4.0, -double(b));
      const double predicted = double(d) * ringkv::lloyd_max_codebook(d, b).coordinate_mse;
      BOOST_TEST_MESSAGE("TurboQuant MSE, D "
                         << d << ", b " << b << ": " << mse << " (codebook predicts " << predicted
                         << ", paper optimum ~" << paper[b] << ", bound " << bound << ")");
      BOOST_TEST_CONTEXT("D " << d << " b " << b) {
        BOOST_TEST(mse <= bound);
        BOOST_TEST(std::fabs(mse - paper[b]) <= 0.2 * paper[b]);
        BOOST_TEST(std::fabs(mse - predicted) <= 0.05 * predicted);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(qjl_inner_products_are_unbiased_and_codebook_alone_is_not) {
  // Fixed q and k; the randomness is the store's seed (rotation and S), as in the paper.
  const std::size_t d = 64, trials = 3000;
  std::mt19937_64 rng(11);
  const auto k = unit_vector(rng, d);
  std::vector<float> q = unit_vector(rng, d);
  for (std::size_t i = 0; i < d; ++i) q[i] = 0.8f * k[i] + 0.6f * q[i];
  const double truth = dot(q, k);
  for (unsigned b = 2; b <= 4; ++b) {
    double sum[2] = {}, sum2[2] = {};
    std::vector<float> back(d);
    for (std::size_t t = 0; t < trials; ++t)
      for (int qjl = 0; qjl < 2; ++qjl) {
        // b − 1 codebook bits + 1 QJL bit against the same b − 1 codebook bits alone.
        if (!qjl && b == 2) continue;  // no 1-bit store without QJL
        turboquant_kv_cache_store s(
            shape(d, 1),
            {.key_bits = qjl ? b : b - 1, .value_bits = 2, .qjl = bool(qjl), .seed = 1000 + t});
        s.append(0, k, k);
        s.read_keys(0, 0, 1, back);
        const double e = dot(q, back) - truth;
        sum[qjl] += e;
        sum2[qjl] += e * e;
      }
    for (int qjl = 0; qjl < 2; ++qjl) {
      if (!qjl && b == 2) continue;
      const double mean = sum[qjl] / trials;
      const double se = std::sqrt((sum2[qjl] / trials - mean * mean) / trials);
      BOOST_TEST_MESSAGE("inner-product error, b "
                         << b << (qjl ? " with QJL" : " codebook only, b-1 bits") << ": mean "
                         << mean << ", standard error " << se << " (truth " << truth << ")");
      BOOST_TEST_CONTEXT("b " << b << " qjl " << qjl) {
        if (qjl)
          BOOST_TEST(std::fabs(mean) <= 3 * se);
        else
          BOOST_TEST(std::fabs(mean) > 3 * se);  // shows the check can fail: MSE codes shrink
      }
    }
  }
}

namespace {
store_options ring(std::size_t keep = 0, std::size_t slack = 0) {
  return {.sliding_window = true, .keep = keep, .slack = slack};
}
template <class R>
std::ptrdiff_t count(R&& r) {
  return ranges::distance(r);
}
std::vector<float> read(const ringkv::kv_cache_store& s, kv_side side, std::size_t l,
                        std::size_t from, std::size_t to) {
  std::vector<float> out(s.config().row_floats() * (to - from));
  side == kv_side::keys ? s.read_keys(l, from, to, out) : s.read_values(l, from, to, out);
  return out;
}
// Every row of a compressed window decoded, laid out as read_keys lays out its positions.
std::vector<float> decoded(const ringkv::compressed_window& w) {
  const std::size_t d = w.head_dim();
  std::vector<float> out(w.heads() * w.length() * d);
  std::size_t at = 0;
  for (std::size_t h = 0; h < w.heads(); ++h)
    for (std::size_t i = 0; i < w.run_count(); ++i)
      for (std::size_t p = 0; p < w.run_positions(i); ++p, at += d)
        w.decode(i, h, p, std::span(out).subspan(at, d));
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(turboquant_options_are_checked_before_anything_is_allocated) {
  for (auto [o, words] : {std::pair{bits(1), "key_bits 1"}, std::pair{bits(5), "key_bits 5"},
                          std::pair{turboquant_options{.value_bits = 1}, "value_bits 1"}}) {
    trace::recorder rec(8);
    BOOST_CHECK_EXCEPTION(turboquant_kv_cache_store(shape(8, 4), o, {}, rec), std::invalid_argument,
                          [&](const auto& e) { return mentions(e, {words, "2..4"}); });
    BOOST_TEST(rec.emitted() == 0u);
  }
  trace::recorder rec(8);
  BOOST_CHECK_EXCEPTION(
      ringkv::int8_kv_cache_store(shape(8, 4), ring(4), rec), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"int8_kv_cache_store", "keep 4"}); });
  BOOST_CHECK_EXCEPTION(
      turboquant_kv_cache_store(shape(8, 4), {}, {.slack = 1}, rec), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"turboquant_kv_cache_store", "slack 1"}); });
  BOOST_TEST(rec.emitted() == 0u);
}

BOOST_AUTO_TEST_CASE(the_memory_report_is_codes_norms_sketches_rotations_and_codebooks) {
  struct cse {
    std::size_t d;
    unsigned key_bits, value_bits;
    bool qjl;
  };
  for (const cse& c : {cse{64, 4, 4, true}, cse{96, 3, 2, false}, cse{128, 4, 4, false}}) {
    BOOST_TEST_CONTEXT("D " << c.d << " qjl " << c.qjl) {
      const std::size_t layers = 2, heads = 2, capacity = 4096, rows = heads * capacity;
      turboquant_kv_cache_store s(
          shape(c.d, capacity, heads, layers),
          {.key_bits = c.key_bits, .value_bits = c.value_bits, .qjl = c.qjl}, ring());
      const unsigned kb = c.key_bits - c.qjl;
      const bool pow2 = (c.d & (c.d - 1)) == 0;
      const std::size_t rotation = heads * (pow2 ? c.d : c.d * c.d) * 4;
      std::size_t keys = rows * ((c.d * kb + 7) / 8) + rows * 4 + rotation;
      if (c.qjl) keys += rows * (c.d / 8) + rows * 4 + heads * c.d * c.d * 4;
      // value codes keep 16 bytes after their last row (ringkv::codec::value_code_padding)
      const std::size_t values = rows * ((c.d * c.value_bits + 7) / 8) + 16 + rows * 4;
      const auto m = s.memory();
      BOOST_TEST(m.keys.physical_bytes == layers * keys + (4u << kb));
      BOOST_TEST(m.values.physical_bytes == layers * values + (4u << c.value_bits));
      BOOST_TEST(m.physical_bytes == m.keys.physical_bytes + m.values.physical_bytes);
      const double f32 = 2.0 * layers * rows * c.d * 4;
      BOOST_TEST(m.compression_ratio == f32 / double(m.physical_bytes));
      BOOST_TEST_MESSAGE("TurboQuant D " << c.d << " K" << c.key_bits << (c.qjl ? "+QJL" : "")
                                         << "/V" << c.value_bits
                                         << ", capacity 4096: " << m.physical_bytes
                                         << " bytes, ratio " << m.compression_ratio);
      BOOST_TEST(m.logical_bytes == 0u);
      store_test::rows r(s.config());
      r.append_all(s, 5);
      BOOST_TEST(s.memory().keys.logical_bytes == layers * 5 * heads * c.d * 4);
    }
  }
  ringkv::int8_kv_cache_store i8(shape(96, 100, 4, 3));
  const auto m = i8.memory();
  BOOST_TEST(m.keys.physical_bytes == 3u * (4 * 100 * 96 + 4 * 100 * 4));
  BOOST_TEST(m.physical_bytes == 2 * m.keys.physical_bytes);
  BOOST_TEST(m.compression_ratio == (2.0 * 3 * 4 * 100 * 96 * 4) / double(m.physical_bytes));
}

BOOST_AUTO_TEST_CASE(int8_rows_are_within_half_a_step_of_the_original) {
  ringkv::int8_kv_cache_store s(shape(37, 3, 2), ring());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(74), zero(74, 0.0f);
  double worst = 0;
  for (int t = 0; t < 50; ++t) {
    for (float& x : row) x = normal(rng);
    const std::size_t p = s.append(0, row, zero);
    const auto back = read(s, kv_side::keys, 0, p, p + 1);
    for (std::size_t h = 0; h < 2; ++h) {
      double absmax = 0;
      for (std::size_t i = 0; i < 37; ++i)
        absmax = std::max(absmax, std::fabs(double(row[h * 37 + i])));
      for (std::size_t i = 0; i < 37; ++i)
        worst =
            std::max(worst, std::fabs(double(back[h * 37 + i]) - row[h * 37 + i]) / (absmax / 127));
    }
    BOOST_TEST((read(s, kv_side::values, 0, p, p + 1) == zero));  // a zero row stays zero
  }
  BOOST_TEST_MESSAGE("int8: worst error " << worst << " steps (absmax/127)");
  // Half a step, plus f32 rounding of x / scale before nearbyint (≤ 2^-18 steps: |x / scale| <
  // 128) and of scale · code (≤ 127·2^-24 ≈ 7.6e-6 steps): ≤ 0.5 + 1.14e-5.
  BOOST_TEST(worst <= 0.5 + 1.2e-5);
  // A non-finite element is refused before anything is stored (README, "NaN and Inf"), as by
  // every slot store.
  for (std::size_t i = 0; i < 37; ++i) row[i] = i == 3 ? NAN : i == 4 ? INFINITY : 1.0f;
  const auto before = store_test::snap(s);
  BOOST_CHECK_EXCEPTION(s.append(0, row, zero), std::invalid_argument, [](const auto& e) {
    return mentions(e, {"int8_kv_cache_store::append", "key has a non-finite element", "at index 3",
                        "NaN and Inf are refused"});
  });
  BOOST_TEST((store_test::snap(s) == before));
}

BOOST_AUTO_TEST_CASE(compressed_windows_are_the_stores_runs_and_decode_as_reads_do) {
  const kv_cache_config c = shape(16, 6, 2, 2);
  trace::recorder rec(64);
  turboquant_kv_cache_store tq(c, bits(3, true), ring(2), rec);
  ringkv::int8_kv_cache_store i8(c, ring(2), rec);
  store_test::rows r(c);
  r.append_all(tq, 12);  // held 0, 1, [8, 12): slots 2..5 hold 10, 11, 8, 9
  r.append_all(i8, 12);
  ringkv::scope arena(1 << 16, rec);
  for (const ringkv::kv_cache_store* s : {static_cast<const ringkv::kv_cache_store*>(&tq),
                                          static_cast<const ringkv::kv_cache_store*>(&i8)})
    for (kv_side side : {kv_side::keys, kv_side::values}) {
      const bool keys = side == kv_side::keys;
      auto window = [&](std::size_t from, std::size_t to) {
        if (s == &tq)
          return keys ? tq.compressed_key_window(1, from, to)
                      : tq.compressed_value_window(1, from, to);
        return keys ? i8.compressed_key_window(1, from, to)
                    : i8.compressed_value_window(1, from, to);
      };
      const auto w = window(8, 12);
      BOOST_TEST(store_test::positions_of(w) == (std::vector<std::size_t>{0, 1, 8, 9, 10, 11}),
                 boost::test_tools::per_element());
      BOOST_TEST(w.code_runs().size() == 3u);
      BOOST_TEST(w.wrapped());
      BOOST_TEST(w.run_first_position(2) == 10u);
      BOOST_TEST(w.end_position() == 12u);
      // Row for row what read_keys/read_values give: sinks, then [8, 12).
      std::vector<float> expected;
      const auto sinks = read(*s, side, 1, 0, 2), rolling = read(*s, side, 1, 8, 12);
      for (std::size_t h = 0; h < 2; ++h) {
        expected.insert(expected.end(), sinks.begin() + h * 32, sinks.begin() + (h + 1) * 32);
        expected.insert(expected.end(), rolling.begin() + h * 64, rolling.begin() + (h + 1) * 64);
      }
      BOOST_TEST((decoded(w) == expected));
      // The defaulted scope window dequantizes once and says so.
      rec.clear();
      const auto copy = keys ? s->key_window(1, 8, 12, arena) : s->value_window(1, 8, 12, arena);
      BOOST_TEST(store_test::positions_of(copy) == store_test::positions_of(w),
                 boost::test_tools::per_element());
      auto adapters = rec.of<trace::adapter_inserted>();
      BOOST_REQUIRE(count(adapters) == 1);
      BOOST_TEST((*ranges::begin(adapters)).kind == "dequantize-kv-window");
      BOOST_TEST((*ranges::begin(adapters)).target == (keys ? "keys" : "values"));
      BOOST_TEST((*ranges::begin(adapters)).bytes == 6u * 2u * 16u * 4u);
      const char* const who = keys ? "compressed_key_window" : "compressed_value_window";
      BOOST_CHECK_EXCEPTION(window(7, 12), std::out_of_range, [&](const auto& e) {
        return mentions(e, {who, "from 7", "7 < window_start", "window_start 8"});
      });
      BOOST_CHECK_EXCEPTION(window(0, 13), std::out_of_range, [&](const auto& e) {
        return mentions(e, {who, "to 13", "to > length", "length 12"});
      });
      arena.reset();
    }
  BOOST_CHECK_EXCEPTION(tq.compressed_key_window(2, 0, 1), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"layer 2", "layers 2"}); });
  const auto w = tq.compressed_key_window(0, 9, 12);
  std::vector<float> row(15);
  BOOST_CHECK_EXCEPTION(w.decode(0, 0, 0, row), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"out of 15", "head_dim 16"}); });
  BOOST_REQUIRE(w.code_runs().size() ==
                3u);  // pins 0, 1; then 9 and 10, 11 in two runs of the ring
  BOOST_CHECK_EXCEPTION(
      w.decode(3, 0, 0, std::span(row.data(), 1)), std::out_of_range,
      [](const auto& e) { return mentions(e, {"run 3 of 3", "out of 1 floats"}); });
}

BOOST_AUTO_TEST_CASE(refused_appends_change_nothing) {
  turboquant_kv_cache_store s(shape(8, 4, 2, 2), bits(2, true), ring(1));
  store_test::rows r(s.config());
  r.append_all(s, 6);
  const auto before = store_test::snap(s);
  std::vector<float> short_row(15);
  BOOST_CHECK_EXCEPTION(s.append(0, short_row, r.value), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"key has 15", "= 16"}); });
  BOOST_CHECK_EXCEPTION(s.append(2, r.key, r.value), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"layer 2", "layers 2"}); });
  ringkv::int8_kv_cache_store dense(shape(8, 2));
  store_test::rows one(dense.config());
  one.append_all(dense, 2);
  BOOST_CHECK_EXCEPTION(one.append(dense, 0), ringkv::cache_full, [](const auto& e) {
    return mentions(e, {"int8_kv_cache_store", "capacity 2"});
  });
  BOOST_TEST(dense.length(0) == 2u);
  BOOST_TEST((store_test::snap(s) == before));
}

BOOST_AUTO_TEST_CASE(appends_windows_and_reads_on_wrapped_compressed_rings_allocate_nothing) {
  for (std::size_t d : {8u, 6u}) {
    trace::recorder rec(256);
    const kv_cache_config c = shape(d, 16, 4, 2);
    turboquant_kv_cache_store tq(c, bits(4, true), ring(2, 2), rec);
    ringkv::int8_kv_cache_store i8(c, ring(2, 2), rec);
    store_test::rows r(c);
    r.append_all(tq, 20);
    r.append_all(i8, 20);
    std::vector<float> out(16 * 4 * d), row(d);
    rec.clear();
    double sum = 0;
    ringkv_test::new_counter counter;
    for (int i = 0; i < 500; ++i)
      for (std::size_t l = 0; l < 2; ++l) {
        const std::size_t p = r.append(tq, l);
        BOOST_REQUIRE(r.append(i8, l) == p);
        const auto q = tq.query_window(p);
        for (const auto& w : {tq.compressed_key_window(l, q.from, q.to),
                              tq.compressed_value_window(l, q.from, q.to),
                              i8.compressed_key_window(l, q.from, q.to),
                              i8.compressed_value_window(l, q.from, q.to)}) {
          w.decode(0, 1, 0, row);
          sum += row[0];
        }
        tq.read_keys(l, q.from, q.to, std::span(out).first(q.size() * 4 * d));
        i8.read_values(l, q.from, q.to, std::span(out).first(q.size() * 4 * d));
        sum += out[0];
      }
    const auto calls = counter.calls();
    BOOST_TEST_MESSAGE("head_dim " << d
                                   << ": operator new calls over 2 x 1000 appends, 4000 "
                                      "compressed windows, 2000 reads: "
                                   << calls << "; trace events: " << rec.emitted());
    BOOST_TEST(calls == 0u);
    BOOST_TEST(count(rec.of<trace::allocation>()) == 0);
    BOOST_TEST(rec.emitted() == 0u);
    BOOST_TEST(std::isfinite(sum));
  }
}
