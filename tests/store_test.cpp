#define BOOST_TEST_MODULE store
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>

#include "count_new.hpp"

import ringkv;

#include "store_support.hpp"

namespace trace = ringkv::trace;
using namespace store_test;
using ringkv::default_kv_cache_store;
using ringkv::kv_cache_config;
using ringkv::kv_side;
using ringkv::store_options;

namespace {
constexpr kv_side K = kv_side::keys, V = kv_side::values;

kv_cache_config config(std::size_t capacity, std::size_t head_dim = 3, std::size_t heads = 2,
                       std::size_t layers = 1) {
  return {.layers = layers, .kv_heads = heads, .head_dim = head_dim, .capacity = capacity};
}
store_options ring(std::size_t keep = 0, std::size_t slack = 0) {
  return {.sliding_window = true, .keep = keep, .slack = slack};
}
std::vector<float> read(const ringkv::kv_cache_store& s, kv_side side, std::size_t layer,
                        std::size_t from, std::size_t to) {
  std::vector<float> out(s.config().row_floats() * (to - from));
  if (side == K)
    s.read_keys(layer, from, to, out);
  else
    s.read_values(layer, from, to, out);
  return out;
}
std::vector<std::size_t> range(std::size_t from, std::size_t to) {
  std::vector<std::size_t> v;
  for (std::size_t p = from; p < to; ++p) v.push_back(p);
  return v;
}
std::vector<std::size_t> first_positions(const ringkv::windowed_kv& w) {
  std::vector<std::size_t> v;
  for (std::size_t i = 0; i < w.runs().size(); ++i) v.push_back(w.run_first_position(i));
  return v;
}
std::vector<std::size_t> run_lengths(const ringkv::windowed_kv& w) {
  std::vector<std::size_t> v;
  for (const auto& r : w.runs()) v.push_back(r.positions());
  return v;
}
// Slot a run starts at in the store's buffer (head 0).
std::size_t slot_of_run(const default_kv_cache_store& s, const ringkv::tensor_view& run) {
  return std::size_t(run.data() - s.key_storage(0).data()) / (run.head_dim() * 4);
}
template <class R>
std::ptrdiff_t count(R&& r) {  // filter views are not const-iterable
  return ranges::distance(r);
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_config_with_a_zero_size_is_refused_naming_the_field) {
  const char* fields[] = {"layers", "kv_heads", "head_dim", "capacity"};
  for (int i = 0; i < 4; ++i) {
    kv_cache_config c = config(4);
    (i == 0 ? c.layers : i == 1 ? c.kv_heads : i == 2 ? c.head_dim : c.capacity) = 0;
    BOOST_CHECK_EXCEPTION(c.validate(), std::invalid_argument,
                          [&](const auto& e) { return mentions(e, {fields[i], "> 0"}); });
    BOOST_CHECK_EXCEPTION(default_kv_cache_store{c}, std::invalid_argument,
                          [&](const auto& e) { return mentions(e, {fields[i]}); });
  }
  BOOST_CHECK_NO_THROW(config(4).validate());
}

BOOST_AUTO_TEST_CASE(ring_options_are_checked_against_the_capacity) {
  auto refused = [](store_options o, std::initializer_list<const char*> words) {
    trace::recorder rec(8);
    BOOST_CHECK_EXCEPTION(default_kv_cache_store(config(4), o, rec), std::invalid_argument,
                          [&](const auto& e) { return mentions(e, words); });
    BOOST_TEST(rec.emitted() == 0u);  // refused before allocating anything
  };
  refused({.keep = 1}, {"keep 1", "sliding_window"});
  refused({.slack = 1}, {"slack 1", "sliding_window"});
  refused(ring(2, 2), {"keep 2", "slack 2", "capacity 4"});
  refused(ring(4, 0), {"keep 4", "capacity 4"});
  BOOST_CHECK_NO_THROW(default_kv_cache_store(config(4), ring(2, 1)));
  BOOST_CHECK_NO_THROW(default_kv_cache_store(config(1), ring()));
}

BOOST_AUTO_TEST_CASE(construction_allocates_one_traced_buffer_per_layer_per_side_and_no_more) {
  trace::recorder rec(32);
  {
    default_kv_cache_store s(config(5, 3, 2, 3), {}, rec);
    std::vector<std::string> sites;
    for (const auto& a : rec.of<trace::allocation>()) {
      sites.emplace_back(a.site);
      BOOST_TEST(a.bytes == 2u * 5u * 3u * 4u);  // [kv_heads][capacity][head_dim] f32
    }
    BOOST_TEST(
        sites == (std::vector<std::string>{"kv-cache-keys", "kv-cache-values", "kv-cache-keys",
                                           "kv-cache-values", "kv-cache-keys", "kv-cache-values"}),
        boost::test_tools::per_element());
    rows r(s.config());
    r.append_all(s, 5);
    s.key_window(0, 0, 5);
    BOOST_TEST(rec.emitted() == 6u);
  }
  BOOST_TEST(count(rec.of<trace::release>()) == 6);
}

BOOST_AUTO_TEST_CASE(the_memory_report_counts_buffers_and_held_rows_per_side) {
  default_kv_cache_store s(config(5, 3, 2, 2), ring(1));
  rows r(s.config());
  auto m = s.memory();
  BOOST_TEST(m.keys.physical_bytes == 2u * (2 * 5 * 3 * 4));
  BOOST_TEST(m.physical_bytes == 2 * m.keys.physical_bytes);
  BOOST_TEST(m.logical_bytes == 0u);
  BOOST_TEST(m.compression_ratio == 1.0);
  for (int i = 0; i < 8; ++i) r.append(s, 0);  // layer 0 wraps: holds 1 pinned + 4 rolling rows
  r.append(s, 1);
  m = s.memory();
  BOOST_TEST(m.keys.logical_bytes == (5u + 1u) * 6u * 4u);
  BOOST_TEST(m.values.logical_bytes == m.keys.logical_bytes);
  BOOST_TEST(m.logical_bytes == 2 * m.keys.logical_bytes);
  BOOST_TEST(s.held(0) == 5u);
  BOOST_TEST(s.held(1) == 1u);

  kv_cache_config half = config(5, 3, 2, 2);
  half.key_type = ringkv::dtype::f16;
  half.value_type = ringkv::dtype::bf16;
  const auto mh = default_kv_cache_store(half).memory();
  BOOST_TEST(mh.physical_bytes == m.physical_bytes / 2);
  BOOST_TEST(mh.compression_ratio == 2.0);
}

BOOST_AUTO_TEST_CASE(a_non_ring_cache_still_refuses_to_overflow_and_window_start_stays_zero) {
  default_kv_cache_store s(config(4));
  rows r(s.config());
  for (std::size_t p = 0; p < 4; ++p) {
    BOOST_TEST(r.append(s, 0) == p);
    BOOST_TEST(s.window_start(0) == 0u);
  }
  const snapshot before = snap(s);
  r.fill(0, 4);
  BOOST_CHECK_EXCEPTION(s.append(0, r.key, r.value), ringkv::cache_full,
                        [](const auto& e) { return mentions(e, {"layer 0", "capacity 4"}); });
  BOOST_CHECK_THROW(s.append(0, r.key, r.value), std::length_error);
  BOOST_TEST((snap(s) == before));
  BOOST_TEST(s.length(0) == 4u);
  BOOST_TEST(s.window_start(0) == 0u);
  BOOST_TEST(wrong_elements(s.key_window(0, 0, 4), K, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(a_ring_keeps_the_newest_positions_and_forgets_the_rest) {
  default_kv_cache_store s(config(4), ring());
  rows r(s.config());
  r.append_all(s, 6);
  BOOST_TEST(s.length(0) == 6u);
  BOOST_TEST(s.window_start(0) == 2u);
  BOOST_CHECK_EXCEPTION(s.key_window(0, 1, 6), std::out_of_range, [](const auto& e) {
    return mentions(e, {"from 1", "to 6", "window_start 2", "length 6"});
  });
  BOOST_CHECK_THROW(s.value_window(0, 1, 6), std::out_of_range);
  std::vector<float> out(6 * 6);
  BOOST_CHECK_EXCEPTION(s.read_keys(0, 0, 6, out), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"from 0", "window_start 2"}); });
  BOOST_CHECK_THROW(s.read_values(0, 1, 6, std::span(out).first(30)), std::out_of_range);
  const auto w = s.key_window(0, 2, 6);
  BOOST_TEST(positions_of(w) == range(2, 6), boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(w, K, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(a_wrapped_window_is_two_runs_in_position_order) {
  default_kv_cache_store s(config(4), ring());
  rows r(s.config());
  r.append_all(s, 6);
  // The slots hold positions 4, 5, 2, 3: check the buffer itself, head 1.
  const auto buf = s.key_storage(0).as<float>();
  const std::size_t held_in_slot[] = {4, 5, 2, 3};
  for (std::size_t slot = 0; slot < 4; ++slot) {
    BOOST_TEST(s.slot_of(held_in_slot[slot]) == slot);
    for (std::size_t d = 0; d < 3; ++d)
      BOOST_TEST(buf[1 * 4 * 3 + slot * 3 + d] == key_at(0, held_in_slot[slot], 1, d));
  }
  for (kv_side side : {K, V}) {
    const auto w = side == K ? s.key_window(0, 2, 6) : s.value_window(0, 2, 6);
    BOOST_TEST(run_lengths(w) == (std::vector<std::size_t>{2, 2}),
               boost::test_tools::per_element());
    BOOST_TEST(first_positions(w) == (std::vector<std::size_t>{2, 4}),
               boost::test_tools::per_element());
    BOOST_TEST(w.wrapped());
    BOOST_TEST(w.length() == 4u);
    BOOST_TEST(w.first_position() == 2u);
    BOOST_TEST(w.end_position() == 6u);
    BOOST_TEST(w.runs()[0].head_stride() == 4u * 3u);  // capacity * head_dim
    BOOST_TEST(wrong_elements(w, side, 0) == 0u);
  }
  const auto w = s.key_window(0, 2, 6);
  BOOST_TEST(slot_of_run(s, w.head()) == 2u);
  BOOST_TEST(slot_of_run(s, *w.tail()) == 0u);
  for (auto [from, to] : {std::pair{2, 4}, std::pair{4, 6}, std::pair{3, 4}}) {
    const auto one = s.key_window(0, from, to);
    BOOST_TEST(one.runs().size() == 1u);
    BOOST_TEST(!one.wrapped());
    BOOST_TEST(!one.tail().has_value());
    BOOST_TEST(positions_of(one) == range(from, to), boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(reading_across_the_wrap_returns_positions_in_order) {
  default_kv_cache_store s(config(5, 4, 3, 2), ring());
  rows r(s.config());
  r.append_all(s, 13);
  for (std::size_t l = 0; l < 2; ++l) {
    BOOST_TEST(s.window_start(l) == 8u);
    for (kv_side side : {K, V}) {
      BOOST_TEST(wrong_read(read(s, side, l, 8, 13), side, l, 8, 13, 3, 4) == 0u);
      BOOST_TEST(wrong_read(read(s, side, l, 9, 12), side, l, 9, 12, 3, 4) == 0u);
      const auto w = side == K ? s.key_window(l, 8, 13) : s.value_window(l, 8, 13);
      BOOST_TEST(positions_of(w) == range(8, 13), boost::test_tools::per_element());
      BOOST_TEST(wrong_elements(w, side, l) == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_window_is_zero_copy_over_the_stores_own_storage) {
  trace::recorder rec(64);
  default_kv_cache_store s(config(4), ring(), rec);
  rows r(s.config());
  r.append_all(s, 6);
  rec.clear();
  ringkv::scope arena(1024);
  const ringkv::kv_cache_store& generic = s;
  for (const auto& w : {s.key_window(0, 2, 6), generic.key_window(0, 2, 6, arena)}) {
    for (const auto& run : w.runs()) {
      BOOST_TEST(s.key_storage(0).contains(run.data()));
      BOOST_TEST(s.key_storage(0).contains(run.row_bytes(1, run.positions() - 1) + 11));
    }
  }
  const auto values = generic.value_window(0, 2, 6, arena);  // runs() is a span into it
  for (const auto& run : values.runs()) BOOST_TEST(s.value_storage(0).contains(run.data()));
  BOOST_TEST(arena.live() == 0u);
  BOOST_TEST(rec.emitted() == 0u);  // no copy, no allocation

  const auto old = s.key_window(0, 3, 6);
  r.append(s, 0);  // position 6 overwrites slot 2 (position 2)
  const auto fresh = s.key_window(0, 3, 7);
  BOOST_TEST(positions_of(fresh) == range(3, 7), boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(fresh, K, 0) == 0u);
  BOOST_TEST(fresh.runs().back().row<float>(0, fresh.runs().back().positions() - 1)[0] ==
             key_at(0, 6, 0, 0));
  BOOST_TEST(old.runs()[0].data() == fresh.runs()[0].data());  // the same memory, not a copy
}

BOOST_AUTO_TEST_CASE(the_gather_adapter_agrees_with_a_ring_window_bit_for_bit_and_is_traced_once) {
  default_kv_cache_store s(config(6, 5, 3), ring(2));
  rows r(s.config());
  r.append_all(s, 12);
  const auto w = s.key_window(0, 8, 12);  // pinned + ring head + ring tail
  BOOST_REQUIRE(w.runs().size() == 3u);
  trace::recorder rec(16);
  ringkv::scope arena(4096);
  const auto g = w.gathered(arena, rec, "keys");
  BOOST_TEST(positions_of(g) == positions_of(w), boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(g, K, 0) == 0u);
  std::size_t row = 0;
  for (std::size_t i = 0; i < w.runs().size(); ++i)
    for (std::size_t p = 0; p < w.runs()[i].positions(); ++p, ++row)
      for (std::size_t h = 0; h < 3; ++h) {
        const std::size_t gi = row < 2 ? 0 : 1, gp = row < 2 ? row : row - 2;
        BOOST_TEST(std::memcmp(w.runs()[i].row_bytes(h, p), g.runs()[gi].row_bytes(h, gp), 20) ==
                   0);
      }
  auto adapters = rec.of<trace::adapter_inserted>();
  BOOST_REQUIRE(count(adapters) == 1);
  const trace::adapter_inserted& a = *ranges::begin(adapters);
  BOOST_TEST(a.kind == "gather-kv-window");
  BOOST_TEST(a.target == "keys");
  BOOST_TEST(a.bytes == 3u * 6u * 5u * 4u);
  BOOST_TEST(rec.emitted() == 1u);
}

BOOST_AUTO_TEST_CASE(layer_0_sees_its_own_new_token_before_layer_1_appends_also_after_a_wrap) {
  default_kv_cache_store s(config(3, 3, 2, 2), ring());
  rows r(s.config());
  for (std::size_t t = 0; t < 8; ++t) {
    BOOST_TEST(r.append(s, 0) == t);
    BOOST_TEST(s.length(0) == t + 1);
    BOOST_TEST(s.length(1) == t);
    const std::size_t from = s.window_start(0);
    const auto w = s.key_window(0, from, t + 1);
    BOOST_TEST(w.end_position() == t + 1);
    BOOST_TEST(wrong_elements(w, K, 0) == 0u);
    BOOST_TEST(wrong_elements(s.value_window(0, from, t + 1), V, 0) == 0u);
    BOOST_CHECK_THROW(s.key_window(1, s.window_start(1), t + 1), std::out_of_range);
    BOOST_TEST(r.append(s, 1) == t);
    BOOST_TEST(wrong_elements(s.key_window(1, s.window_start(1), t + 1), K, 1) == 0u);
  }
}

BOOST_AUTO_TEST_CASE(truncate_after_a_wrap_with_slack_restores_the_window_the_next_token_needs) {
  default_kv_cache_store s(config(6), ring(0, 2));  // W = 4
  BOOST_TEST(s.attention_window() == 4u);
  rows r(s.config());
  r.append_all(s, 9);
  BOOST_TEST(s.window_start(0) == 3u);
  const auto next = s.query_window(9);
  BOOST_TEST((next == ringkv::position_range{6, 10}));
  const auto keys_before = read(s, K, 0, 6, 9), values_before = read(s, V, 0, 6, 9);

  // Two speculative tokens that get rejected: they overwrite positions 3 and 4.
  std::vector<float> junk(6, 999.0f);
  s.append(0, junk, junk);
  s.append(0, junk, junk);
  BOOST_TEST(s.window_start(0) == 5u);
  s.truncate(0, 9);
  BOOST_TEST(s.length(0) == 9u);
  BOOST_TEST(s.window_start(0) == 5u);
  BOOST_TEST(read(s, K, 0, 6, 9) == keys_before, boost::test_tools::per_element());
  BOOST_TEST(read(s, V, 0, 6, 9) == values_before, boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(s.key_window(0, 5, 9), K, 0) == 0u);
  BOOST_CHECK_THROW(s.key_window(0, 4, 9), std::out_of_range);  // overwritten stays lost

  BOOST_TEST(r.append(s, 0) == 9u);  // the accepted token
  const auto w = s.key_window(0, next.from, next.to);
  BOOST_TEST(positions_of(w) == range(6, 10), boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(w, K, 0) == 0u);
  BOOST_TEST(wrong_elements(s.value_window(0, next.from, next.to), V, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(truncate_too_far_is_refused_and_nothing_changes) {
  default_kv_cache_store s(config(6), ring(0, 2));
  rows r(s.config());
  r.append_all(s, 11);  // held [5, 11)
  const snapshot before = snap(s);
  // new_length 7 needs [4, 7) for position 7's window: 4 was overwritten.
  BOOST_CHECK_EXCEPTION(s.truncate(0, 7), std::out_of_range, [](const auto& e) {
    return mentions(e, {"new_length 7", "[4, 7)", "window_start is 5", "slack 2"});
  });
  BOOST_CHECK_EXCEPTION(s.truncate(0, 12), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"new_length 12", "length 11"}); });
  BOOST_TEST((snap(s) == before));
  s.truncate(0, 8);  // slack + 1 back is the limit: needs [5, 8)
  BOOST_TEST(s.length(0) == 8u);
  s.truncate(0, 8);  // to the same length: a no-op
  BOOST_TEST(s.window_start(0) == 5u);

  default_kv_cache_store tight(config(4), ring());  // no slack: one token back after a wrap
  r.append_all(tight, 6);
  BOOST_CHECK_THROW(tight.truncate(0, 4), std::out_of_range);
  tight.truncate(0, 5);
  BOOST_TEST(tight.length(0) == 5u);
}

BOOST_AUTO_TEST_CASE(truncate_before_a_wrap_or_on_a_dense_store_goes_back_anywhere) {
  default_kv_cache_store dense(config(8));
  default_kv_cache_store unwrapped(config(8), ring());
  rows r(dense.config());
  for (auto* s : {&dense, &unwrapped}) {
    r.append_all(*s, 7);
    s->truncate(0, 2);
    BOOST_TEST(s->length(0) == 2u);
    BOOST_TEST(r.append(*s, 0) == 2u);
    BOOST_TEST(wrong_elements(s->key_window(0, 0, 3), K, 0) == 0u);
    s->truncate(0, 0);
    BOOST_TEST(s->length(0) == 0u);
  }
}

BOOST_AUTO_TEST_CASE(truncate_with_pinned_sinks_counts_the_window_as_sinks_plus_rolling_keys) {
  default_kv_cache_store s(config(6), ring(2, 1));  // 4 rolling slots, W = 5: sinks + 3 newest
  rows r(s.config());
  r.append_all(s, 10);  // held 0, 1, [6, 10)
  BOOST_TEST(s.window_start(0) == 6u);
  BOOST_TEST((s.query_window(10) == ringkv::position_range{8, 11}));
  BOOST_TEST((s.query_window(4) == ringkv::position_range{0, 5}));
  BOOST_TEST((s.query_window(5) == ringkv::position_range{3, 6}));
  BOOST_CHECK_EXCEPTION(s.truncate(0, 7), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"[5, 7)", "keep 2"}); });
  s.truncate(0, 8);  // position 8 attends 0, 1, 6, 7, 8
  BOOST_TEST(r.append(s, 0) == 8u);
  const auto w = s.key_window(0, 6, 9);
  BOOST_TEST(positions_of(w) == (std::vector<std::size_t>{0, 1, 6, 7, 8}),
             boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(w, K, 0) == 0u);
  s.truncate(0, 2);  // back to the sinks alone: the ring starts afresh
  BOOST_TEST(s.window_start(0) == 0u);
  BOOST_TEST(r.append(s, 0) == 2u);
  const auto fresh = s.key_window(0, 0, 3);
  BOOST_TEST(fresh.runs().size() == 1u);
  BOOST_TEST(wrong_elements(fresh, K, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(a_window_ending_exactly_at_the_rings_end_is_one_run) {
  default_kv_cache_store s(config(5), ring());
  rows r(s.config());
  r.append_all(s, 8);  // slots hold 5, 6, 7, 3, 4
  const auto end = s.key_window(0, 3, 5);
  BOOST_TEST(end.runs().size() == 1u);
  BOOST_TEST(slot_of_run(s, end.head()) == 3u);
  BOOST_TEST(!end.wrapped());
  const auto start = s.key_window(0, 5, 8);
  BOOST_TEST(start.runs().size() == 1u);
  BOOST_TEST(slot_of_run(s, start.head()) == 0u);
  const auto both = s.key_window(0, 3, 8);
  BOOST_TEST(run_lengths(both) == (std::vector<std::size_t>{2, 3}),
             boost::test_tools::per_element());
  BOOST_TEST(wrong_elements(both, K, 0) == 0u);

  default_kv_cache_store full(config(5), ring());
  r.append_all(full, 5);  // exactly full, not yet wrapped
  BOOST_TEST(full.window_start(0) == 0u);
  BOOST_TEST(full.key_window(0, 0, 5).runs().size() == 1u);
  BOOST_TEST(full.key_window(0, 0, 0).empty());
}

BOOST_AUTO_TEST_CASE(a_ring_of_capacity_one_holds_only_its_newest_position) {
  default_kv_cache_store s(config(1, 4), ring());
  BOOST_TEST(s.attention_window() == 1u);
  rows r(s.config());
  for (std::size_t p = 0; p < 5; ++p) {
    r.append(s, 0);
    BOOST_TEST(s.window_start(0) == p);
    BOOST_TEST(s.held(0) == 1u);
    const auto w = s.key_window(0, p, p + 1);
    BOOST_TEST(positions_of(w) == range(p, p + 1), boost::test_tools::per_element());
    BOOST_TEST(wrong_elements(w, K, 0) == 0u);
    BOOST_TEST(wrong_read(read(s, V, 0, p, p + 1), V, 0, p, p + 1, 2, 4) == 0u);
    if (p > 0) BOOST_CHECK_THROW(s.key_window(0, p - 1, p + 1), std::out_of_range);
  }
  s.truncate(0, 5);
  s.truncate(0, 4);  // W = 1: the next token needs nothing before it
  BOOST_TEST(s.window_start(0) == 4u);
  BOOST_TEST(s.held(0) == 0u);
  BOOST_TEST(r.append(s, 0) == 4u);
  BOOST_TEST(wrong_elements(s.key_window(0, 4, 5), K, 0) == 0u);
}

BOOST_AUTO_TEST_CASE(head_dims_that_are_not_a_multiple_of_the_simd_width_round_trip) {
  for (std::size_t head_dim : {1u, 3u, 96u, 97u}) {
    BOOST_TEST_CONTEXT("head_dim " << head_dim) {
      default_kv_cache_store s(config(7, head_dim, 3, 2), ring(1));
      rows r(s.config());
      r.append_all(s, 17);
      for (std::size_t l = 0; l < 2; ++l) {
        BOOST_TEST(wrong_elements(s.key_window(l, 12, 17), K, l) == 0u);
        BOOST_TEST(wrong_elements(s.value_window(l, 12, 17), V, l) == 0u);
        BOOST_TEST(wrong_read(read(s, K, l, 11, 17), K, l, 11, 17, 3, head_dim) == 0u);
        BOOST_TEST(wrong_read(read(s, V, l, 0, 1), V, l, 0, 1, 3, head_dim) == 0u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(pinned_sinks_give_three_runs_in_order) {
  default_kv_cache_store s(config(6), ring(2));  // sinks in slots 0, 1; the ring rolls over 2..5
  rows r(s.config());
  r.append_all(s, 4);
  const auto early = s.key_window(0, 1, 4);  // before any wrap: sinks run into the window
  BOOST_TEST(positions_of(early) == range(0, 4), boost::test_tools::per_element());
  BOOST_TEST(early.runs().size() == 1u);

  r.append_all(s, 8);  // held 0, 1, [8, 12); slots 2..5 hold 10, 11, 8, 9
  BOOST_TEST(s.window_start(0) == 8u);
  BOOST_TEST(s.slot_of(1) == 1u);
  BOOST_TEST(s.slot_of(8) == 4u);
  BOOST_TEST(s.slot_of(10) == 2u);
  for (kv_side side : {K, V}) {
    const auto w = side == K ? s.key_window(0, 8, 12) : s.value_window(0, 8, 12);
    BOOST_TEST(first_positions(w) == (std::vector<std::size_t>{0, 8, 10}),
               boost::test_tools::per_element());
    BOOST_TEST(run_lengths(w) == (std::vector<std::size_t>{2, 2, 2}),
               boost::test_tools::per_element());
    BOOST_TEST(w.wrapped());
    BOOST_TEST(wrong_elements(w, side, 0) == 0u);
  }
  const auto w = s.key_window(0, 8, 12);
  BOOST_TEST(slot_of_run(s, w.runs()[0]) == 0u);
  BOOST_TEST(slot_of_run(s, w.runs()[1]) == 4u);
  BOOST_TEST(slot_of_run(s, w.runs()[2]) == 2u);
  const auto unwrapped = s.key_window(0, 10, 12);
  BOOST_TEST(first_positions(unwrapped) == (std::vector<std::size_t>{0, 10}),
             boost::test_tools::per_element());
  BOOST_TEST(!unwrapped.wrapped());
  BOOST_TEST(positions_of(s.key_window(0, 0, 2)) == range(0, 2), boost::test_tools::per_element());
  BOOST_TEST(positions_of(s.key_window(0, 11, 11)) == range(0, 2),
             boost::test_tools::per_element());
  BOOST_CHECK_THROW(s.key_window(0, 1, 12), std::out_of_range);           // 2..7 were overwritten
  BOOST_TEST(wrong_read(read(s, K, 0, 8, 12), K, 0, 8, 12, 2, 3) == 0u);  // reads have no sinks
  BOOST_TEST(wrong_read(read(s, V, 0, 0, 2), V, 0, 0, 2, 2, 3) == 0u);
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_refused_with_a_clear_message_and_change_nothing) {
  default_kv_cache_store s(config(4, 3, 2, 2), ring(1));
  rows r(s.config());
  r.append_all(s, 6);
  r.append(s, 0);
  const snapshot before = snap(s);
  std::vector<float> short_row(5), out(6 * 2);
  auto layer = [](const auto& e) { return mentions(e, {"layer 2", "layers 2"}); };
  BOOST_CHECK_EXCEPTION(s.append(2, r.key, r.value), std::out_of_range, layer);
  BOOST_CHECK_EXCEPTION(s.append(0, short_row, r.value), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"key has 5", "= 6"}); });
  BOOST_CHECK_EXCEPTION(s.append(0, r.key, short_row), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"value has 5", "= 6"}); });
  BOOST_CHECK_EXCEPTION(s.read_keys(0, 5, 7, std::span(out).first(11)), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"out has 11", "= 12"}); });
  BOOST_CHECK_EXCEPTION(s.read_values(2, 5, 7, out), std::out_of_range, layer);
  BOOST_CHECK_EXCEPTION(s.read_keys(0, 6, 5, out), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"from 6", "to 5", "from > to"}); });
  BOOST_CHECK_EXCEPTION(s.read_keys(1, 5, 7, out), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"to 7", "length 6"}); });
  BOOST_CHECK_EXCEPTION(s.key_window(2, 0, 1), std::out_of_range, layer);
  BOOST_CHECK_EXCEPTION(s.value_window(0, 5, 4), std::out_of_range,
                        [](const auto& e) { return mentions(e, {"value_window", "from > to"}); });
  BOOST_CHECK_EXCEPTION(s.truncate(2, 0), std::out_of_range, layer);
  BOOST_CHECK_EXCEPTION(s.clear(2), std::out_of_range, layer);
  BOOST_CHECK_EXCEPTION(s.length(2), std::out_of_range, layer);
  BOOST_CHECK_EXCEPTION(s.window_start(2), std::out_of_range, layer);
  BOOST_TEST((snap(s) == before));
}

