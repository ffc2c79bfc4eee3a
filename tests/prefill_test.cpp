#define BOOST_TEST_MODULE prefill
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <range/v3/iterator/operations.hpp>

#include "cache_kind.hpp"
#include "count_new.hpp"
#include "hwy_targets.hpp"
#include "random_prompt.hpp"

import ringkv;

#include "store_support.hpp"
#include "copying_store.hpp"
#include "own_rows_store.hpp"

namespace trace = ringkv::trace;

namespace {

constexpr std::size_t head_dim = 16, q_heads = 8;

/// Seeded random rows for n tokens: q [n, heads * dim], k and v [n, kv_heads * dim].
struct prompt : random_prompt {
  prompt(std::size_t n, std::size_t kv_heads, unsigned seed, float spread = 1.0f,
         std::size_t heads = q_heads, std::size_t dim = head_dim)
      : random_prompt(n, heads * dim, kv_heads * dim, seed, spread) {}
};

ringkv::default_kv_cache_store ring(std::size_t kv_heads, std::size_t capacity,
                                    std::size_t keep = 0, ringkv::dtype type = ringkv::dtype::f32,
                                    trace::sink& sink = trace::null_sink()) {
  return ringkv::default_kv_cache_store({.layers = 1,
                                         .kv_heads = kv_heads,
                                         .head_dim = head_dim,
                                         .capacity = capacity,
                                         .key_type = type,
                                         .value_type = type},
                                        {.sliding_window = true, .keep = keep}, sink);
}

/// Tokens [from, from + n) of `p` the plain way: append, then decode_step over the store's
/// window of the new position (the stream's loop, written out).
std::vector<float> token_by_token(ringkv::kv_cache_store& store, const prompt& p, std::size_t from,
                                  std::size_t n, std::span<const float> sinks = {}) {
  const ringkv::windowed_attention attention;
  ringkv::scope arena(64);
  const std::size_t w = store.attention_window(), keep = store.options().keep;
  std::vector<float> out(n * p.q_row);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t pos = store.append(0, p.ks(from + i, 1), p.vs(from + i, 1));
    const std::size_t first = pos + 1 > w ? pos + 1 - (w - keep) : 0;
    arena.reset();
    attention.decode_step(p.qs(from + i, 1), store.key_window(0, first, pos + 1, arena),
                          store.value_window(0, first, pos + 1, arena),
                          std::span<float>(out).subspan(i * p.q_row, p.q_row), 0.0f, sinks);
  }
  return out;
}

