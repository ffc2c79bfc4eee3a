#define BOOST_TEST_MODULE half_attention
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/operations.hpp>

#include "cache_kind.hpp"
#include "count_new.hpp"
#include "hwy_targets.hpp"

import ringkv;

#include "element_reference.hpp"

// f16 and bf16 K/V through the attention kernels: stored at 2 bytes (rounded once, to nearest
// even), promoted to f32 in registers, accumulated in f32.

namespace trace = ringkv::trace;
using ringkv::default_kv_cache_store;
using ringkv::dtype;
using ringkv::windowed_attention;
using ringkv::windowed_kv;
using ringkv_test::for_each_target;

using namespace element_reference;

namespace {

constexpr std::array<dtype, 2> half_types{dtype::f16, dtype::bf16};

// ---- the test's own rounding: value arithmetic (frexp, ldexp, nearbyint), no bit tricks ------

/// 2^e for |e| <= 300, exact (a table: ldexp per element made the 32768-position test slow).
double power_of_two(int e) {
  static const std::vector<double> table = [] {
    std::vector<double> t(601);
    for (int i = 0; i <= 600; ++i) t[std::size_t(i)] = std::ldexp(1.0, i - 300);
    return t;
  }();
  return table[std::size_t(e + 300)];
}

/// x rounded to nearest, ties to even (the default rounding mode of nearbyint), keeping `bits`
/// significant bits with a quantum of at least 2^min_exponent (subnormals); ±inf past `largest`.
double round_to(double x, int bits, int min_exponent, double largest) {
  if (x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m · 2^e, m in [0.5, 1)
  const int quantum = std::max(e - bits, min_exponent);
  const double r = std::nearbyint(x * power_of_two(-quantum)) * power_of_two(quantum);
  return std::abs(r) > largest ? std::copysign(std::numeric_limits<double>::infinity(), x) : r;
}

/// x as the store of `type` must hold it: f16 has 11 significant bits, subnormals down to 2^-24
/// and 65504 at most; bf16 has 8, subnormals down to 2^-133 and 0x1.fep127 at most.
double rounded(dtype type, float x) {
  return type == dtype::f16 ? round_to(x, 11, -24, 65504.0) : round_to(x, 8, -133, 0x1.fep127);
}

/// The unit roundoff of `type` (half an ulp of 1).
double unit_roundoff(dtype type) { return type == dtype::f16 ? 0x1p-11 : 0x1p-8; }

/// The 16 bits of a value that `type` represents exactly (r from rounded()).
std::uint16_t bits_of(dtype type, double r) {
  if (type == dtype::bf16) return std::uint16_t(std::bit_cast<std::uint32_t>(float(r)) >> 16);
  const std::uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::abs(r);
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < 0x1p-14) return sign | std::uint16_t(a * 0x1p24);  // subnormal: counts of 2^-24
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m · 2^e: exponent field e − 1 + 15, 10 more bits
  return sign | std::uint16_t((e - 1 + 15) << 10) | std::uint16_t((2 * m - 1) * 1024);
}

// ---- inputs ----------------------------------------------------------------------------------

/// The reference over the rows as a `type` store holds them (the f32 inputs rounded once).
reference on_rounded_rows(dtype type, const std::vector<float>& q, std::size_t kv_heads,
                          std::size_t dim, std::size_t from, std::size_t to) {
  return attend_double(q, kv_heads, dim, from, to,
                       [type](stream s, std::size_t p, std::size_t h, std::size_t i) {
                         return rounded(type, input(s, p, h, i));
                       });
}

/// The reference over the original f32 inputs.
reference on_f32_inputs(const std::vector<float>& q, std::size_t kv_heads, std::size_t dim,
                        std::size_t from, std::size_t to) {
  return attend_double(q, kv_heads, dim, from, to,
                       [](stream s, std::size_t p, std::size_t h, std::size_t i) {
                         return double(input(s, p, h, i));
                       });
}

/// Worst value per key over a test, reported at the end.
struct worst_of {
  std::map<std::string, double> worst;
  void add(const std::string& key, double e) { worst[key] = std::max(worst[key], e); }
  void report(const char* what) const {
    for (const auto& [key, e] : worst) BOOST_TEST_MESSAGE(what << " " << key << ": " << e);
  }
};

struct heads {
  std::size_t q, kv;
};

}  // namespace

