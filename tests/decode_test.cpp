#define BOOST_TEST_MODULE decode
#include <boost/test/unit_test.hpp>

#include <coroutine>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <ranges>
#include <span>
#include <stdexcept>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/operations.hpp>
#include <range/v3/view/take.hpp>

#include "count_new.hpp"

import ringkv;

#include "copying_store.hpp"

namespace trace = ringkv::trace;

namespace {
// Seeded random q/k/v for n tokens with the given geometry.
struct token_data {
  std::size_t q_width, kv_width;
  std::vector<float> q, k, v;
  std::vector<ringkv::token_qkv> tokens;

  token_data(std::size_t n, std::size_t q_heads, std::size_t kv_heads, std::size_t head_dim,
             unsigned seed)
      : q_width(q_heads * head_dim), kv_width(kv_heads * head_dim), q(n * q_width), k(n * kv_width),
        v(n * kv_width) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto* buf : {&q, &k, &v})
      for (float& x : *buf) x = nd(rng);
    for (std::size_t i = 0; i < n; ++i)
      tokens.push_back({std::span<const float>(q).subspan(i * q_width, q_width),
                        std::span<const float>(k).subspan(i * kv_width, kv_width),
                        std::span<const float>(v).subspan(i * kv_width, kv_width)});
  }
};

ringkv::default_kv_cache_store ring(std::size_t kv_heads, std::size_t head_dim,
                                    std::size_t capacity, trace::sink& sink = trace::null_sink(),
                                    std::size_t layers = 1) {
  return ringkv::default_kv_cache_store(
      ringkv::kv_cache_config{
          .layers = layers, .kv_heads = kv_heads, .head_dim = head_dim, .capacity = capacity},
      ringkv::store_options{.sliding_window = true}, sink);
}

std::vector<float> read_all_keys(const ringkv::kv_cache_store& s, std::size_t layer) {
  const auto& c = s.config();
  std::vector<float> out(c.kv_heads * (s.length(layer) - s.window_start(layer)) * c.head_dim);
  s.read_keys(layer, s.window_start(layer), s.length(layer), out);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_stream_equals_a_hand_written_loop_of_append_and_decode_step_bit_for_bit) {
  struct shape {
    std::size_t q_heads, kv_heads, head_dim, window;
  };
  for (const shape sh :
       {shape{1, 1, 16, 5}, shape{8, 2, 32, 17}, shape{4, 4, 8, 1}, shape{8, 1, 64, 33}}) {
    const std::size_t n = 3 * sh.window + 11;  // wraps the ring of capacity `window` 3+ times
    token_data data(n, sh.q_heads, sh.kv_heads, sh.head_dim, 7);
    auto streamed = ring(sh.kv_heads, sh.head_dim, sh.window);
    auto by_hand = ring(sh.kv_heads, sh.head_dim, sh.window);
    const ringkv::windowed_attention attention;
    std::vector<float> expected(data.q_width);
    std::size_t i = 0;
    for (std::span<const float> row : ringkv::decode(streamed, 0, data.tokens)) {
      const auto& t = data.tokens[i];
      const std::size_t p = by_hand.append(0, t.k, t.v);
      const std::size_t from = p + 1 > sh.window ? p + 1 - sh.window : 0;
      attention.decode_step(t.q, by_hand.key_window(0, from, p + 1),
                            by_hand.value_window(0, from, p + 1), expected);
      BOOST_REQUIRE_EQUAL(row.size(), expected.size());
      BOOST_REQUIRE(std::memcmp(row.data(), expected.data(), row.size() * sizeof(float)) == 0);
      ++i;
    }
    BOOST_TEST(i == n);
    BOOST_TEST(streamed.length(0) == n);
    BOOST_TEST(streamed.window_start(0) == n - sh.window);
  }
}