std::vector<float> prefilled(ringkv::kv_cache_store& store, const prompt& p, std::size_t from,
                             std::size_t n, ringkv::prefill_options options = {}) {
  std::vector<float> out(n * p.q_row);
  ringkv::windowed_attention().prefill(store, 0, p.qs(from, n), p.ks(from, n), p.vs(from, n), out,
                                       options);
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// Everything a store is: counters and the raw bytes of both sides, slot by slot.
bool same_store(const ringkv::default_kv_cache_store& a, const ringkv::default_kv_cache_store& b) {
  const auto bytes_equal = [](const ringkv::storage& x, const ringkv::storage& y) {
    return x.bytes() == y.bytes() && std::memcmp(x.data(), y.data(), x.bytes()) == 0;
  };
  return a.length(0) == b.length(0) && a.window_start(0) == b.window_start(0) &&
         bytes_equal(a.key_storage(0), b.key_storage(0)) &&
         bytes_equal(a.value_storage(0), b.value_storage(0));
}

/// The double-precision reference for the token at `pos` (row `i` of `p`, which holds positions
/// 0 … of the prompt): softmax over the given positions, plainly, per query head.
std::vector<double> reference(const prompt& p, std::size_t kv_heads, std::size_t i,
                              const std::vector<std::size_t>& positions,
                              std::span<const float> sinks = {}) {
  const std::size_t group = q_heads / kv_heads;
  const double scale = 1.0 / std::sqrt(double(head_dim));
  std::vector<double> out(p.q_row, 0.0);
  for (std::size_t h = 0; h < q_heads; ++h) {
    const std::size_t kvh = h / group;
    std::vector<double> s;
    for (std::size_t pos : positions) {
      double dot = 0;
      for (std::size_t d = 0; d < head_dim; ++d)
        dot += double(p.q[i * p.q_row + h * head_dim + d]) *
               double(p.k[pos * p.kv_row + kvh * head_dim + d]);
      s.push_back(dot * scale);
    }
    if (s.empty()) continue;
    const double m = *std::max_element(s.begin(), s.end());
    double sum = sinks.empty() ? 0.0 : std::exp(double(sinks[h]) - m);  // gpt-oss sink logit
    for (double& x : s) sum += (x = std::exp(x - m));
    for (std::size_t j = 0; j < positions.size(); ++j)
      for (std::size_t d = 0; d < head_dim; ++d)
        out[h * head_dim + d] +=
            s[j] / sum * double(p.v[positions[j] * p.kv_row + kvh * head_dim + d]);
  }
  return out;
}

/// Positions p − W + 1 … p (clamped at 0), or with keep S: 0 … S−1 and the W − S newest.
std::vector<std::size_t> window_of(std::size_t pos, std::size_t w, std::size_t keep) {
  std::vector<std::size_t> out;
  if (pos + 1 <= w) {
    for (std::size_t x = 0; x <= pos; ++x) out.push_back(x);
    return out;
  }
  for (std::size_t x = 0; x < keep; ++x) out.push_back(x);
  for (std::size_t x = pos + 1 - (w - keep); x <= pos; ++x) out.push_back(x);
  return out;
}

double max_abs_diff(std::span<const float> got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  return worst;
}

/// Query heads, kv heads and head_dim of a prefill test's layer.
struct shape {
  std::size_t q_heads, kv_heads, head_dim;
};

ringkv::default_kv_cache_store ring_of(const shape& s, std::size_t capacity, std::size_t keep,
                                       ringkv::dtype type) {
  return ringkv::default_kv_cache_store({.layers = 1,
                                         .kv_heads = s.kv_heads,
                                         .head_dim = s.head_dim,
                                         .capacity = capacity,
                                         .key_type = type,
                                         .value_type = type},
                                        {.sliding_window = true, .keep = keep});
}

prompt prompt_of(const shape& s, std::size_t n, unsigned seed) {
  return prompt(n, s.kv_heads, seed, 1.0f, s.q_heads, s.head_dim);
}

/// The whole of `p` prefilled into `store` in chunks of the given sizes, on `threads` threads
/// (0: no pool), one attention object and arena for all chunks.
std::vector<float> prefilled_in(ringkv::kv_cache_store& store, const prompt& p,
                                const std::vector<std::size_t>& chunks, std::size_t threads,
                                std::span<const float> sinks = {}) {
  std::optional<ringkv::default_thread_pool> pool;
  if (threads > 0) pool.emplace(threads);
  const ringkv::windowed_attention attention(
      ringkv::attention_options{nullptr, pool ? &*pool : nullptr});
  ringkv::scope arena(64);
  std::vector<float> out(p.q.size());
  std::size_t at = 0;
  for (const std::size_t n : chunks) {
    arena.reset();
    attention.prefill(store, 0, p.qs(at, n), p.ks(at, n), p.vs(at, n),
                      std::span<float>(out).subspan(at * p.q_row, n * p.q_row),
                      {.sinks = sinks, .arena = &arena});
    at += n;
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(prefill_equals_token_by_token_decode_bit_for_bit_on_fresh_and_wrapped_rings) {
  std::size_t cases = 0;
  for (const std::size_t w : {1u, 5u, 64u})
    for (const std::size_t keep : {0u, 2u}) {
      if (keep >= w) continue;
      for (const std::size_t chunk : {std::size_t(1), std::size_t(7), w - 1, w, w + 1, 3 * w + 5}) {
        if (chunk == 0) continue;
        for (const std::size_t before : {std::size_t(0), 2 * w + 3}) {  // fresh, then wrapped
          const prompt p(before + chunk, 2, unsigned(w * 100 + chunk + keep));
          auto a = ring(2, w, keep), b = ring(2, w, keep);
          token_by_token(a, p, 0, before);
          token_by_token(b, p, 0, before);
          BOOST_TEST_REQUIRE((before == 0 || a.window_start(0) > keep));  // overwritten: wrapped
          const auto want = token_by_token(a, p, before, chunk);
          const auto got = prefilled(b, p, before, chunk);
          BOOST_TEST_INFO("W " << w << " keep " << keep << " chunk " << chunk << " after "
                               << before);
          BOOST_TEST(same_bits(got, want));
          BOOST_TEST(same_store(a, b));
          ++cases;
        }
      }
    }
  BOOST_TEST(cases == 58u);  // W 1: 5 chunks; W 5, 64: 6 chunks × 2 keeps; × fresh/wrapped
}

BOOST_AUTO_TEST_CASE(a_prompt_cut_into_different_chunks_gives_the_same_outputs_and_store) {
  const std::size_t w = 64;
  const prompt p(100, 2, 7);
  const std::vector<std::vector<std::size_t>> splits = {{100}, {37, 1, 62}, {64, 36}};
  std::vector<std::vector<float>> outs;
  std::vector<ringkv::default_kv_cache_store> stores;
  for (const auto& split : splits) {
    stores.push_back(ring(2, w, 3));
    std::vector<float> all;
    std::size_t from = 0;
    for (std::size_t n : split) {
      const auto o = prefilled(stores.back(), p, from, n);
      all.insert(all.end(), o.begin(), o.end());
      from += n;
    }
    outs.push_back(all);
  }
  for (std::size_t i = 1; i < splits.size(); ++i) {
    BOOST_TEST(same_bits(outs[i], outs[0]));
    BOOST_TEST(same_store(stores[i], stores[0]));
  }
  BOOST_TEST(stores[0].length(0) == 100u);
}

BOOST_AUTO_TEST_CASE(prefill_matches_a_double_reference_with_the_mask_at_the_chunk_start) {
  // A short store (3 positions) then a chunk of 40 with W = 16 and 2 sinks: the first queries see
  // fewer than W keys (never a position below 0 or above themselves), later ones 0, 1 and the 14
  // newest. Relative error bound: 16 f32 products per score and a 16-term f32 softmax stay near
  // 1e-6 of the output scale (values ~1).
  const std::size_t w = 16, keep = 2;
  for (const std::size_t kv_heads : {2u, 8u}) {
    const prompt p(43, kv_heads, 11);
    auto store = ring(kv_heads, w, keep);
    token_by_token(store, p, 0, 3);
    const auto out = prefilled(store, p, 3, 40);
    double worst = 0;
    for (std::size_t i = 0; i < 40; ++i) {
      const auto want = reference(p, kv_heads, 3 + i, window_of(3 + i, w, keep));
      worst = std::max(
          worst, max_abs_diff(std::span<const float>(out).subspan(i * p.q_row, p.q_row), want));
    }
    BOOST_TEST_MESSAGE("kv_heads " << kv_heads << ": max abs error vs double " << worst);
    BOOST_TEST(worst < 2e-6);
  }
}

BOOST_AUTO_TEST_CASE(a_query_sees_exactly_the_last_w_positions_not_one_more_or_less) {
  // With W = 8 and scores of order 1 every key carries ~1/8 of the weight: adding position
  // p − W or dropping p − W + 1 moves the output by ~0.1, far above the kernel's error, in
  // prefill and at the ring/chunk boundary.
  const std::size_t w = 8;
  const prompt p(30, 2, 5);
  auto store = ring(2, w);
  token_by_token(store, p, 0, 10);  // the chunk starts on a wrapped ring
  const auto out = prefilled(store, p, 10, 20);
  for (std::size_t i = 0; i < 20; ++i) {
    const std::size_t pos = 10 + i;
    const auto row = std::span<const float>(out).subspan(i * p.q_row, p.q_row);
    const auto exact = reference(p, 2, pos, window_of(pos, w, 0));
    const auto one_more = reference(p, 2, pos, window_of(pos, w + 1, 0));
    const auto one_less = reference(p, 2, pos, window_of(pos, w - 1, 0));
    BOOST_TEST_INFO("position " << pos);
    BOOST_TEST(max_abs_diff(row, exact) < 1e-5);
    BOOST_TEST(max_abs_diff(row, one_more) > 1e-3);
    BOOST_TEST(max_abs_diff(row, one_less) > 1e-3);
  }
}

BOOST_AUTO_TEST_CASE(learned_sinks_and_kept_tokens_in_prefill_equal_decode) {
  const std::size_t w = 12;
  const prompt p(50, 2, 21);
  std::vector<float> sinks(q_heads);
  for (std::size_t h = 0; h < q_heads; ++h) sinks[h] = 0.5f * float(h) - 1.0f;
  auto a = ring(2, w, 3), b = ring(2, w, 3);
  token_by_token(a, p, 0, 20, sinks);
  token_by_token(b, p, 0, 20, sinks);
  const auto want = token_by_token(a, p, 20, 30, sinks);
  const auto got = prefilled(b, p, 20, 30, {.sinks = sinks});
  BOOST_TEST(same_bits(got, want));
  BOOST_TEST(same_store(a, b));
}

BOOST_AUTO_TEST_CASE(kept_tokens_and_learned_sinks_on_a_wrapped_ring_match_the_double_reference) {
  // Ring of 12 with 3 kept tokens, wrapped several times before the chunk; decode and prefill
  // both attend positions 0, 1, 2 and the 9 newest, and add e^(sink − max) to the denominator.
  const std::size_t w = 12, keep = 3;
  const prompt p(80, 2, 23);
  std::vector<float> sinks(q_heads);
  for (std::size_t h = 0; h < q_heads; ++h) sinks[h] = 0.25f * float(h);
  auto store = ring(2, w, keep);
  const auto decoded = token_by_token(store, p, 0, 50, sinks);
  BOOST_TEST_REQUIRE(store.window_start(0) > 3 * w);
  const auto out = prefilled(store, p, 50, 30, {.sinks = sinks});
  double worst = 0;
  for (std::size_t pos = 0; pos < 80; ++pos) {
    const auto& rows = pos < 50 ? decoded : out;
    const std::size_t i = pos < 50 ? pos : pos - 50;
    const auto want = reference(p, 2, pos, window_of(pos, w, keep), sinks);
    worst = std::max(
        worst, max_abs_diff(std::span<const float>(rows).subspan(i * p.q_row, p.q_row), want));
  }
  BOOST_TEST_MESSAGE("max abs error vs double with keep and sinks: " << worst);
  // As above: 16-term f32 scores and a softmax of ≤ 12 terms over values ~1 (observed 2.7e-7).
  BOOST_TEST(worst < 2e-6);
}

BOOST_AUTO_TEST_CASE(a_smaller_window_than_the_ring_holds_is_honoured) {
  const prompt p(40, 2, 8);
  auto store = ring(2, 32);
  const auto out = prefilled(store, p, 0, 40, {.window = 6});
  double worst = 0;
  for (const std::size_t i : {0u, 5u, 6u, 39u}) {
    const auto want = reference(p, 2, i, window_of(i, 6, 0));
    worst = std::max(worst,
                     max_abs_diff(std::span<const float>(out).subspan(i * p.q_row, p.q_row), want));
  }
  BOOST_TEST_MESSAGE("window 6: max abs error vs double " << worst);
  // 16-term f32 scores and a softmax of ≤ 6 terms over values ~1: a few 1e-7 (see the reference
  // test above); a seventh key or a missing one moves the output by ~0.1.
  BOOST_TEST(worst < 2e-6);
}

// A compressed store gets the decode stream's own loop: token by token, attended straight from
// its codes (compressed_kv_attention) — the stream's bits, and no copy or allocation on the way.
BOOST_AUTO_TEST_CASE(a_compressed_prefill_is_the_decode_stream_over_its_codes) {
  const prompt p(30, 2, 9);
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = head_dim, .capacity = 10};
  const ringkv::store_options o{.sliding_window = true, .keep = 1};
  const auto stream_of = [&](ringkv::kv_cache_store& store) {
    std::vector<ringkv::token_qkv> tokens;
    for (std::size_t i = 0; i < 30; ++i) tokens.push_back({p.qs(i, 1), p.ks(i, 1), p.vs(i, 1)});
    std::vector<float> rows;
    for (std::span<const float> row : ringkv::decode(store, 0, tokens))
      rows.insert(rows.end(), row.begin(), row.end());
    return rows;
  };
  const auto check = [&](ringkv::kv_cache_store& streamed, ringkv::kv_cache_store& prefill,
                         trace::recorder& rec) {
    const auto want = stream_of(streamed);
    rec.clear();
    const ringkv::windowed_attention attention(ringkv::attention_options{&rec});
    std::vector<float> got(30 * p.q_row);
    attention.prefill(prefill, 0, p.qs(0, 30), p.ks(0, 30), p.vs(0, 30), got);
    BOOST_TEST(same_bits(got, want));
    BOOST_TEST(prefill.length(0) == 30u);
    BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 0);
    BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
  };
  trace::recorder rec(1024);
  ringkv::int8_kv_cache_store i8_a(c, o), i8_b(c, o, rec);
  check(i8_a, i8_b, rec);
  const ringkv::turboquant_options tq{.key_bits = 3, .value_bits = 4, .qjl = true};
  ringkv::turboquant_kv_cache_store tq_a(c, tq, o), tq_b(c, tq, o, rec);
  check(tq_a, tq_b, rec);
}

// A store whose windows are copies gets the same loop, each token's window copied into the
// prefill's own arena; while the ring fills, that window grows by a row a token: the arena
// takes the full window's size once instead of a larger slab at every token.
BOOST_AUTO_TEST_CASE(a_prefill_over_a_store_whose_windows_copy_sizes_its_arena_once) {
  const prompt p(100, 2, 23);
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = head_dim, .capacity = 40};
  trace::recorder rec(4096);
  store_test::copying_store store(c, {.sliding_window = true}, rec);
  const ringkv::windowed_attention attention(ringkv::attention_options{&rec});
  std::vector<float> out(100 * p.q_row);
  attention.prefill(store, 0, p.qs(0, 100), p.ks(0, 100), p.vs(0, 100), out);
  // One slab, for the K and V copies of the full window (40 positions × 2 kv heads × head_dim
  // f32), made before the first token.
  std::vector<std::size_t> slabs;
  for (const auto& a : rec.of<trace::allocation>())
    if (a.site == "scope-slab") slabs.push_back(a.bytes);
  BOOST_TEST_REQUIRE(slabs.size() == 1u);
  BOOST_TEST(slabs[0] >= 2 * 2 * 40 * head_dim * sizeof(float));
  BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 2 * 100);
}