// ---- accuracy ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(
    half_decode_matches_a_double_reference_on_the_rounded_rows_for_every_shape_and_target) {
  // A ring of 320 slots after 1000 positions (it has wrapped): windows of the newest W positions.
  const windowed_attention attention;
  worst_of errors;
  for (dtype type : half_types)
    for (heads hs : {heads{8, 2}, heads{8, 8}})
      for (std::size_t dim : {64, 128}) {
        auto store = make_store(type, hs.kv, dim, 320, true);
        fill_until(store, 1000);
        const auto query = make_query(hs.q, dim, dim);
        std::vector<float> out(query.size());
        for (std::size_t w : {1, 17, 300}) {
          const reference ref = on_rounded_rows(type, query, hs.kv, dim, 1000 - w, 1000);
          const windowed_kv k = store.key_window(0, 1000 - w, 1000);
          const windowed_kv v = store.value_window(0, 1000 - w, 1000);
          BOOST_REQUIRE((k.type() == type && v.type() == type));
          for_each_target([&](const char* target) {
            attention.decode_step(query, k, v, out);
            const double e = relative_error(out, ref);
            errors.add(std::string(ringkv::name_of(type)) + " on " + target, e);
            BOOST_TEST(e <= f32_class, ringkv::name_of(type)
                                           << " " << target << " D " << dim << " heads " << hs.q
                                           << "/" << hs.kv << " W " << w);
          });
        }
      }
  errors.report("max relative error against the double reference on the rounded rows, W 1/17/300,");
}

BOOST_AUTO_TEST_CASE(
    over_4096_and_32768_positions_the_error_is_f32_class_and_the_storage_error_within_its_bound) {
  // 8 query heads over 2 kv heads, D 128, a wrapped ring. Two errors per case: against the
  // double reference on the rounded rows (the kernels' own error, f32 class) and against the
  // double reference on the original f32 inputs (what storing at 2 bytes costs). The second is
  // bounded by first-order analysis: each V element moves by at most u·|v| (u the unit roundoff)
  // and each weight by a factor within e^(±δ), δ the largest score change the K rounding caused,
  // so the normalised weights move by a factor within e^(±2δ) and
  // |Δout| ≤ ((1 + u)·e^(2δ) − 1) · Σ p_j |v_j| (+ the f32 class of the kernel itself).
  constexpr std::size_t q_heads = 8, kv_heads = 2, dim = 128;
  const windowed_attention attention;
  const auto query = make_query(q_heads, dim, 77);
  for (std::size_t w : {4096, 32768})
    for (dtype type : half_types) {
      auto store = make_store(type, kv_heads, dim, w + 100, true);
      fill_until(store, w + 500);  // slot 0 holds position w + 100: the window wraps
      const std::size_t from = w + 500 - w, to = w + 500;
      const windowed_kv k = store.key_window(0, from, to), v = store.value_window(0, from, to);
      BOOST_REQUIRE(k.wrapped());
      const reference exact = on_rounded_rows(type, query, kv_heads, dim, from, to);
      const reference original = on_f32_inputs(query, kv_heads, dim, from, to);
      double delta = 0;
      for (std::size_t j = 0; j < exact.scores.size(); ++j)
        delta = std::max(delta, std::abs(exact.scores[j] - original.scores[j]));
      const double u = unit_roundoff(type);
      const double bound = (1 + u) * std::exp(2 * delta) - 1 + f32_class;
      std::vector<float> out(query.size());
      for_each_target([&](const char* target) {
        attention.decode_step(query, k, v, out);
        const double kernel = relative_error(out, exact), storage = relative_error(out, original);
        BOOST_TEST_MESSAGE(ringkv::name_of(type)
                           << " W " << w << " on " << target
                           << ": max relative error against the rounded rows " << kernel
                           << ", against the f32 inputs " << storage << " (bound " << bound
                           << ", largest score change " << delta << ")");
        BOOST_TEST(kernel <= f32_class, ringkv::name_of(type) << " W " << w << " " << target);
        BOOST_TEST(storage <= bound, ringkv::name_of(type) << " W " << w << " " << target);
      });
    }
}

