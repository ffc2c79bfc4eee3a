#define BOOST_TEST_MODULE kernels
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hwy_targets.hpp"
#include "pseudo_random.hpp"

import ringkv;

namespace kernels = ringkv::kernels;
using ringkv_test::for_each_target;
using ringkv_test::pseudo_random;

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();

std::vector<float> filled(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pseudo_random(seed * 1000003 + i);
  return v;
}

/// A partial state held in vectors, viewed as a kernels::softmax_state.
struct owned_state {
  std::vector<float> max, sum, acc;
  owned_state(std::size_t heads, std::size_t dim) : max(heads), sum(heads), acc(heads * dim) {}
  kernels::softmax_state view() { return {max, sum, acc}; }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class E>
bool mentions(const E& e, const char* word) {
  return std::string(e.what()).find(word) != std::string::npos;
}
}  // namespace

BOOST_AUTO_TEST_CASE(dot_matches_a_double_reference_for_every_length_and_target) {
  for_each_target([](const char* target) {
    BOOST_TEST_CONTEXT("target " << target) {
      BOOST_TEST(kernels::target_name() == target);
      for (std::size_t n = 0; n <= 70; ++n) {
        const auto a = filled(n, 1), b = filled(n, 2);
        double ref = 0, magnitude = 0;
        for (std::size_t i = 0; i < n; ++i) {
          ref += double(a[i]) * double(b[i]);
          magnitude += std::abs(double(a[i]) * double(b[i]));
        }
        const float got = kernels::dot(a, b);
        // Two FMA chains per lane (≤ ⌈70 / 8⌉ = 9 steps at 4 lanes), then 1 + log2(lanes) adds:
        // ≤ 12 roundings of ≤ 2^-24 · Σ|a·b| each, 7.2e-7 · magnitude at most.
        BOOST_TEST(std::abs(got - ref) <= 1e-6 * (magnitude + 1e-30), "n " << n);
      }
    }
  });
}

// all_finite is a Highway kernel (every vector, then a scalar tail): a NaN or an Inf must be
// found at any index of any length, on every target, and the largest finite floats, subnormals
// and zeros must pass.
BOOST_AUTO_TEST_CASE(a_nan_or_an_inf_is_found_at_every_index_of_every_length_on_every_target) {
  const float finite[] = {std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          -0.0f,
                          0.0f,
                          1.0f};
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf};
  for_each_target([&](const char* target) {
    for (std::size_t n = 1; n <= 70; ++n) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = finite[i % std::size(finite)];
      BOOST_TEST(ringkv::all_finite(v), target << " n " << n);
      BOOST_CHECK_NO_THROW(ringkv::require_finite("test", "v", v));
      for (std::size_t at = 0; at < n; ++at)
        for (const float b : bad) {
          const float kept = std::exchange(v[at], b);
          BOOST_TEST(!ringkv::all_finite(v), target << " n " << n << " at " << at);
          const std::string where = "at index " + std::to_string(at);
          BOOST_CHECK_EXCEPTION(ringkv::require_finite("test", "v", v), std::invalid_argument,
                                [&](const auto& e) { return mentions(e, where.c_str()); });
          v[at] = kept;
        }
    }
  });
}