// Streams `take(stream, n)` over a fresh wrapped ring; returns (rows seen, tokens appended).
template <class Take>
std::pair<std::size_t, std::size_t> rows_and_appends(Take take, std::size_t n) {
  token_data data(50, 2, 1, 8, 11);
  auto store = ring(1, 8, 8);
  std::size_t rows = 0;
  for (std::span<const float> row : take(ringkv::decode(store, 0, data.tokens), n))
    rows += row.size() == 16u;
  return {rows, store.length(0)};
}

BOOST_AUTO_TEST_CASE(
    the_stream_composes_with_std_and_range_v3_take_and_appends_only_what_was_taken) {
  const auto std_take = [](auto&& r, std::size_t n) { return std::move(r) | std::views::take(n); };
  const auto v3_take = [](auto&& r, std::size_t n) {
    return std::move(r) | ranges::views::take(n);
  };
  for (std::size_t n : {1u, 5u, 12u}) {
    BOOST_TEST((rows_and_appends(std_take, n) == std::pair{n, n}));
    BOOST_TEST((rows_and_appends(v3_take, n) == std::pair{n, n}));
  }
}

BOOST_AUTO_TEST_CASE(breaking_out_early_stops_appending) {
  token_data data(30, 1, 1, 4, 13);
  auto store = ring(1, 4, 6);
  std::size_t seen = 0;
  for (auto row : ringkv::decode(store, 0, data.tokens)) {
    (void)row;
    if (++seen == 9) break;
  }
  BOOST_TEST(store.length(0) == 9u);
}

BOOST_AUTO_TEST_CASE(the_tokens_can_come_from_another_generator) {
  token_data data(20, 2, 2, 4, 14);
  auto source =
      [](const std::vector<ringkv::token_qkv>& all) -> ringkv::generator<ringkv::token_qkv> {
    for (const auto& t : all) co_yield t;
  }(data.tokens);
  auto store = ring(2, 4, 7);
  std::size_t rows = 0;
  for (auto row : ringkv::decode(store, 0, std::move(source))) rows += row.size() == 8;
  BOOST_TEST(rows == 20u);
}

// The stream's increments are lazy (see ringkv::generator): the step runs when the next row is
// read, so that is where its exception comes out.
BOOST_AUTO_TEST_CASE(
    an_exception_in_the_token_source_comes_out_of_the_step_and_the_store_keeps_what_it_had) {
  token_data data(10, 1, 1, 4, 15);
  auto failing =
      [](const std::vector<ringkv::token_qkv>& all) -> ringkv::generator<ringkv::token_qkv> {
    for (std::size_t i = 0; i < 4; ++i) co_yield all[i];
    throw std::runtime_error("tokenizer failed");
  }(data.tokens);
  auto store = ring(1, 4, 3);
  auto stream = ringkv::decode(store, 0, std::move(failing));
  auto it = stream.begin();
  for (int i = 0; i < 3; ++i) BOOST_TEST((*++it).size() == 4u);
  const auto keys_before = read_all_keys(store, 0);
  BOOST_TEST(store.length(0) == 4u);
  BOOST_CHECK_THROW(*++it, std::runtime_error);
  BOOST_TEST(store.length(0) == 4u);
  BOOST_TEST(read_all_keys(store, 0) == keys_before, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_bad_token_comes_out_of_its_step_with_the_store_unchanged) {
  token_data data(6, 2, 1, 4, 16);
  std::vector<float> short_k(3);
  data.tokens[3].k = short_k;  // kv_heads * head_dim is 4
  auto store = ring(1, 4, 4);
  auto stream = ringkv::decode(store, 0, data.tokens);
  auto it = stream.begin();
  (void)*++it;
  (void)*++it;
  const auto keys_before = read_all_keys(store, 0);
  BOOST_CHECK_EXCEPTION(*++it, std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("kv_heads * head_dim = 4") != std::string::npos;
  });
  BOOST_TEST(store.length(0) == 3u);
  BOOST_TEST(read_all_keys(store, 0) == keys_before, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(bad_options_are_refused_at_the_call) {
  token_data data(2, 1, 1, 4, 17);
  auto store = ring(1, 4, 4);
  BOOST_CHECK_EXCEPTION(ringkv::decode(store, 0, data.tokens, {.window = 5}), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("capacity - slack = 4") !=
                                 std::string::npos;
                        });
  BOOST_CHECK_EXCEPTION(
      ringkv::decode(store, 1, data.tokens), std::out_of_range, [](const std::out_of_range& e) {
        return std::string(e.what()).find("layer 1 >= layers 1") != std::string::npos;
      });
  std::vector<float> sinks(3);
  auto stream = ringkv::decode(store, 0, data.tokens, {.sinks = sinks});
  // The count of sink logits needs the query's width: checked at the first token, before it is
  // appended.
  BOOST_CHECK_EXCEPTION(stream.begin(), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("sinks has 3 values; expected none or q_heads = 1") !=
           std::string::npos;
  });
  BOOST_TEST(store.length(0) == 0u);
}