// A store written outside the library that exposes its rows (stored_window) gets the tiled
// kernel: its one traced scratch, no copy of a window, and the default store's bits, on a ring
// that wraps within a chunk and across chunks, for each element type.
BOOST_AUTO_TEST_CASE(a_store_written_outside_the_library_gets_the_tiled_prefill_and_its_bits) {
  const prompt p(150, 2, 31);
  for (const ringkv::dtype type : ringkv::all_dtypes) {
    BOOST_TEST_CONTEXT(ringkv::name_of(type)) {
      auto reference = ring(2, 48, 0, type);
      store_test::own_rows_store own({.layers = 1,
                                      .kv_heads = 2,
                                      .head_dim = head_dim,
                                      .capacity = 48,
                                      .key_type = type,
                                      .value_type = type},
                                     true);
      trace::recorder rec(256);
      const ringkv::windowed_attention attention(ringkv::attention_options{&rec});
      ringkv::scope arena(64);
      std::vector<float> got(150 * p.q_row);
      for (const auto [from, n] : {std::pair{0, 70}, std::pair{70, 1}, std::pair{71, 79}}) {
        arena.reset();
        attention.prefill(own, 0, p.qs(from, n), p.ks(from, n), p.vs(from, n),
                          std::span<float>(got).subspan(from * p.q_row, n * p.q_row),
                          {.arena = &arena});
      }
      BOOST_TEST(same_bits(got, prefilled(reference, p, 0, 150)));
      BOOST_TEST(own.length(0) == 150u);
      std::vector<std::string> sites;
      for (const auto& a : rec.of<trace::allocation>()) sites.emplace_back(a.site);
      BOOST_TEST(std::count(sites.begin(), sites.end(), "prefill-scratch") == 1);
      for (const auto& a : rec.of<trace::adapter_inserted>())
        BOOST_TEST(a.kind == "round-chunk-rows");  // an f16/bf16 chunk's rows; never a window
    }
  }
}