// all_storable is a Highway kernel too: a magnitude at a format's limit (either sign) must be
// found at any index of any length on every target, and the largest float below it must pass.
BOOST_AUTO_TEST_CASE(a_value_past_a_formats_limit_is_found_at_every_index_of_every_length) {
  using ringkv::dtype;
  for_each_target([&](const char* target) {
    for (const dtype type : {dtype::f16, dtype::bf16, dtype::fp8_e4m3}) {
      const float limit = ringkv::traits_of(type).unstorable;
      const float below = std::nextafter(limit, 0.0f);
      for (std::size_t n = 1; n <= 40; ++n) {
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = i % 2 == 0 ? below : -below;
        BOOST_TEST(ringkv::all_storable(v, type), target << " n " << n);
        BOOST_TEST(ringkv::all_storable(v, dtype::f32), target << " n " << n);
        for (std::size_t at = 0; at < n; ++at)
          for (const float bad : {limit, -limit}) {
            const float kept = std::exchange(v[at], bad);
            BOOST_TEST(!ringkv::all_storable(v, type), target << " n " << n << " at " << at);
            const std::string where = "v[" + std::to_string(at) + "]";
            BOOST_CHECK_EXCEPTION(ringkv::require_storable("test", "v", v, type),
                                  std::invalid_argument,
                                  [&](const auto& e) { return mentions(e, where.c_str()); });
            v[at] = kept;
          }
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(dot_refuses_spans_of_different_sizes) {
  const auto a = filled(4, 1), b = filled(5, 2);
  BOOST_CHECK_EXCEPTION(kernels::dot(a, b), std::invalid_argument, [](const auto& e) {
    return mentions(e, "a has 4") && mentions(e, "b has 5");
  });
}

BOOST_AUTO_TEST_CASE(clear_makes_an_empty_state) {
  owned_state s(3, 5);
  s.max.assign(3, 1.0f);
  s.sum.assign(3, 2.0f);
  s.acc.assign(15, 3.0f);
  kernels::clear(s.view());
  for (float m : s.max) BOOST_TEST(m == -inf);
  for (float x : s.sum) BOOST_TEST(x == 0.0f);
  for (float x : s.acc) BOOST_TEST(x == 0.0f);
}

BOOST_AUTO_TEST_CASE(merge_is_the_natural_log_sum_exp_of_two_states) {
  constexpr std::size_t heads = 2, dim = 19;  // 19: a partial last vector on every target
  for_each_target([&](const char* target) {
    BOOST_TEST_CONTEXT("target " << target) {
      owned_state a(heads, dim), b(heads, dim);
      a.max = {1.5f, -3.0f};
      a.sum = {2.0f, 0.5f};
      a.acc = filled(heads * dim, 3);
      b.max = {0.25f, 4.0f};
      b.sum = {1.0f, 3.0f};
      b.acc = filled(heads * dim, 4);
      const owned_state a0 = a;
      kernels::merge(a.view(), b.view());
      for (std::size_t h = 0; h < heads; ++h) {
        const double m = std::max(a0.max[h], b.max[h]);
        const double ea = std::exp(double(a0.max[h]) - m), eb = std::exp(double(b.max[h]) - m);
        BOOST_TEST(a.max[h] == float(m));
        // Positive terms, each within 2^-23 (Highway's Exp: 1 ulp) + 2^-24 (its product), the
        // sum rounded once more: ≤ 2^-22 ≈ 2.4e-7 of the sum.
        BOOST_TEST(std::abs(a.sum[h] - (a0.sum[h] * ea + b.sum[h] * eb)) <= 1e-6 * a.sum[h]);
        for (std::size_t i = 0; i < dim; ++i) {
          const double ref = a0.acc[h * dim + i] * ea + b.acc[h * dim + i] * eb;
          // |acc| < 1, weights ≤ 1 within 1 ulp: 2·2^-23, + 2^-24 (b·sb) + 2^-23 (the FMA on a
          // result < 2) ≈ 4.2e-7 absolute.
          BOOST_TEST(std::abs(a.acc[h * dim + i] - ref) <= 1e-6, "head " << h << " i " << i);
        }
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(merging_an_empty_state_changes_nothing_bit_for_bit) {
  constexpr std::size_t heads = 3, dim = 7;
  owned_state full(heads, dim), empty(heads, dim);
  full.max = {0.5f, -2.0f, 8.0f};
  full.sum = {1.25f, 3.0f, 1.0f};
  full.acc = filled(heads * dim, 5);
  full.acc[0] = -0.0f;  // even the sign of a zero survives
  kernels::clear(empty.view());

  owned_state into = full;
  kernels::merge(into.view(), empty.view());
  BOOST_TEST(same_bits(into.acc, full.acc));
  BOOST_TEST(same_bits(into.sum, full.sum));
  BOOST_TEST(same_bits(into.max, full.max));

  owned_state from_empty = empty;
  kernels::merge(from_empty.view(), full.view());
  BOOST_TEST(same_bits(from_empty.acc, full.acc));
  BOOST_TEST(same_bits(from_empty.sum, full.sum));
  BOOST_TEST(same_bits(from_empty.max, full.max));
}

BOOST_AUTO_TEST_CASE(merge_refuses_states_of_different_shapes) {
  owned_state a(2, 4), b(2, 5), odd(2, 4);
  a.max = {0.5f, -1.0f};  // a live state, so a partial merge would show in every part
  a.sum = {1.5f, 2.0f};
  a.acc = filled(2 * 4, 7);
  b.max = {1.0f, 1.0f};
  b.sum = {1.0f, 1.0f};
  odd.sum.resize(3);
  const owned_state a0 = a;
  BOOST_CHECK_EXCEPTION(
      kernels::merge(a.view(), b.view()), std::invalid_argument, [](const auto& e) {
        return mentions(e, "into is [2 heads, 8 acc]") && mentions(e, "from is [2 heads, 10 acc]");
      });
  BOOST_CHECK_EXCEPTION(kernels::merge(a.view(), odd.view()), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "from has max[2], sum[3]"); });
  BOOST_TEST(same_bits(a.max, a0.max));
  BOOST_TEST(same_bits(a.sum, a0.sum));
  BOOST_TEST(same_bits(a.acc, a0.acc));
}

BOOST_AUTO_TEST_CASE(finish_divides_by_the_denominator_and_the_sink_term) {
  constexpr std::size_t heads = 2, dim = 11;
  for_each_target([&](const char* target) {
    BOOST_TEST_CONTEXT("target " << target) {
      owned_state s(heads, dim);
      s.max = {1.0f, -0.5f};
      s.sum = {2.5f, 4.0f};
      s.acc = filled(heads * dim, 6);
      const std::vector<float> sinks = {0.75f, 3.0f};
      std::vector<float> out(heads * dim), plain(heads * dim);
      kernels::finish(s.view(), sinks, out);
      kernels::finish(s.view(), {}, plain);
      for (std::size_t h = 0; h < heads; ++h) {
        const double with_sink = s.sum[h] + std::exp(double(sinks[h]) - s.max[h]);
        for (std::size_t i = 0; i < dim; ++i) {
          // The double denominator rounded to f32 once, then one f32 division: ≤ 2·2^-24 of
          // |out| ≤ 1 / 2.5 (|acc| < 1, denominators ≥ 2.5), 4.8e-8.
          BOOST_TEST(std::abs(out[h * dim + i] - s.acc[h * dim + i] / with_sink) <= 1e-7);
          BOOST_TEST(std::abs(plain[h * dim + i] - s.acc[h * dim + i] / double(s.sum[h])) <= 1e-7);
        }
      }
      kernels::finish(s.view(), {}, s.acc);  // in place: out may be the accumulator
      BOOST_TEST(same_bits(s.acc, plain));
    }
  });
}

BOOST_AUTO_TEST_CASE(finish_gives_zeros_not_nan_for_a_head_that_saw_no_position) {
  owned_state s(2, 4);
  kernels::clear(s.view());
  std::vector<float> out(8, 7.0f);
  kernels::finish(s.view(), {}, out);
  for (float x : out) BOOST_TEST(x == 0.0f);
  out.assign(8, 7.0f);
  const std::vector<float> sinks = {1.0f, -1.0f};
  kernels::finish(s.view(), sinks, out);
  for (float x : out) BOOST_TEST(x == 0.0f);
}

BOOST_AUTO_TEST_CASE(a_sink_far_above_every_score_gives_zeros_not_nan) {
  owned_state s(1, 4);
  s.max = {0.0f};
  s.sum = {1.0f};
  s.acc = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> sinks = {1000.0f};  // e^1000 overflows even a double
  std::vector<float> out(4, 7.0f);
  kernels::finish(s.view(), sinks, out);
  for (float x : out) BOOST_TEST(x == 0.0f);
}

BOOST_AUTO_TEST_CASE(finish_refuses_wrong_sizes_and_nan_sinks_leaving_out_untouched) {
  owned_state s(2, 3);
  kernels::clear(s.view());
  std::vector<float> out(6, 7.0f), short_out(5, 7.0f);
  const std::vector<float> one_sink = {0.0f}, nan_sink = {0.0f, std::nanf("")};
  BOOST_CHECK_EXCEPTION(kernels::finish(s.view(), {}, short_out), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "out has 5"); });
  BOOST_CHECK_EXCEPTION(
      kernels::finish(s.view(), one_sink, out), std::invalid_argument,
      [](const auto& e) { return mentions(e, "sinks has 1") && mentions(e, "q_heads = 2"); });
  BOOST_CHECK_EXCEPTION(kernels::finish(s.view(), nan_sink, out), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "sinks[1] is NaN"); });
  for (float x : out) BOOST_TEST(x == 7.0f);
  for (float x : short_out) BOOST_TEST(x == 7.0f);
}