BOOST_AUTO_TEST_CASE(half_rows_read_pipelined_give_the_bits_they_get_in_blocks_on_two_threads) {
  // One query head a kv head, 8 kv heads of f16 or bf16 rows over a wrapped ring: D 128 over
  // W 4096 (16 MiB), D 130 (not whole vectors), D 64 over W 8192 (16 MiB of 128-byte rows,
  // pipelined without software prefetch: pipelined_prefetch). Planned as on a large_l2 machine,
  // one thread reads them pipelined (half_pipelined_min_bytes) and two threads (8 MiB each) in
  // blocks, four kv heads side by side. Both take blocks of 64 positions, so the bits must be
  // the same, on every target, and within the f32 class of the reference on the rounded rows.
  using ringkv::simd::cache_kind;
  struct layout {
    std::size_t dim, w;
  };
  constexpr std::size_t kv = 8;
  const ringkv_test::cache_kind_override as(cache_kind::large_l2);
  ringkv::default_thread_pool two(2);
  const windowed_attention alone, pooled(ringkv::attention_options{.pool = &two});
  for (dtype type : half_types)
    for (const auto [dim, w] : {layout{128, 4096}, layout{130, 4096}, layout{64, 8192}}) {
      const std::size_t end = w + 904;
      const auto element =
          type == dtype::f16 ? ringkv::simd::element::f16 : ringkv::simd::element::bf16;
      BOOST_REQUIRE(ringkv_test::plan_of(kv, kv, dim, w, 1, element).pipelined);
      BOOST_REQUIRE(!ringkv_test::plan_of(kv, kv, dim, w, 2, element).pipelined);
      auto store = make_store(type, kv, dim, w + 7, true);
      fill_until(store, end);
      const windowed_kv k = store.key_window(0, end - w, end);
      const windowed_kv v = store.value_window(0, end - w, end);
      BOOST_REQUIRE(k.wrapped());
      const auto query = make_query(kv, dim, 31);
      const reference ref = on_rounded_rows(type, query, kv, dim, end - w, end);
      std::vector<float> one(query.size()), both(query.size());
      for_each_target([&](const char* target) {
        alone.decode_step(query, k, v, one);
        pooled.decode_step(query, k, v, both);
        const double e = relative_error(one, ref);
        BOOST_TEST(e <= f32_class, ringkv::name_of(type) << " D " << dim << " " << target);
        BOOST_TEST(same_bits(one, both), ringkv::name_of(type) << " D " << dim << " " << target);
      });
    }
}

// ---- storage -------------------------------------------------------------------------------