BOOST_AUTO_TEST_CASE(clear_forgets_one_layer_or_all) {
  default_kv_cache_store s(config(4, 3, 2, 2), ring());
  rows r(s.config());
  r.append_all(s, 6);
  s.clear(0);
  BOOST_TEST(s.length(0) == 0u);
  BOOST_TEST(s.window_start(0) == 0u);
  BOOST_TEST(s.length(1) == 6u);
  BOOST_TEST(s.window_start(1) == 2u);
  BOOST_TEST(r.append(s, 0) == 0u);
  BOOST_TEST(wrong_elements(s.key_window(0, 0, 1), K, 0) == 0u);
  s.clear();
  BOOST_TEST(s.length(0) + s.length(1) == 0u);
  BOOST_TEST(s.window_start(1) == 0u);
  BOOST_TEST(s.memory().logical_bytes == 0u);
}

BOOST_AUTO_TEST_CASE(appends_and_windows_on_a_wrapped_ring_allocate_nothing) {
  trace::recorder rec(256);
  default_kv_cache_store s(config(16, 8, 4, 2), ring(2, 2), rec);
  const std::size_t built = count(rec.of<trace::allocation>());
  BOOST_TEST(built == 4u);
  rows r(s.config());
  std::vector<float> out(16 * 4 * 8);
  ringkv::scope arena(64);
  const ringkv::kv_cache_store& generic = s;
  r.append_all(s, 20);  // wrapped
  rec.clear();
  double sum = 0;
  ringkv_test::new_counter counter;
  for (int i = 0; i < 1000; ++i) {
    for (std::size_t l = 0; l < 2; ++l) {
      const std::size_t p = r.append(s, l);
      const auto q = s.query_window(p);
      for (const auto& w : {s.key_window(l, q.from, q.to), s.value_window(l, q.from, q.to),
                            generic.key_window(l, q.from, q.to, arena)})
        for (const auto& run : w.runs()) sum += run.row<float>(0, 0)[0];
      s.read_keys(l, q.from, q.to, std::span(out).first(q.size() * 4 * 8));
      sum += out[0];
    }
    if (i % 100 == 99) s.truncate(0, s.length(0) - 1), r.append(s, 0);
  }
  const auto calls = counter.calls();
  BOOST_TEST_MESSAGE("operator new calls over 1000 appends + windows: " << calls);
  BOOST_TEST(calls == 0u);
  BOOST_TEST(count(rec.of<trace::allocation>()) == 0);
  BOOST_TEST(rec.emitted() == 0u);
  BOOST_TEST(sum != 0.0);
  BOOST_TEST(s.window_start(0) > 1000u);
}