// Every refusal decode_step could make of the options is made before a token is appended: the
// stream refusing after the append would leave the layer one token longer and no row out.
BOOST_AUTO_TEST_CASE(a_stream_refuses_what_its_step_would_refuse_before_appending_anything) {
  token_data data(4, 2, 1, 4, 21);
  auto store = ring(1, 4, 4);
  for (const float scale :
       {std::numeric_limits<float>::infinity(), -1.0f, std::numeric_limits<float>::quiet_NaN()})
    BOOST_CHECK_EXCEPTION(ringkv::decode(store, 0, data.tokens, {.scale = scale}),
                          std::invalid_argument, [&](const std::invalid_argument& e) {
                            const std::string m = e.what();
                            return m.find("ringkv::decode: scale " + std::to_string(scale)) == 0 &&
                                   m.find("must be finite and >= 0 (0 means 1/sqrt(head_dim))") !=
                                       std::string::npos;
                          });
  auto stream = ringkv::decode(store, 0, data.tokens);
  auto it = stream.begin();
  (void)*++it;  // two tokens held
  const auto keys_before = read_all_keys(store, 0);
  const std::vector<float> sinks{0.5f, std::numeric_limits<float>::quiet_NaN()};
  auto refused = ringkv::decode(store, 0, data.tokens, {.sinks = sinks});
  BOOST_CHECK_EXCEPTION(refused.begin(), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("sinks[1] is NaN") != std::string::npos;
  });
  BOOST_TEST(store.length(0) == 2u);
  BOOST_TEST(read_all_keys(store, 0) == keys_before, boost::test_tools::per_element());
}

/// Pulls the stream's first row (which may allocate: the output row, the arena), then the rest,
/// checking those allocate nothing — no call of operator new, no allocation in rec (the sink
/// wired into the store and the stream); returns how many rows came after the first.
template <class Stream>
std::size_t rows_after_the_first_allocate_nothing(Stream& stream, const trace::recorder& rec) {
  auto it = stream.begin();
  const auto allocation_events = ranges::distance(rec.of<trace::allocation>());
  ringkv_test::new_counter counter;
  std::size_t rows = 0;
  for (++it; it != std::default_sentinel; ++it) ++rows;
  BOOST_TEST(counter.calls() == 0u);
  BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == allocation_events);
  return rows;
}

BOOST_AUTO_TEST_CASE(a_thousand_tokens_on_a_wrapped_ring_allocate_nothing_after_the_first) {
  token_data data(1001, 8, 2, 32, 18);
  trace::recorder rec(4096);
  auto store = ring(2, 32, 64, rec);
  auto stream = ringkv::decode(store, 0, data.tokens, {}, rec);
  BOOST_TEST(rows_after_the_first_allocate_nothing(stream, rec) == 1000u);
  // What the first row took is in the trace too: the output row [8 q heads × 32] among it.
  std::size_t row_bytes = 0;
  for (const auto& a : rec.of<trace::allocation>())
    if (a.site == "decode-row") row_bytes += a.bytes;
  BOOST_TEST(row_bytes == 8u * 32u * sizeof(float));
  BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 0);
  BOOST_TEST(store.window_start(0) == 1001u - 64u);
}