namespace {
/// The smallest magnitude `type` rounds to ±Inf (its largest finite value plus half an ulp; the
/// tie goes up): a store of that type refuses it.
float overflow_at(dtype type) { return type == dtype::f16 ? 65520.0f : 0x1.ffp127f; }

/// Inputs that probe the rounding into `type`: ties at 1 (to even, down and up), f16's largest
/// finite value and the largest input that rounds to it, f16 subnormals and their ties, bf16
/// ties and its largest values, f32 subnormals, negatives; then inputs over 50 binades
/// (2^-30 … 2^19). Inputs the type would round to ±Inf are refused by its stores: left out.
std::vector<float> probe_inputs(dtype type) {
  std::vector<float> probes;
  for (const float x : {0.0f,
                        -0.0f,
                        1.0f,
                        -1.0f,
                        1 + 0x1p-11f,
                        1 + 0x3p-11f,
                        -(1 + 0x1p-11f),
                        65504.0f,
                        65519.0f,
                        -65519.0f,
                        65520.0f,
                        -70000.0f,
                        0x1p-24f,
                        0x1p-25f,
                        0x3p-25f,
                        0x1p-14f,
                        0x1.ffcp-15f,
                        1e-10f,
                        1 + 0x1p-8f,
                        1 + 0x3p-8f,
                        0x1.fep127f,
                        -0x1.fe8p127f,
                        0x1.ff8p127f,
                        -3.4e38f,
                        1e-40f,
                        -0x1p-130f,
                        0.1f,
                        -0.3f,
                        3.14159265f})
    if (std::fabs(x) < overflow_at(type)) probes.push_back(x);
  for (std::size_t n = 0; probes.size() < 200; ++n)
    if (const float x = std::ldexp(input(value_stream, n, 0, 0), int(n % 50) - 30);
        std::fabs(x) < overflow_at(type))
      probes.push_back(x);
  return probes;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_half_store_holds_each_f32_input_rounded_once_to_nearest_even) {
  // Values that probe the rounding (probe_inputs). The store's raw bits (through its zero-copy
  // windows, after the ring wrapped) must equal the test's own conversion, and read_keys /
  // read_values must return exactly those values as f32.
  constexpr std::size_t kv_heads = 2, dim = 20, capacity = 7;
  for (dtype type : half_types) {
    const std::vector<float> probes = probe_inputs(type);
    BOOST_TEST_CONTEXT(ringkv::name_of(type)) {
      auto store = make_store(type, kv_heads, dim, capacity, true);
      std::vector<float> k(kv_heads * dim), v(k.size());
      auto key_at = [&](std::size_t p, std::size_t e) {
        return probes[(p * 2 * k.size() + e) % probes.size()];
      };
      auto value_at = [&](std::size_t p, std::size_t e) {
        return probes[(p * 2 * k.size() + k.size() + e) % probes.size()];
      };
      constexpr std::size_t length = 3 * capacity + 2;
      for (std::size_t p = 0; p < length; ++p) {
        for (std::size_t e = 0; e < k.size(); ++e) {
          k[e] = key_at(p, e);
          v[e] = value_at(p, e);
        }
        store.append(0, k, v);
      }
      const std::size_t from = length - capacity;
      std::vector<float> read_k(kv_heads * capacity * dim), read_v(read_k.size());
      store.read_keys(0, from, length, read_k);
      store.read_values(0, from, length, read_v);
      const windowed_kv kw = store.key_window(0, from, length),
                        vw = store.value_window(0, from, length);
      BOOST_REQUIRE(kw.wrapped());
      std::size_t checked = 0;
      for (const auto& [w, at, read] :
           {std::tuple{&kw, +0, &read_k}, std::tuple{&vw, +1, &read_v}}) {
        std::size_t p = from;
        for (std::size_t r = 0; r < w->runs().size(); ++r)
          for (std::size_t j = 0; j < w->runs()[r].positions(); ++j, ++p)
            for (std::size_t h = 0; h < kv_heads; ++h)
              for (std::size_t i = 0; i < dim; ++i) {
                const float x = at == 0 ? key_at(p, h * dim + i) : value_at(p, h * dim + i);
                const double r_expected = rounded(type, x);
                std::uint16_t stored = 0;
                std::memcpy(&stored, w->runs()[r].row_bytes(h, j) + 2 * i, 2);
                const float back = (*read)[(h * capacity + (p - from)) * dim + i];
                BOOST_TEST(stored == bits_of(type, r_expected), "input " << x << " position " << p);
                BOOST_TEST(std::bit_cast<std::uint32_t>(back) ==
                               std::bit_cast<std::uint32_t>(float(r_expected)),
                           "input " << x << " read back as " << back);
                ++checked;
              }
      }
      BOOST_TEST(checked == 2 * kv_heads * capacity * dim);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_value_a_half_store_holds_reaches_every_target_exactly) {
  // A window of one position returns its value row exactly (weight exp(0) = 1, sum 1), so each
  // target's loader is checked against read_values bit for bit: f16 and bf16 subnormals, ±0,
  // the largest values. head_dim 19: two AVX2 vectors and a tail, four SSE4 vectors and a tail.
  constexpr std::size_t dim = 19, q = 2;
  const windowed_attention attention;
  const auto query = make_query(q, dim, 5);
  std::vector<float> k(dim), v(dim), back(dim), out(q * dim);
  for (dtype type : half_types) {
    const std::vector<float> probes = probe_inputs(type);
    const std::size_t positions = (probes.size() + dim - 1) / dim;
    auto store = make_store(type, 1, dim, positions, false);
    std::size_t largest = 0, subnormals = 0;
    for (std::size_t p = 0; p < positions; ++p) {
      for (std::size_t i = 0; i < dim; ++i) {
        k[i] = input(key_stream, p, 0, i);
        v[i] = probes[(p * dim + i) % probes.size()];
      }
      store.append(0, k, v);
      store.read_values(0, p, p + 1, back);
      for (float x : back) {
        largest += std::fabs(x) == (type == dtype::f16 ? 65504.0f : 0x1.fep127f);
        subnormals += std::fpclassify(x) == FP_SUBNORMAL ||
                      (type == dtype::f16 && x != 0 && std::abs(x) < 0x1p-14f);
      }
      for_each_target([&](const char* target) {
        attention.decode_step(query, store.key_window(0, p, p + 1), store.value_window(0, p, p + 1),
                              out);
        for (std::size_t h = 0; h < q; ++h)
          for (std::size_t i = 0; i < dim; ++i) {
            // Bit for bit, but for the sign of a zero: the accumulator starts at +0, and
            // +0 + 1 · (−0) is +0.
            const float o = out[h * dim + i];
            const bool same =
                std::bit_cast<std::uint32_t>(o) == std::bit_cast<std::uint32_t>(back[i]) ||
                (o == 0 && back[i] == 0);
            BOOST_TEST(same, ringkv::name_of(type)
                                 << " " << target << " position " << p << " element " << i << ": "
                                 << o << " for " << back[i]);
          }
      });
    }
    BOOST_TEST(largest >= 2u, ringkv::name_of(type));
    BOOST_TEST(subnormals >= 2u, ringkv::name_of(type));
  }
}

// README "NaN and Inf": a finite input that an f16 or bf16 store would round to ±Inf is refused
// like an infinite one — stored, it would make every output that reads it NaN (inf · 0, inf − inf).
BOOST_AUTO_TEST_CASE(a_half_store_refuses_a_finite_input_it_would_round_to_infinity) {
  constexpr std::size_t dim = 8;
  for (dtype type : half_types) {
    BOOST_TEST_CONTEXT(ringkv::name_of(type)) {
      const float limit = overflow_at(type), below = std::nextafter(limit, 0.0f);
      auto store = make_store(type, 1, dim, 4, true);
      fill_until(store, 6);  // wrapped
      const auto keys_of = [&] {
        std::vector<float> out(4 * dim);
        store.read_keys(0, 2, 6, out);
        return out;
      };
      const std::vector<float> before = keys_of();
      std::vector<float> k(dim, 1.0f), v(dim, 1.0f);
      k[3] = limit;
      BOOST_CHECK_EXCEPTION(store.append(0, k, v), std::invalid_argument, [&](const auto& e) {
        const std::string m = e.what();
        return m.find("append: key[3] = ") != std::string::npos &&
               m.find("is too large for " + std::string(ringkv::name_of(type))) !=
                   std::string::npos;
      });
      k[3] = 1.0f;
      v[5] = -limit;
      BOOST_CHECK_EXCEPTION(store.append(0, k, v), std::invalid_argument, [](const auto& e) {
        return std::string(e.what()).find("value[5] = -") != std::string::npos;
      });
      BOOST_TEST(store.length(0) == 6u);
      BOOST_TEST(keys_of() == before, boost::test_tools::per_element());
      // The largest input below the limit is held, rounded to the type's largest finite value.
      v[5] = -below;
      k[0] = below;
      store.append(0, k, v);
      std::vector<float> back(dim);
      store.read_keys(0, 6, 7, back);
      BOOST_TEST(back[0] == (type == dtype::f16 ? 65504.0f : 0x1.fep127f));
      // prefill and the decode stream refuse it before writing out or appending.
      std::vector<float> chunk_k(2 * dim, 0.5f), chunk_v(2 * dim, 0.5f), q(2 * dim, 0.5f);
      std::vector<float> out(2 * dim, 7.0f);
      chunk_v[dim + 1] = limit;
      BOOST_CHECK_EXCEPTION(windowed_attention().prefill(store, 0, q, chunk_k, chunk_v, out),
                            std::invalid_argument, [](const auto& e) {
                              return std::string(e.what()).find(
                                         "ringkv::windowed_attention::prefill: values[9] = ") == 0;
                            });
      BOOST_TEST(std::count(out.begin(), out.end(), 7.0f) == long(out.size()));
      const std::vector<ringkv::token_qkv> tokens{{std::span(q).first(dim),
                                                   std::span(chunk_k).first(dim),
                                                   std::span(chunk_v).subspan(dim)}};
      auto stream = ringkv::decode(store, 0, tokens);
      BOOST_CHECK_EXCEPTION(stream.begin(), std::invalid_argument, [](const auto& e) {
        return std::string(e.what()).find("append: value[1] = ") != std::string::npos;
      });
      BOOST_TEST(store.length(0) == 7u);
    }
  }
}

// ---- determinism and the gather path ----------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_wrapped_half_ring_and_a_never_wrapped_half_store_give_identical_bits) {
  // A capacity-37 ring (without and with 3 pinned sinks) after several laps against a dense store
  // holding every position: for each of the 37 wrap points and several W, on every target, the
  // outputs are equal bit for bit. head_dim 44 is not a whole number of vectors (the tail path).
  constexpr std::size_t kv = 2, q = 8, dim = 44;
  const windowed_attention attention;
  const auto query = make_query(q, dim, 21);
  std::vector<float> a(q * dim), b(q * dim);
  std::size_t wrapped = 0, compared = 0;
  for (dtype type : half_types)
    for (std::size_t keep : {0, 3}) {
      auto ring = make_store(type, kv, dim, 37, true, keep);
      auto flat = make_store(type, kv, dim, 37 * 6, false);
      fill_until(ring, 37 * 4);
      fill_until(flat, 37 * 5);
      for (std::size_t end = 37 * 4 + 1; end <= 37 * 5; ++end) {
        fill_until(ring, end);
        for (std::size_t w : {1, 5, 16, 17, 30, 34}) {
          const std::size_t from = end - w;
          const windowed_kv rk = ring.key_window(0, from, end),
                            rv = ring.value_window(0, from, end);
          // The flat store's window: the same sinks, then the same rolling positions.
          std::array<ringkv::kv_run, 3> fk_runs{}, fv_runs{};
          std::size_t n = 0;
          if (keep > 0) {
            fk_runs[n] = {flat.key_window(0, 0, keep).head(), 0};
            fv_runs[n++] = {flat.value_window(0, 0, keep).head(), 0};
          }
          fk_runs[n] = {flat.key_window(0, from, end).head(), from};
          fv_runs[n++] = {flat.value_window(0, from, end).head(), from};
          const windowed_kv fk(std::span<const ringkv::kv_run>(fk_runs.data(), n));
          const windowed_kv fv(std::span<const ringkv::kv_run>(fv_runs.data(), n));
          BOOST_REQUIRE(rk.length() == fk.length());
          wrapped += rk.wrapped();
          for_each_target([&](const char* target) {
            attention.decode_step(query, rk, rv, a);
            attention.decode_step(query, fk, fv, b);
            BOOST_TEST(same_bits(a, b), ringkv::name_of(type) << " " << target << " keep " << keep
                                                              << " end " << end << " W " << w);
            ++compared;
          });
        }
      }
    }
  BOOST_TEST(wrapped > 150u);
  BOOST_TEST_MESSAGE("bit-identical comparisons: " << compared
                                                   << ", of windows wrapped: " << wrapped);
}

BOOST_AUTO_TEST_CASE(the_gather_path_equals_the_pair_path_bit_for_bit_and_copies_two_byte_rows) {
  constexpr std::size_t kv = 2, q = 8, dim = 64, w = 100;
  trace::recorder rec(64);
  const windowed_attention attention(ringkv::attention_options{.sink = &rec});
  const auto query = make_query(q, dim, 16);
  std::vector<float> pair(q * dim), gathered(q * dim);
  ringkv::scope arena(1 << 20, rec);
  for (dtype type : half_types) {
    auto store = make_store(type, kv, dim, 128, true);
    fill_until(store, 300);
    const windowed_kv k = store.key_window(0, 300 - w, 300),
                      v = store.value_window(0, 300 - w, 300);
    BOOST_REQUIRE(k.wrapped());
    for_each_target([&](const char* target) {
      rec.clear();
      attention.decode_step(query, k, v, pair);
      attention.decode_step_gathered(query, k, v, gathered, arena);
      BOOST_TEST(same_bits(pair, gathered), ringkv::name_of(type) << " " << target);
      std::size_t adapters = 0;
      for (const auto& a : rec.of<trace::adapter_inserted>()) {
        BOOST_TEST(a.kind == "gather-kv-window");
        BOOST_TEST(a.bytes == kv * w * dim * 2);  // the rows as stored: two bytes an element
        ++adapters;
      }
      BOOST_TEST(adapters == 2u);
      BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
      arena.reset();
    });
  }
}

// ---- the stream, and no allocation -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(
    the_decode_stream_over_a_wrapped_f16_ring_equals_append_and_decode_step_by_hand) {
  constexpr std::size_t kv = 2, q = 8, dim = 40, capacity = 23, n = 3 * capacity + 5;
  std::vector<float> qs(n * q * dim), ks(n * kv * dim), vs(n * kv * dim);
  std::vector<ringkv::token_qkv> tokens;
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t h = 0; h < q; ++h)
      for (std::size_t i = 0; i < dim; ++i)
        qs[(t * q + h) * dim + i] = 4 * input(query_stream, t, h, i);
    for (std::size_t h = 0; h < kv; ++h)
      for (std::size_t i = 0; i < dim; ++i) {
        ks[(t * kv + h) * dim + i] = input(key_stream, t, h, i);
        vs[(t * kv + h) * dim + i] = input(value_stream, t, h, i);
      }
    tokens.push_back({std::span<const float>(qs).subspan(t * q * dim, q * dim),
                      std::span<const float>(ks).subspan(t * kv * dim, kv * dim),
                      std::span<const float>(vs).subspan(t * kv * dim, kv * dim)});
  }
  const windowed_attention attention;
  std::vector<float> expected(q * dim);
  for (std::size_t keep : {0, 2}) {
    auto streamed = make_store(dtype::f16, kv, dim, capacity, true, keep);
    auto by_hand = make_store(dtype::f16, kv, dim, capacity, true, keep);
    std::size_t t = 0;
    for (std::span<const float> row : ringkv::decode(streamed, 0, tokens)) {
      const std::size_t p = by_hand.append(0, tokens[t].k, tokens[t].v);
      // W = capacity keys counting the sinks: 0 … keep−1 and the newest capacity − keep.
      const std::size_t from = p + 1 > capacity ? p + 1 - (capacity - keep) : 0;
      attention.decode_step(tokens[t].q, by_hand.key_window(0, from, p + 1),
                            by_hand.value_window(0, from, p + 1), expected);
      BOOST_REQUIRE(row.size() == expected.size());
      BOOST_TEST(std::memcmp(row.data(), expected.data(), row.size_bytes()) == 0,
                 "keep " << keep << " token " << t);
      ++t;
    }
    BOOST_TEST(t == n);
    BOOST_TEST(streamed.window_start(0) > 0u);  // the ring wrapped
  }
}