namespace {
// An independent bf16 reference: the nearer of the two bf16 neighbours in double, ties to even.
float bf16_reference(float x) {
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const float lo = std::bit_cast<float>(bits & 0xffff0000u);
  const float hi = std::bit_cast<float>((bits & 0xffff0000u) + 0x10000u);
  const double dl = std::fabs(double(x) - lo), dh = std::fabs(double(hi) - x);
  if (dl != dh) return dl < dh ? lo : hi;
  return (bits >> 16) & 1u ? hi : lo;
}
}  // namespace

BOOST_AUTO_TEST_CASE(f16_and_bf16_stores_round_to_nearest_even_and_read_back_as_f32) {
  kv_cache_config c = config(3, 16, 1);
  c.key_type = ringkv::dtype::f16;
  c.value_type = ringkv::dtype::bf16;
  default_kv_cache_store s(c, ring());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  // Inputs f16 can hold (|x| < 65520, past which it would round to Inf: refused, below).
  std::uniform_int_distribution<int> exponent(-30, 14);
  std::vector<float> row(16), keys(16), values(16);
  const float specials[] = {1.0f / 3, 65504.0f,      65519.0f,      -65519.0f,
                            65508.0f, 5.9604645e-8f, 2.9802322e-8f, 8.940697e-8f,
                            1e-7f,    -0.0f,         6.1035156e-5f, 1.00048828125f};
  std::size_t wrong_f16 = 0, wrong_bf16 = 0;
  for (int t = 0; t < 300; ++t) {
    for (std::size_t d = 0; d < 16; ++d)
      row[d] = t == 0 && d < 12 ? specials[d]
                                : std::ldexp(mantissa(rng), exponent(rng)) * (d % 2 ? -1.0f : 1.0f);
    const std::size_t p = s.append(0, row, row);
    s.read_keys(0, p, p + 1, keys);
    s.read_values(0, p, p + 1, values);
    for (std::size_t d = 0; d < 16; ++d) {
      const float f16 = float(static_cast<_Float16>(row[d]));  // the compiler's conversion
      wrong_f16 += std::bit_cast<std::uint32_t>(keys[d]) != std::bit_cast<std::uint32_t>(f16);
      wrong_bf16 += std::bit_cast<std::uint32_t>(values[d]) !=
                    std::bit_cast<std::uint32_t>(bf16_reference(row[d]));
    }
  }
  BOOST_TEST(wrong_f16 == 0u);
  BOOST_TEST(wrong_bf16 == 0u);
  const auto w = s.key_window(0, s.window_start(0), s.length(0));
  BOOST_TEST((w.type() == ringkv::dtype::f16));
  BOOST_TEST((s.value_window(0, 299, 300).type() == ringkv::dtype::bf16));

  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  // NaN and Inf are refused before anything is stored (README, "NaN and Inf")...
  const snapshot before = snap(s);
  for (const float bad : {nan, -inf}) {
    std::fill(row.begin(), row.end(), 1.0f);
    row[1] = bad;
    BOOST_CHECK_EXCEPTION(s.append(0, row, row), std::invalid_argument, [](const auto& e) {
      return mentions(e, {"default_kv_cache_store::append", "key has a non-finite element",
                          "at index 1", "NaN and Inf are refused"});
    });
    BOOST_TEST((snap(s) == before));
  }
  // ...and so is a finite value the key's f16 would round to Inf (the bf16 value could hold it).
  std::fill(row.begin(), row.end(), -3.0f);
  row[2] = 65520.0f;
  BOOST_CHECK_EXCEPTION(s.append(0, row, row), std::invalid_argument, [](const auto& e) {
    return mentions(e, {"default_kv_cache_store::append", "key[2] = 65520", "too large for f16",
                        "largest finite 65504"});
  });
  BOOST_TEST((snap(s) == before));
  // A bf16 value far past f16's range is held (rounded once), with an f16 key that fits.
  std::vector<float> key_row(16, -3.0f);
  row[2] = 1e30f;
  const std::size_t p = s.append(0, key_row, row);
  s.read_keys(0, p, p + 1, keys);
  s.read_values(0, p, p + 1, values);
  BOOST_TEST(keys[0] == -3.0f);
  BOOST_TEST(values[0] == -3.0f);
  BOOST_TEST(values[2] == bf16_reference(1e30f));
}
