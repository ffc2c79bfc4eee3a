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
  for (double& v : x) n += (v = normal(rng)) * v;
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
// rule over each cell between midpoints, centroid = ∫x f / ∫f.
std::vector<double> lloyd_step(const std::vector<float>& c, std::size_t d) {
  const double alpha = (double(d) - 3) / 2;
  auto f = [&](double x) { return std::pow(std::max(0.0, 1 - x * x), alpha); };
  std::vector<double> next;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double a = i == 0 ? -1.0 : (double(c[i - 1]) + c[i]) / 2;
    const double b = i + 1 == c.size() ? 1.0 : (double(c[i]) + c[i + 1]) / 2;
    const int n = 20000;
    const double h = (b - a) / n;
    double m0 = 0, m1 = 0;
    for (int k = 0; k <= n; ++k) {
      const double x = a + k * h, w = (k == 0 || k == n) ? 1 : (k % 2 ? 4 : 2);
      m0 += w * f(x);
      m1 += w * x * f(x);
    }
    next.push_back(m1 / m0);
  }
  return next;
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
        const std::vector<double> next = lloyd_step(book.centroids, d);
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
  BOOST_CHECK_THROW(ringkv::lloyd_max_codebook(0, 2), std::invalid_argument);
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
      BOOST_TEST_MESSAGE("TurboQuant MSE, D " << d << ", b " << b << ": " << mse
                                              << " (codebook predicts " << predicted
                                              << ", paper optimum ~" << paper[b] << ", bound "
                                              << bound << ")");
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
        turboquant_kv_cache_store s(shape(d, 1), {.key_bits = qjl ? b : b - 1, .value_bits = 2,
                                                  .qjl = bool(qjl), .seed = 1000 + t});
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
      BOOST_TEST_MESSAGE("inner-product error, b " << b << (qjl ? " with QJL" : " codebook only, b-1 bits")
                                                   << ": mean " << mean << ", standard error " << se
                                                   << " (truth " << truth << ")");
      BOOST_TEST_CONTEXT("b " << b << " qjl " << qjl) {
        if (qjl)
          BOOST_TEST(std::fabs(mean) <= 3 * se);
        else
          BOOST_TEST(std::fabs(mean) > 3 * se);  // shows the check can fail: MSE codes shrink
      }
    }
  }
}