BOOST_AUTO_TEST_CASE(a_prefill_after_the_first_allocates_nothing) {
  trace::recorder rec(256);
  auto store = ring(2, 64, 2, ringkv::dtype::f32, rec);
  const prompt p(300, 2, 4);
  const ringkv::windowed_attention attention(ringkv::attention_options{&rec});
  std::vector<float> out(100 * p.q_row);
  attention.prefill(store, 0, p.qs(0, 100), p.ks(0, 100), p.vs(0, 100), out);
  rec.clear();
  const ringkv_test::new_counter counter;
  attention.prefill(store, 0, p.qs(100, 100), p.ks(100, 100), p.vs(100, 100), out);
  attention.prefill(store, 0, p.qs(200, 100), p.ks(200, 100), p.vs(200, 100), out);
  BOOST_TEST(counter.calls() == 0u);
  BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
  BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 0);
  BOOST_TEST(store.length(0) == 300u);
}

BOOST_AUTO_TEST_CASE(bad_chunks_are_refused_with_out_and_store_untouched) {
  // Each refusal names the argument and the limit it broke; a wrapped ring (12 tokens in 8 slots)
  // and out keep every byte, so a check that ran after a partial append or write would show.
  using store_test::mentions;
  const prompt p(16, 2, 3);
  auto store = ring(2, 8);
  token_by_token(store, p, 0, 12);
  BOOST_TEST_REQUIRE(store.window_start(0) > 0u);  // wrapped
  const auto before = store_test::snap(store);
  const ringkv::windowed_attention attention;
  std::vector<float> out(4 * p.q_row, 7.0f);
  const auto out_untouched = [&] {
    return std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; });
  };
  const auto qs = p.qs(12, 4), ks = p.ks(12, 4), vs = p.vs(12, 4);
  BOOST_CHECK_EXCEPTION(attention.prefill(store, 1, qs, ks, vs, out), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"layer 1 >= layers 1"}); });
  BOOST_CHECK_EXCEPTION(attention.prefill(store, 0, qs, ks.first(ks.size() - 1), vs, out),
                        std::invalid_argument, [](const auto& e) {
                          return mentions(e, {"keys has 127 floats", "kv_heads * head_dim = 32"});
                        });
  BOOST_CHECK_EXCEPTION(
      attention.prefill(store, 0, qs, ks, p.vs(12, 3), out), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"values has 96 floats but keys has 128"}); });
  BOOST_CHECK_EXCEPTION(
      attention.prefill(store, 0, p.qs(12, 3), ks, vs, out), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"out has 512 floats but queries has 384"}); });
  BOOST_CHECK_EXCEPTION(attention.prefill(store, 0, qs, ks, vs, std::span<float>(out).first(10)),
                        std::invalid_argument, [](const auto& e) {
                          return mentions(e, {"out has 10 floats but queries has 512"});
                        });
  BOOST_CHECK_EXCEPTION(
      attention.prefill(store, 0, qs, ks, vs, out, {.window = 9}), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"window 9 > capacity - slack = 8"}); });
  BOOST_CHECK_EXCEPTION(
      attention.prefill(store, 0, qs, ks, vs, out, {.scale = -1.0f}), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"scale -1.000000", "must be finite and >= 0"}); });
  const std::vector<float> two_sinks(2, 0.0f);
  BOOST_CHECK_EXCEPTION(
      attention.prefill(store, 0, qs, ks, vs, out, {.sinks = two_sinks}), std::invalid_argument,
      [](const auto& e) { return mentions(e, {"sinks has 2 values", "q_heads = 8"}); });
  std::vector<float> bad_k(ks.begin(), ks.end());
  bad_k[5] = std::numeric_limits<float>::quiet_NaN();
  BOOST_CHECK_EXCEPTION(
      attention.prefill(store, 0, qs, bad_k, vs, out), std::invalid_argument, [](const auto& e) {
        return mentions(e,
                        {"keys has a non-finite element", "at index 5", "NaN and Inf are refused"});
      });
  // out overlapping the queries
  std::vector<float> shared(qs.begin(), qs.end());
  BOOST_CHECK_EXCEPTION(attention.prefill(store, 0, shared, ks, vs, shared), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"out overlaps queries"}); });
  BOOST_TEST((store_test::snap(store) == before));
  BOOST_TEST(same_bits(shared, qs));
  BOOST_TEST(out_untouched());

  ringkv::default_kv_cache_store dense(
      {.layers = 1, .kv_heads = 2, .head_dim = head_dim, .capacity = 5});
  token_by_token(dense, p, 0, 2);
  const auto dense_before = store_test::snap(dense);
  BOOST_CHECK_EXCEPTION(
      attention.prefill(dense, 0, qs, ks, vs, out), ringkv::cache_full,
      [](const auto& e) { return mentions(e, {"holds 2 of 5 positions", "a chunk of 4 tokens"}); });
  BOOST_TEST((store_test::snap(dense) == dense_before));
  BOOST_TEST(out_untouched());
  std::vector<float> three(3 * p.q_row);
  attention.prefill(dense, 0, p.qs(2, 3), p.ks(2, 3), p.vs(2, 3), three);  // exactly fits
  BOOST_TEST(dense.length(0) == 5u);
}

