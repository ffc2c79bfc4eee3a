// The element-type suites' shared ground (half_attention_test, fp8_attention_test): seeded
// inputs, a store of one element type filled with them, and the plain two-pass double-precision
// attention they are compared with. Include after `import ringkv;`; the includer has already
// included <algorithm>, <cmath>, <cstddef>, <cstdint>, <cstring>, <limits> and <vector>.
#pragma once

namespace element_reference {

using ringkv::default_kv_cache_store;
using ringkv::dtype;
namespace trace = ringkv::trace;

enum stream : std::uint64_t { key_stream = 0, value_stream = 1, query_stream = 2 };

/// Element i of head h at position p of a stream, in [-1, 1): every test's f32 input.
inline float input(stream s, std::size_t p, std::size_t h, std::size_t i) {
  std::uint64_t z = ((std::uint64_t(p) * 64 + h) * 4096 + i) * 4 + s + 0x2545f4914f6cdd1dULL;
  z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdULL;
  z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return float(std::int64_t((z ^ (z >> 33)) >> 40) - (1 << 23)) * 0x1p-23f;
}

/// A query of q_heads rows, scaled by 4 so the scores spread over several units.
inline std::vector<float> make_query(std::size_t q_heads, std::size_t dim, std::size_t seed) {
  std::vector<float> q(q_heads * dim);
  for (std::size_t h = 0; h < q_heads; ++h)
    for (std::size_t i = 0; i < dim; ++i) q[h * dim + i] = 4.0f * input(query_stream, seed, h, i);
  return q;
}

inline default_kv_cache_store make_store(dtype type, std::size_t kv_heads, std::size_t dim,
                                         std::size_t capacity, bool ring, std::size_t keep = 0,
                                         trace::sink& sink = trace::null_sink()) {
  return default_kv_cache_store({.layers = 1,
                                 .kv_heads = kv_heads,
                                 .head_dim = dim,
                                 .capacity = capacity,
                                 .key_type = type,
                                 .value_type = type},
                                {.sliding_window = ring, .keep = keep}, sink);
}

/// Appends positions [length, to) of layer 0 with rows from input().
inline void fill_until(ringkv::kv_cache_store& store, std::size_t to) {
  const ringkv::kv_cache_config c = store.config();
  std::vector<float> k(c.row_floats()), v(c.row_floats());
  for (std::size_t p = store.length(0); p < to; ++p) {
    for (std::size_t h = 0; h < c.kv_heads; ++h)
      for (std::size_t i = 0; i < c.head_dim; ++i) {
        k[h * c.head_dim + i] = input(key_stream, p, h, i);
        v[h * c.head_dim + i] = input(value_stream, p, h, i);
      }
    BOOST_REQUIRE(store.append(0, k, v) == p);
  }
}

// ---- the reference: plain two-pass double-precision attention ------------------------------

/// out = softmax(q·k / sqrt(dim)) · v per query head over positions [from, to), rows given by
/// row(stream, p, h, i) as doubles; magnitude = the same weighted sum of |v| (the scale each
/// output element is compared at), scores = the scaled scores [q_heads, to − from].
struct reference {
  std::vector<double> out, magnitude, scores;
};

template <class Row>
reference attend_double(const std::vector<float>& q, std::size_t kv_heads, std::size_t dim,
                        std::size_t from, std::size_t to, Row row) {
  const std::size_t q_heads = q.size() / dim, group = q_heads / kv_heads, n = to - from;
  const double scale = 1 / std::sqrt(double(dim));
  reference r{std::vector<double>(q.size()), std::vector<double>(q.size()),
              std::vector<double>(q_heads * n)};
  std::vector<double> x(dim), max(q_heads, -std::numeric_limits<double>::infinity()), sum(q_heads);
  for (std::size_t kv = 0; kv < kv_heads; ++kv)
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < dim; ++i) x[i] = row(key_stream, from + j, kv, i);
      for (std::size_t h = kv * group; h < (kv + 1) * group; ++h) {
        double dot = 0;
        for (std::size_t i = 0; i < dim; ++i) dot += double(q[h * dim + i]) * x[i];
        r.scores[h * n + j] = scale * dot;
        max[h] = std::max(max[h], scale * dot);
      }
    }
  for (std::size_t kv = 0; kv < kv_heads; ++kv)
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < dim; ++i) x[i] = row(value_stream, from + j, kv, i);
      for (std::size_t h = kv * group; h < (kv + 1) * group; ++h) {
        const double w = std::exp(r.scores[h * n + j] - max[h]);
        sum[h] += w;
        for (std::size_t i = 0; i < dim; ++i) {
          r.out[h * dim + i] += w * x[i];
          r.magnitude[h * dim + i] += w * std::abs(x[i]);
        }
      }
    }
  for (std::size_t e = 0; e < q.size(); ++e) {
    r.out[e] /= sum[e / dim];
    r.magnitude[e] /= sum[e / dim];
  }
  return r;
}

/// Largest |out − reference| relative to the magnitude of the weighted sum it approximates.
inline double relative_error(const std::vector<float>& out, const reference& r) {
  double worst = 0;
  for (std::size_t e = 0; e < out.size(); ++e)
    worst = std::max(worst, std::abs(double(out[e]) - r.out[e]) / r.magnitude[e]);
  return worst;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// f32 accumulation over rows that are exact in f32: the kernels' arithmetic is the f32 path's,
// so the error against the reference on the rounded rows is the f32 class the attention suite
// bounds at 2e-6 (measured here: about 5e-7 at most, see the messages).
constexpr double f32_class = 2e-6;

}  // namespace element_reference