BOOST_AUTO_TEST_CASE(sixteen_decode_steps_over_a_wrapped_bf16_ring_allocate_and_copy_nothing) {
  constexpr std::size_t kv = 2, q = 8, dim = 64, capacity = 50;
  trace::recorder rec(64);
  auto store = make_store(dtype::bf16, kv, dim, capacity, true, 0, rec);
  const windowed_attention attention(ringkv::attention_options{.sink = &rec});
  fill_until(store, 200);
  const auto query = make_query(q, dim, 17);
  std::vector<float> out(q * dim), k(kv * dim), v(kv * dim);
  std::size_t wrapped = 0;
  rec.clear();
  const ringkv_test::new_counter counter;
  for (std::size_t step = 0; step < 16; ++step) {
    for (std::size_t e = 0; e < k.size(); ++e) {
      k[e] = input(key_stream, 200 + step, 0, e);
      v[e] = input(value_stream, 200 + step, 0, e);
    }
    const std::size_t p = store.append(0, k, v);
    const windowed_kv kw = store.key_window(0, p + 1 - capacity, p + 1);
    const windowed_kv vw = store.value_window(0, p + 1 - capacity, p + 1);
    wrapped += kw.wrapped();
    attention.decode_step(query, kw, vw, out);
  }
  BOOST_TEST(counter.calls() == 0u);
  BOOST_TEST(wrapped > 0u);
  BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
  BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 0);
  BOOST_TEST(rec.emitted() == 0u);
}