BOOST_AUTO_TEST_CASE(an_empty_chunk_changes_nothing) {
  auto store = ring(2, 8);
  const ringkv::windowed_attention attention;
  attention.prefill(store, 0, {}, {}, {}, {});
  BOOST_TEST(store.length(0) == 0u);
}

BOOST_AUTO_TEST_CASE(prefill_across_1_2_3_and_8_threads_gives_the_same_bits_and_allocates_nothing) {
  const std::size_t w = 64;
  const prompt p(300, 2, 31);
  std::vector<float> sinks(q_heads, 0.5f);
  auto reference_store = ring(2, w, 2);
  const auto want = prefilled(reference_store, p, 0, 300, {.sinks = sinks});
  for (const std::size_t threads : {1u, 2u, 3u, 8u}) {
    ringkv::default_thread_pool pool(threads);
    trace::recorder rec(64);
    const ringkv::windowed_attention attention(ringkv::attention_options{&rec, &pool});
    auto store = ring(2, w, 2);
    std::vector<float> out(300 * p.q_row);
    attention.prefill(store, 0, p.qs(0, 100), p.ks(0, 100), p.vs(0, 100),
                      std::span<float>(out).first(100 * p.q_row), {.sinks = sinks});
    rec.clear();  // the first chunk grew the scratch: "prefill-scratch"
    const ringkv_test::new_counter counter;
    attention.prefill(store, 0, p.qs(100, 200), p.ks(100, 200), p.vs(100, 200),
                      std::span<float>(out).subspan(100 * p.q_row), {.sinks = sinks});
    BOOST_TEST_INFO("threads " << threads);
    BOOST_TEST(counter.calls() == 0u);
    BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
    BOOST_TEST(same_bits(out, want));
    BOOST_TEST(same_store(store, reference_store));
  }
}

