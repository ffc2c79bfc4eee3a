#define BOOST_TEST_MODULE window
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>

import ringkv;

#include "store_support.hpp"

namespace trace = ringkv::trace;
using ringkv::dtype;
using ringkv::kv_run;
using ringkv::tensor_view;
using ringkv::windowed_kv;
using store_test::mentions;

namespace {
// A buffer of random bytes (any bit pattern, NaNs included) shaped like a ring's storage:
// [heads][slots][head_dim] with the head stride of all the slots.
struct ring_buffer {
  ring_buffer(dtype type, std::size_t heads, std::size_t slots, std::size_t head_dim,
              unsigned seed = 1)
      : type(type), heads(heads), slots(slots), head_dim(head_dim),
        bytes(heads * slots * head_dim * ringkv::size_of(type)) {
    std::mt19937 rng(seed);
    for (auto& b : bytes) b = std::byte(rng() & 0xff);
  }
  /// Slots [slot, slot + count) of every head.
  tensor_view view(std::size_t slot, std::size_t count) {
    return {bytes.data() + slot * head_dim * ringkv::size_of(type),
            type,
            heads,
            count,
            head_dim,
            slots * head_dim,
            head_dim};
  }
  dtype type;
  std::size_t heads, slots, head_dim;
  std::vector<std::byte> bytes;
};

std::vector<std::size_t> first_positions(const windowed_kv& w) {
  std::vector<std::size_t> v;
  for (std::size_t i = 0; i < w.runs().size(); ++i) v.push_back(w.run_first_position(i));
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_window_refuses_runs_that_disagree_on_heads_head_dim_or_dtype) {
  ring_buffer keys(dtype::f32, 2, 8, 4), other_heads(dtype::f32, 3, 8, 4),
      other_dim(dtype::f32, 2, 8, 5), other_type(dtype::f16, 2, 8, 4);
  BOOST_CHECK_EXCEPTION(windowed_kv(keys.view(4, 4), other_heads.view(0, 2), 4),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"run 1", "3 heads", "2 heads"}); });
  BOOST_CHECK_EXCEPTION(windowed_kv(keys.view(4, 4), other_dim.view(0, 2), 4),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"head_dim 5", "head_dim 4"}); });
  BOOST_CHECK_EXCEPTION(windowed_kv(keys.view(4, 4), other_type.view(0, 2), 4),
                        std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"f16", "f32"}); });
  const kv_run mixed[] = {{keys.view(0, 2), 0}, {keys.view(4, 2), 6}, {other_dim.view(0, 2), 8}};
  BOOST_CHECK_EXCEPTION(windowed_kv{std::span(mixed)}, std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"run 2", "head_dim 5"}); });
}

BOOST_AUTO_TEST_CASE(runs_must_move_forward_in_position_and_number_at_most_four) {
  ring_buffer b(dtype::f32, 1, 8, 2);
  const kv_run backwards[] = {{b.view(0, 4), 10}, {b.view(4, 2), 12}};
  BOOST_CHECK_EXCEPTION(windowed_kv{std::span(backwards)}, std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"position 12", "(14)"}); });
  // Four: pinned sinks, the ring's head and tail, and a prefill chunk's rows.
  const kv_run four[] = {
      {b.view(0, 1), 0}, {b.view(1, 1), 2}, {b.view(2, 1), 4}, {b.view(3, 1), 6}};
  BOOST_TEST(windowed_kv{std::span(four)}.runs().size() == 4u);
  const kv_run five[] = {{b.view(0, 1), 0},
                         {b.view(1, 1), 2},
                         {b.view(2, 1), 4},
                         {b.view(3, 1), 6},
                         {b.view(4, 1), 8}};
  BOOST_CHECK_EXCEPTION(windowed_kv{std::span(five)}, std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"more than 4 runs"}); });
  const kv_run padded[] = {{b.view(0, 1), 0},
                           {b.view(1, 0), 1},
                           {b.view(2, 1), 4},
                           {b.view(3, 1), 6},
                           {b.view(4, 1), 8}};
  BOOST_TEST(windowed_kv{std::span(padded)}.runs().size() == 4u);  // the empty run is dropped
}

BOOST_AUTO_TEST_CASE(an_empty_window_has_no_runs_and_cannot_be_gathered) {
  const windowed_kv none;
  BOOST_TEST(none.empty());
  BOOST_TEST(none.runs().empty());
  BOOST_TEST(!none.wrapped());
  BOOST_TEST(none.length() == 0u);
  BOOST_TEST(none.first_position() == 0u);
  BOOST_TEST(!none.tail().has_value());
  BOOST_CHECK_THROW(none.head(), std::out_of_range);
  BOOST_CHECK_THROW(none.run_first_position(0), std::out_of_range);
  ringkv::scope arena(64);
  BOOST_CHECK_EXCEPTION(none.gather(arena, trace::null_sink()), std::invalid_argument,
                        [](const auto& e) { return mentions(e, {"empty"}); });
  // Empty runs are dropped, so a window of a run and an empty tail is one run.
  ring_buffer b(dtype::f32, 2, 4, 3);
  const windowed_kv one(b.view(1, 2), b.view(0, 0), 7);
  BOOST_TEST(one.runs().size() == 1u);
  BOOST_TEST(!one.tail().has_value());
}