// A store whose windows are copies (a user's store that cannot hand out its rows) and the
// gather option copy a window that grows token by token until the ring is full: the arena takes
// the full window's size once, at the first token, not a larger slab at every token.
BOOST_AUTO_TEST_CASE(a_stream_whose_windows_copy_allocates_nothing_after_the_first_token) {
  token_data data(100, 4, 2, 16, 22);
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = 16, .capacity = 40};
  for (const bool gather : {false, true}) {
    BOOST_TEST_CONTEXT("gather " << gather) {
      trace::recorder rec(4096);
      store_test::copying_store copying(c, {.sliding_window = true}, rec);
      auto plain = ring(2, 16, 40, rec);
      ringkv::kv_cache_store& store =
          gather ? static_cast<ringkv::kv_cache_store&>(plain) : copying;
      auto stream = ringkv::decode(store, 0, data.tokens, {.gather = gather}, rec);
      BOOST_TEST(rows_after_the_first_allocate_nothing(stream, rec) == 99u);
      BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 2 * 100);
      BOOST_TEST(store.window_start(0) == 100u - 40u);
    }
  }
}

// A compressed store is attended from its codes (compressed_kv_attention), as a caller would by
// hand: no dequantized copy, no allocation after the first token, the same bits.
BOOST_AUTO_TEST_CASE(a_stream_over_a_compressed_store_attends_its_codes_without_a_copy) {
  token_data data(90, 4, 2, 32, 24);
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = 32, .capacity = 40};
  const ringkv::turboquant_options tq{.key_bits = 4, .value_bits = 3, .qjl = true};
  const ringkv::store_options ring_with_sinks{.sliding_window = true, .keep = 2};
  trace::recorder rec(4096);
  ringkv::turboquant_kv_cache_store streamed(c, tq, ring_with_sinks, rec);
  ringkv::turboquant_kv_cache_store by_hand(c, tq, ring_with_sinks);
  const ringkv::compressed_kv_attention attention;
  std::vector<float> want(data.q_width);
  std::size_t t = 0;
  for (std::span<const float> row : ringkv::decode(streamed, 0, data.tokens)) {
    const std::size_t p = by_hand.append(0, data.tokens[t].k, data.tokens[t].v);
    const std::size_t from = p + 1 > 40 ? p + 1 - (40 - 2) : 0;  // window 40, 2 pinned
    attention.decode_step(data.tokens[t].q, by_hand.compressed_key_window(0, from, p + 1),
                          by_hand.compressed_value_window(0, from, p + 1), want);
    BOOST_REQUIRE(std::memcmp(row.data(), want.data(), want.size() * sizeof(float)) == 0);
    ++t;
  }
  BOOST_TEST(t == 90u);
  BOOST_TEST(streamed.window_start(0) == 90u - 38u);
  ringkv::turboquant_kv_cache_store traced(c, tq, ring_with_sinks, rec);
  auto stream = ringkv::decode(traced, 0, data.tokens, {}, rec);
  BOOST_TEST(rows_after_the_first_allocate_nothing(stream, rec) == 89u);
  BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 0);
}

BOOST_AUTO_TEST_CASE(the_gather_option_copies_each_window_and_says_so_in_the_trace) {
  token_data data(20, 2, 1, 8, 19);
  trace::recorder rec(4096);
  auto store = ring(1, 8, 6, rec);
  auto plain = ring(1, 8, 6);
  std::vector<std::vector<float>> expected;
  for (auto row : ringkv::decode(plain, 0, data.tokens))
    expected.emplace_back(row.begin(), row.end());
  std::size_t i = 0;
  for (auto row : ringkv::decode(store, 0, data.tokens, {.gather = true}, rec)) {
    BOOST_REQUIRE(std::memcmp(row.data(), expected[i].data(), row.size() * sizeof(float)) == 0);
    ++i;
  }
  BOOST_TEST(ranges::distance(rec.of<trace::adapter_inserted>()) == 2 * 20);
}