// ---- refusals --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(
    the_decode_stream_refuses_keys_and_values_of_different_dtypes_before_appending) {
  // The kernels take one dtype for K and V; a store of f16 keys and bf16 values is refused when
  // the stream is made, so no token is appended and then refused.
  auto store = default_kv_cache_store({.layers = 1,
                                       .kv_heads = 1,
                                       .head_dim = 8,
                                       .capacity = 4,
                                       .key_type = dtype::f16,
                                       .value_type = dtype::bf16},
                                      {.sliding_window = true});
  std::vector<float> q(8, 0.5f), k(8, 0.25f), v(8, 1.0f);
  std::vector<ringkv::token_qkv> tokens{{q, k, v}};
  BOOST_CHECK_EXCEPTION(ringkv::decode(store, 0, tokens), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          const std::string m = e.what();
                          return m.find("keys are f16") != std::string::npos &&
                                 m.find("values are bf16") != std::string::npos;
                        });
  BOOST_TEST(store.length(0) == 0u);
  const windowed_attention attention;
  std::vector<float> out(8, 7.0f);
  store.append(0, k, v);
  BOOST_CHECK_EXCEPTION(
      attention.decode_step(q, store.key_window(0, 0, 1), store.value_window(0, 0, 1), out),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("decode_step: keys are f16 but values are bf16") !=
               std::string::npos;
      });
  for (float x : out) BOOST_TEST(x == 7.0f);
}