BOOST_AUTO_TEST_CASE(runs_come_in_position_order_with_their_absolute_first_positions) {
  ring_buffer b(dtype::bf16, 3, 10, 6);
  // Sinks in slots 0..1, the ring's head in slots 7..9 (positions 21..23), tail in 2..4 (24..26).
  const kv_run runs[] = {{b.view(0, 2), 0}, {b.view(7, 3), 21}, {b.view(2, 3), 24}};
  const windowed_kv w{std::span(runs)};
  BOOST_TEST(w.runs().size() == 3u);
  BOOST_TEST(first_positions(w) == (std::vector<std::size_t>{0, 21, 24}),
             boost::test_tools::per_element());
  for (std::size_t i = 0; i < 3; ++i) BOOST_TEST(w.runs()[i].data() == runs[i].view.data());
  BOOST_TEST(w.head().data() == runs[0].view.data());
  BOOST_TEST(w.tail()->data() == runs[2].view.data());
  BOOST_TEST(w.length() == 8u);
  BOOST_TEST(w.first_position() == 0u);
  BOOST_TEST(w.end_position() == 27u);
  BOOST_TEST(w.heads() == 3u);
  BOOST_TEST(w.head_dim() == 6u);
  BOOST_TEST((w.type() == dtype::bf16));
  BOOST_CHECK_THROW(w.run_first_position(3), std::out_of_range);

  const windowed_kv pair(b.view(7, 3), b.view(0, 2), 40);
  BOOST_TEST(first_positions(pair) == (std::vector<std::size_t>{40, 43}),
             boost::test_tools::per_element());
  const windowed_kv single(b.view(3, 4), std::nullopt, 5);
  BOOST_TEST(single.end_position() == 9u);
}

BOOST_AUTO_TEST_CASE(wrapped_means_consecutive_positions_are_split_across_runs) {
  ring_buffer b(dtype::f32, 1, 10, 2);
  BOOST_TEST(!windowed_kv(b.view(0, 5), 3).wrapped());
  BOOST_TEST(windowed_kv(b.view(6, 4), b.view(0, 2), 3).wrapped());
  const kv_run sinks_and_one[] = {{b.view(0, 2), 0}, {b.view(4, 3), 9}};
  BOOST_TEST(!windowed_kv{std::span(sinks_and_one)}.wrapped());
  const kv_run sinks_head_tail[] = {{b.view(0, 2), 0}, {b.view(7, 3), 9}, {b.view(2, 2), 12}};
  BOOST_TEST(windowed_kv{std::span(sinks_head_tail)}.wrapped());
}

BOOST_AUTO_TEST_CASE(gather_is_bit_exact_and_traced_once_per_gather_with_its_bytes) {
  for (dtype type : {dtype::f32, dtype::f16}) {
    BOOST_TEST_CONTEXT(ringkv::name_of(type)) {
      const std::size_t heads = 3, head_dim = 5, elem = ringkv::size_of(type);
      ring_buffer b(type, heads, 9, head_dim, 42);
      const kv_run runs[] = {{b.view(0, 2), 0}, {b.view(6, 3), 30}, {b.view(2, 2), 33}};
      const windowed_kv w{std::span(runs)};
      trace::recorder rec(16);
      ringkv::scope arena(4096);
      for (int round = 0; round < 2; ++round) {
        const tensor_view g = w.gather(arena, rec, "keys");
        BOOST_TEST(g.positions() == 7u);
        BOOST_TEST(g.head_stride() == 7u * head_dim);  // one contiguous [heads, len, head_dim]
        BOOST_TEST(g.position_stride() == head_dim);
        BOOST_TEST((g.type() == type));
        std::size_t differing = 0;
        for (std::size_t h = 0; h < heads; ++h) {
          std::size_t out = 0;
          for (const tensor_view& run : w.runs())
            for (std::size_t p = 0; p < run.positions(); ++p, ++out)
              differing +=
                  std::memcmp(g.row_bytes(h, out), run.row_bytes(h, p), head_dim * elem) != 0;
        }
        BOOST_TEST(differing == 0u);
      }
      auto adapters = rec.of<trace::adapter_inserted>();
      BOOST_TEST(ranges::distance(adapters) == 2);
      for (const trace::adapter_inserted& a : adapters) {
        BOOST_TEST(a.kind == "gather-kv-window");
        BOOST_TEST(a.target == "keys");
        BOOST_TEST(a.bytes == heads * 7 * head_dim * elem);
      }
      BOOST_TEST(rec.emitted() == 2u);  // the arena had room: no allocation
      w.gather(arena, rec);
      std::vector<std::string> targets;
      for (const trace::adapter_inserted& a : rec.of<trace::adapter_inserted>())
        targets.emplace_back(a.target);
      BOOST_TEST(targets == (std::vector<std::string>{"keys", "keys", "kv"}),
                 boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(gathered_keeps_absolute_positions_and_joins_runs_that_continue) {
  ring_buffer b(dtype::f32, 2, 9, 4, 3);
  const kv_run runs[] = {{b.view(0, 2), 0}, {b.view(6, 3), 30}, {b.view(2, 2), 33}};
  const windowed_kv w{std::span(runs)};
  ringkv::scope arena(4096);
  trace::recorder rec(4);
  const windowed_kv g = w.gathered(arena, rec, "values");
  BOOST_TEST(first_positions(g) == (std::vector<std::size_t>{0, 30}),
             boost::test_tools::per_element());
  BOOST_TEST(g.runs()[1].positions() == 5u);
  BOOST_TEST(!g.wrapped());
  BOOST_TEST(g.end_position() == w.end_position());
  BOOST_TEST(rec.emitted() == 1u);
  for (std::size_t h = 0; h < 2; ++h) {
    BOOST_TEST(std::memcmp(g.runs()[1].row_bytes(h, 3), w.runs()[2].row_bytes(h, 0), 16) == 0);
    BOOST_TEST(std::memcmp(g.runs()[0].row_bytes(h, 1), w.runs()[0].row_bytes(h, 1), 16) == 0);
  }
  const windowed_kv pair(b.view(6, 3), b.view(0, 2), 9);
  BOOST_TEST(pair.gathered(arena, rec).runs().size() == 1u);
}