// layer_decoder: the per-token call a model loop makes (layer l's q, k, v come from layer
// l - 1's output of the same token), with the bits of the stream.
BOOST_AUTO_TEST_CASE(a_layer_decoder_gives_the_streams_rows_bit_for_bit_on_every_store_kind) {
  token_data data(3 * 24 + 5, 8, 2, 32, 31);
  ringkv::default_thread_pool pool(2);
  const ringkv::kv_cache_config c{.layers = 2, .kv_heads = 2, .head_dim = 32, .capacity = 24};
  const ringkv::store_options ring_options{.sliding_window = true};
  std::vector<float> sinks{0.5f, -1.0f, 0.0f, 2.0f, 0.25f, -0.5f, 1.0f, 0.0f};
  for (int kind = 0; kind < 4; ++kind)
    for (ringkv::thread_pool* p :
         {static_cast<ringkv::thread_pool*>(nullptr), static_cast<ringkv::thread_pool*>(&pool)}) {
      BOOST_TEST_CONTEXT("store kind " << kind << ", pool " << (p != nullptr)) {
        auto make = [&]() -> std::unique_ptr<ringkv::kv_cache_store> {
          ringkv::kv_cache_config cc = c;
          if (kind == 1) cc.key_type = cc.value_type = ringkv::dtype::f16;
          if (kind == 2) return std::make_unique<ringkv::int8_kv_cache_store>(cc, ring_options);
          if (kind == 3)
            return std::make_unique<ringkv::turboquant_kv_cache_store>(
                cc, ringkv::turboquant_options{}, ring_options);
          return std::make_unique<ringkv::default_kv_cache_store>(cc, ring_options);
        };
        const ringkv::decode_options o{.window = 20, .sinks = sinks, .pool = p};
        auto streamed = make();
        auto stepped = make();
        ringkv::layer_decoder decoder(*stepped, 1, o);
        BOOST_TEST(decoder.window() == 20u);
        std::vector<float> out(data.q_width);
        std::size_t i = 0;
        for (std::span<const float> row : ringkv::decode(*streamed, 1, data.tokens, o)) {
          decoder.step(data.tokens[i++], out);
          BOOST_REQUIRE(std::memcmp(row.data(), out.data(), out.size() * sizeof(float)) == 0);
        }
        BOOST_TEST(i == data.tokens.size());
        BOOST_TEST(stepped->length(1) == i);
        BOOST_TEST(stepped->length(0) == 0u);
      }
    }
}

BOOST_AUTO_TEST_CASE(a_warm_layer_decoder_allocates_nothing_on_a_wrapped_ring) {
  token_data data(1001, 8, 2, 32, 32);
  trace::recorder rec(4096);
  ringkv::default_thread_pool pool(2);
  for (ringkv::thread_pool* p :
       {static_cast<ringkv::thread_pool*>(nullptr), static_cast<ringkv::thread_pool*>(&pool)}) {
    auto store = ring(2, 32, 64, rec);
    ringkv::layer_decoder decoder(store, 0, {.pool = p}, rec);
    std::vector<float> out(data.q_width);
    decoder.step(data.tokens[0], out);  // the first step sizes the pool's scratch
    const auto allocation_events = ranges::distance(rec.of<trace::allocation>());
    ringkv_test::new_counter counter;
    for (std::size_t i = 1; i < data.tokens.size(); ++i) decoder.step(data.tokens[i], out);
    BOOST_TEST(counter.calls() == 0u);
    BOOST_TEST(ranges::distance(rec.of<trace::allocation>()) == allocation_events);
    BOOST_TEST(store.window_start(0) == 1001u - 64u);
  }
}