BOOST_AUTO_TEST_CASE(f16_and_bf16_prefill_equals_decode_and_stores_the_rows_rounded_once) {
  // The chunk's rows are rounded into the arena exactly as append stores them, so every query
  // sees the same bits as in token-by-token decode; the store ends up byte-identical.
  for (const auto type : {ringkv::dtype::f16, ringkv::dtype::bf16})
    for (const std::size_t keep : {0u, 2u}) {
      const std::size_t w = 64;
      const prompt p(3 * w + 40, 2, 41);
      auto a = ring(2, w, keep, type), b = ring(2, w, keep, type);
      token_by_token(a, p, 0, 40);
      token_by_token(b, p, 0, 40);
      const auto want = token_by_token(a, p, 40, 3 * w);
      ringkv::scope arena(64);
      trace::recorder rec(64);
      const ringkv::windowed_attention attention(ringkv::attention_options{&rec});
      std::vector<float> got(3 * w * p.q_row);
      attention.prefill(b, 0, p.qs(40, 3 * w), p.ks(40, 3 * w), p.vs(40, 3 * w), got,
                        {.arena = &arena});
      BOOST_TEST_INFO(ringkv::name_of(type) << " keep " << keep);
      BOOST_TEST(same_bits(got, want));
      BOOST_TEST(same_store(a, b));
      // A second call with the arena reset allocates nothing, and says what it copies: the
      // chunk's K and V rows rounded to the store's type (10 tokens × 2 kv heads × head_dim).
      arena.reset();
      rec.clear();
      std::vector<float> out(10 * p.q_row);
      const ringkv_test::new_counter counter;
      attention.prefill(b, 0, p.qs(0, 10), p.ks(0, 10), p.vs(0, 10), out, {.arena = &arena});
      BOOST_TEST(counter.calls() == 0u);
      BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
      std::vector<std::string> copies;
      for (const auto& a : rec.of<trace::adapter_inserted>()) {
        BOOST_TEST(a.kind == "round-chunk-rows");
        BOOST_TEST(a.bytes == 10 * 2 * head_dim * 2);
        copies.emplace_back(a.target);
      }
      BOOST_TEST(copies == (std::vector<std::string>{"keys", "values"}),
                 boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_CASE(tiled_prefill_equals_decode_for_every_target_type_chunking_and_thread_count) {
  // Windows past a segment (1024 positions: partial states merged), query heads in groups of 3
  // (tiles of 21 queries, wide score tiles across queries) and head_dim 18 (a partial last
  // vector on every target); from a fresh ring, so blocks change from 32 to 64 positions inside
  // the first chunk on a machine with a large L2, and the later chunks start on a wrapped ring.
  const shape geometry{6, 2, 18};
  const std::size_t w = 1040, n = 1100;
  const prompt p = prompt_of(geometry, n, 61);
  std::vector<float> sinks(geometry.q_heads);
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.3f * float(h) - 0.5f;
  const std::vector<std::vector<std::size_t>> chunkings = {
      {n}, {517, 1, 64, 518}, std::vector<std::size_t>(n, 1)};
  std::size_t compared = 0;
  ringkv_test::for_each_target([&](const char* target) {
    for (const auto type : {ringkv::dtype::f32, ringkv::dtype::f16, ringkv::dtype::bf16})
      for (const std::size_t keep : {0u, 3u}) {
        const std::span<const float> logits =
            keep ? std::span<const float>(sinks) : std::span<const float>();
        auto decoded = ring_of(geometry, w, keep, type);
        const auto want = token_by_token(decoded, p, 0, n, logits);
        for (std::size_t c = 0; c < chunkings.size(); ++c)
          for (const std::size_t threads : {0u, 2u, 3u}) {
            if (c == 2 && threads == 3) continue;  // chunks of 1: one tile each, as with 2
            auto store = ring_of(geometry, w, keep, type);
            const auto got = prefilled_in(store, p, chunkings[c], threads, logits);
            BOOST_TEST_INFO(target << " " << ringkv::name_of(type) << " keep " << keep
                                   << " chunking " << c << " threads " << threads);
            BOOST_TEST(same_bits(got, want));
            BOOST_TEST(same_store(store, decoded));
            ++compared;
          }
      }
  });
  BOOST_TEST(compared % 48 == 0u);  // 3 types × 2 keeps × 8 runs a target
  BOOST_TEST(compared > 0u);
}

BOOST_AUTO_TEST_CASE(tiled_prefill_takes_decodes_block_for_each_query_on_every_cache_kind) {
  // One query head per kv head with rows of 520 floats: on a machine with a small L2 a query's
  // block falls from 32 to 16 positions once its window passes 252 positions (its kv head's K
  // and V pass 1 MiB), on the others it rises to 64 at 256: tiles must not mix queries of
  // different blocks. Keep 2, so the pinned rows and the rolling ones share a block.
  const shape geometry{2, 2, 520};
  const std::size_t w = 300, n = 400;
  const prompt p = prompt_of(geometry, n, 67);
  std::size_t compared = 0;
  ringkv_test::for_each_target([&](const char* target) {
    for (const auto kind : {ringkv::simd::cache_kind::small_l2, ringkv::simd::cache_kind::large_l2,
                            ringkv::simd::cache_kind::large_l3}) {
      const ringkv_test::cache_kind_override forced(kind);
      auto decoded = ring_of(geometry, w, 2, ringkv::dtype::f32);
      const auto want = token_by_token(decoded, p, 0, n);
      for (const auto& [chunks, threads] : {std::pair{std::vector<std::size_t>{n}, 0u},
                                            std::pair{std::vector<std::size_t>{251, 3, 146}, 2u}}) {
        auto store = ring_of(geometry, w, 2, ringkv::dtype::f32);
        BOOST_TEST_INFO(target << " cache kind " << int(kind) << " threads " << threads);
        BOOST_TEST(same_bits(prefilled_in(store, p, chunks, threads), want));
        ++compared;
      }
    }
  });
  BOOST_TEST(compared % 6 == 0u);
  BOOST_TEST(compared > 0u);
}

BOOST_AUTO_TEST_CASE(the_first_prefill_grows_the_scratch_once_and_the_trace_says_so) {
  // The tiled kernel's scratch is the attention object's: one traced allocation on the first
  // chunk, none after; each chunk is one kernel_run.
  trace::recorder rec(64, true);
  auto store = ring(2, 64, 2, ringkv::dtype::f32);
  const prompt p(200, 2, 71);
  ringkv::default_thread_pool pool(2);
  const ringkv::windowed_attention attention(ringkv::attention_options{&rec, &pool});
  std::vector<float> out(100 * p.q_row);
  attention.prefill(store, 0, p.qs(0, 100), p.ks(0, 100), p.vs(0, 100), out);
  const std::size_t need = ringkv::kernels::prefill_scratch_floats(q_heads, 2, head_dim, 2);
  std::vector<std::string> sites;
  for (const auto& a : rec.of<trace::allocation>()) {
    sites.emplace_back(a.site);
    BOOST_TEST(a.bytes == need * sizeof(float));
  }
  BOOST_TEST(sites == std::vector<std::string>{"prefill-scratch"},
             boost::test_tools::per_element());
  rec.clear();
  attention.prefill(store, 0, p.qs(100, 100), p.ks(100, 100), p.vs(100, 100), out);
  BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == 0);
  std::vector<std::string> kernels;
  for (const auto& k : rec.of<trace::kernel_run>()) kernels.emplace_back(k.kernel);
  BOOST_TEST(kernels == std::vector<std::string>{"attention.prefill"},
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(prefills_on_one_object_from_two_threads_give_the_bits_of_one_at_a_time) {
  // The second of two concurrent prefills finds the scratch held and decodes each query on its
  // own thread instead: the same bits whichever ran tiled.
  const std::size_t w = 64;
  const prompt p(150, 2, 73);
  auto reference_store = ring(2, w, 2);
  const auto want = prefilled(reference_store, p, 0, 150);
  const ringkv::windowed_attention attention;
  std::vector<std::vector<float>> outs(2, std::vector<float>(150 * p.q_row));
  std::vector<ringkv::default_kv_cache_store> stores;
  for (int i = 0; i < 2; ++i) stores.push_back(ring(2, w, 2));
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < 2; ++i)
      threads.emplace_back([&, i] {
        for (std::size_t at = 0; at < 150; at += 10)
          attention.prefill(stores[i], 0, p.qs(at, 10), p.ks(at, 10), p.vs(at, 10),
                            std::span<float>(outs[i]).subspan(at * p.q_row, 10 * p.q_row));
      });
  }
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_TEST(same_bits(outs[i], want));
    BOOST_TEST(same_store(stores[i], reference_store));
  }
}

BOOST_AUTO_TEST_CASE(the_prefill_kernel_refuses_missing_positions_and_short_scratch) {
  using store_test::mentions;
  const prompt p(20, 2, 79);
  auto store = ring(2, 32);
  token_by_token(store, p, 0, 10);
  std::vector<float> out_rows(4 * p.q_row, 7.0f);
  const std::span<float> out(out_rows);
  const std::size_t need = ringkv::kernels::prefill_scratch_floats(q_heads, 2, head_dim, 1);
  ringkv::storage scratch((need + 16) * sizeof(float), "test-scratch");
  const auto floats = scratch.as<float>();
  const auto keys = store.key_window(0, 0, 10), values = store.value_window(0, 0, 10);
  // Queries at 10 … 13 see up to position 13; the store holds 0 … 9.
  BOOST_CHECK_EXCEPTION(ringkv::kernels::prefill(p.qs(10, 4), 4, keys, values, {10, 32, 0}, out,
                                                 0.0f, {}, nullptr, floats),
                        std::invalid_argument, [](const auto& e) {
                          return mentions(e, {"keys cover positions [0, 10)", "see [0, 14)"});
                        });
  BOOST_CHECK_EXCEPTION(
      ringkv::kernels::prefill(p.qs(9, 1), 1, keys, values, {9, 32, 0}, out.first(p.q_row), 0.0f,
                               {}, nullptr, floats.first(need - 1)),
      std::invalid_argument, [](const auto& e) { return mentions(e, {"scratch has"}); });
  BOOST_CHECK_EXCEPTION(
      ringkv::kernels::prefill(p.qs(9, 1), 1, keys, values, {9, 32, 0}, out.first(p.q_row), 0.0f,
                               {}, nullptr, floats.subspan(1, need)),
      std::invalid_argument, [](const auto& e) { return mentions(e, {"64-byte aligned"}); });
  BOOST_CHECK_EXCEPTION(ringkv::kernels::prefill(p.qs(9, 1), 1, keys, values, {9, 4, 4},
                                                 out.first(p.q_row), 0.0f, {}, nullptr, floats),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"exceed keep 4"}); });
  BOOST_TEST(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
  // The last held position, as one query: decode's bits over its window.
  std::vector<float> want(p.q_row);
  ringkv::kernels::decode(p.qs(9, 1), keys, values, want);
  ringkv::kernels::prefill(p.qs(9, 1), 1, keys, values, {9, 32, 0}, out.first(p.q_row), 0.0f, {},
                           nullptr, floats);
  BOOST_TEST(same_bits(out.first(p.q_row), want));
}