BOOST_AUTO_TEST_CASE(
    a_layer_decoder_refuses_a_bad_token_or_output_with_the_store_and_output_unchanged) {
  token_data data(6, 2, 1, 4, 33);
  auto store = ring(1, 4, 4);
  ringkv::layer_decoder decoder(store, 0);
  std::vector<float> out(data.q_width);
  decoder.step(data.tokens[0], out);
  decoder.step(data.tokens[1], out);
  const auto keys_before = read_all_keys(store, 0);
  const std::vector<float> out_before = out;
  std::vector<float> short_k(3), wide_out(data.q_width + 1);
  ringkv::token_qkv bad = data.tokens[2];
  bad.k = short_k;
  BOOST_CHECK_EXCEPTION(
      decoder.step(bad, out), std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("kv_heads * head_dim = 4") != std::string::npos;
      });
  BOOST_CHECK_EXCEPTION(
      decoder.step(data.tokens[2], wide_out), std::invalid_argument,
      [](const std::invalid_argument& e) {
        return std::string(e.what()).find("layer_decoder::step: out has 9 floats, token q has 8") !=
               std::string::npos;
      });
  std::vector<float> nan_q(data.q_width, std::numeric_limits<float>::quiet_NaN());
  BOOST_CHECK_THROW(decoder.step({nan_q, data.tokens[2].k, data.tokens[2].v}, out),
                    std::invalid_argument);
  BOOST_TEST(store.length(0) == 2u);
  BOOST_TEST(read_all_keys(store, 0) == keys_before, boost::test_tools::per_element());
  BOOST_TEST(out == out_before, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_layer_decoder_refuses_bad_options_at_construction) {
  auto store = ring(1, 4, 4);
  BOOST_CHECK_EXCEPTION(ringkv::layer_decoder(store, 0, {.window = 5}), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("capacity - slack = 4") !=
                                 std::string::npos;
                        });
  BOOST_CHECK_THROW(ringkv::layer_decoder(store, 1), std::out_of_range);
  BOOST_CHECK_THROW(ringkv::layer_decoder(store, 0, {.scale = -1.0f}), std::invalid_argument);
  BOOST_TEST(store.length(0) == 0u);
}

// One object a layer: layer_attention's prefill of a prompt and its steps after it give the
// decode stream's bits (with sinks, a smaller window than the ring, a pool), over the default
// store and an int8 one (codes); the decoder and the stream are forms of it.
BOOST_AUTO_TEST_CASE(a_layer_attentions_prefill_and_steps_give_the_decode_streams_bits) {
  token_data data(40, 4, 2, 8, 61);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  ringkv::default_thread_pool pool(2);
  const ringkv::layer_options o{.window = 10, .sinks = sinks, .pool = &pool};
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = 8, .capacity = 12};
  const ringkv::store_options ring_options{.sliding_window = true};
  std::vector<std::unique_ptr<ringkv::kv_cache_store>> streamed, layered;
  for (auto* stores : {&streamed, &layered}) {
    stores->push_back(std::make_unique<ringkv::default_kv_cache_store>(c, ring_options));
    stores->push_back(std::make_unique<ringkv::int8_kv_cache_store>(c, ring_options));
  }
  for (std::size_t s = 0; s < streamed.size(); ++s) {
    std::vector<float> want;
    for (std::span<const float> row : ringkv::decode(*streamed[s], 0, data.tokens, o))
      want.insert(want.end(), row.begin(), row.end());
    ringkv::layer_attention layer(*layered[s], 0, o);
    BOOST_TEST(layer.window() == 10u);
    std::vector<float> got(want.size());
    const std::size_t chunk = 25, qw = data.q_width, kw = data.kv_width;
    layer.prefill(std::span(data.q).first(chunk * qw), std::span(data.k).first(chunk * kw),
                  std::span(data.v).first(chunk * kw), std::span(got).first(chunk * qw));
    for (std::size_t i = chunk; i < data.tokens.size(); ++i)
      layer.step(data.tokens[i], std::span(got).subspan(i * qw, qw));
    BOOST_TEST(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    BOOST_TEST(layered[s]->length(0) == 40u);
  }
}
