#define BOOST_TEST_MODULE trace
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <variant>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>

#include "count_new.hpp"

import ringkv;

namespace trace = ringkv::trace;

namespace {
std::vector<std::size_t> allocation_bytes(const trace::recorder& r) {
  std::vector<std::size_t> out;
  for (const trace::allocation& a : r.of<trace::allocation>()) out.push_back(a.bytes);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_recorder_keeps_events_in_the_order_they_were_emitted) {
  trace::recorder r(8);
  r.emit(trace::allocation{"a", 1});
  r.emit(trace::release{"a", 1});
  r.emit(trace::allocation{"b", 2});
  std::vector<std::size_t> kinds;
  for (const trace::event& e : r.events()) kinds.push_back(e.index());
  BOOST_TEST(kinds == (std::vector<std::size_t>{0, 1, 0}), boost::test_tools::per_element());
  BOOST_TEST(r.emitted() == 3u);
  BOOST_TEST(r.dropped() == 0u);
}

BOOST_AUTO_TEST_CASE(a_full_recorder_drops_the_oldest_and_counts_what_it_dropped) {
  trace::recorder r(3);
  for (std::size_t i = 1; i <= 7; ++i) r.emit(trace::allocation{"x", i});
  BOOST_TEST(allocation_bytes(r) == (std::vector<std::size_t>{5, 6, 7}),
             boost::test_tools::per_element());
  BOOST_TEST(r.emitted() == 7u);
  BOOST_TEST(r.dropped() == 4u);
  BOOST_TEST(r.size() == 3u);
}

BOOST_AUTO_TEST_CASE(of_filters_one_event_type_as_references) {
  trace::recorder r(16);
  r.emit(trace::allocation{"a", 10});
  r.emit(trace::adapter_inserted{"gather-kv-window", "keys", 96});
  r.emit(trace::scope_reset{64, 0});
  r.emit(trace::adapter_inserted{"gather-kv-window", "values", 48});
  std::vector<std::size_t> bytes;
  for (const trace::adapter_inserted& a : r.of<trace::adapter_inserted>()) {
    BOOST_TEST(a.kind == "gather-kv-window");
    bytes.push_back(a.bytes);
  }
  BOOST_TEST(bytes == (std::vector<std::size_t>{96, 48}), boost::test_tools::per_element());
  BOOST_TEST(ranges::distance(r.of<trace::scope_reset>()) == 1);
  BOOST_TEST(ranges::distance(r.of<trace::kernel_run>()) == 0);
}

BOOST_AUTO_TEST_CASE(the_event_range_composes_with_range_v3_views_across_the_wrap) {
  trace::recorder r(4);
  for (std::size_t i = 0; i < 6; ++i) r.emit(trace::allocation{"x", i});  // wrapped: 2,3,4,5
  auto firsts = r.of<trace::allocation>() |
                ranges::views::transform([](const trace::allocation& a) { return a.bytes * 10; }) |
                ranges::views::take(3) | ranges::to<std::vector>();
  BOOST_TEST(firsts == (std::vector<std::size_t>{20, 30, 40}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_recorder_allocates_once_and_never_while_recording) {
  const ringkv_test::new_counter construction;
  trace::recorder r(32);
  BOOST_TEST(construction.calls() == 1u);  // the ring of 32 events, in one piece
  const ringkv_test::new_counter recording;
  for (std::size_t i = 0; i < 1000; ++i) r.emit(trace::allocation{"x", i});
  BOOST_TEST(recording.calls() == 0u);
  BOOST_TEST(r.emitted() == 1000u);
}

BOOST_AUTO_TEST_CASE(clear_forgets_events_and_counters) {
  trace::recorder r(2);
  for (std::size_t i = 0; i < 5; ++i) r.emit(trace::release{"x", i});
  r.clear();
  BOOST_TEST(r.size() == 0u);
  BOOST_TEST(r.emitted() == 0u);
  BOOST_TEST(ranges::distance(r.events()) == 0);
  r.emit(trace::release{"y", 9});
  BOOST_TEST(ranges::distance(r.events()) == 1);
}

BOOST_AUTO_TEST_CASE(a_recorder_of_capacity_zero_is_refused) {
  BOOST_CHECK_EXCEPTION(trace::recorder(0), std::invalid_argument, [](const auto& e) {
    return std::string(e.what()).find("capacity") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(the_null_sink_is_disabled_and_a_disabled_producer_records_nothing) {
  BOOST_TEST(!trace::null_sink().enabled());
  // A sink that counts what reaches it: a producer given a disabled one must not call emit().
  struct counting_sink final : trace::sink {
    bool on = false;
    std::size_t emits = 0;
    bool enabled() const noexcept override { return on; }
    void emit(const trace::event&) override { ++emits; }
  };
  counting_sink quiet, heard;
  heard.on = true;
  { ringkv::storage s(128, "quiet", quiet); }
  BOOST_TEST(quiet.emits == 0u);
  { ringkv::storage s(128, "heard", heard); }
  BOOST_TEST(heard.emits == 2u);  // the same producer, enabled: allocation and release
}

BOOST_AUTO_TEST_CASE(kernel_runs_are_opt_in) {
  BOOST_TEST(!trace::recorder(4).wants_kernel_runs());
  BOOST_TEST(trace::recorder(4, true).wants_kernel_runs());
}

BOOST_AUTO_TEST_CASE(the_chrome_trace_is_valid_json_with_one_entry_per_event) {
  trace::recorder r(8);
  r.emit(trace::allocation{"kv \"layer\" 0", 4096});
  r.emit(trace::adapter_inserted{"gather-kv-window", "keys", 1024});
  r.emit(trace::scope_reset{2048, 0});
  r.emit(trace::kernel_run{"decode_step", 1000, 64, 1500});
  r.emit(trace::release{"kv", 4096});
  std::stringstream json;
  trace::write_chrome_trace(json, r);

  boost::property_tree::ptree doc;
  BOOST_REQUIRE_NO_THROW(boost::property_tree::read_json(json, doc));
  const auto& events = doc.get_child("traceEvents");
  BOOST_TEST(events.size() == 5u);
  std::vector<std::string> names;
  for (const auto& [_, e] : events) names.push_back(e.get<std::string>("name"));
  BOOST_TEST(names == (std::vector<std::string>{"kv \"layer\" 0", "gather-kv-window", "scope_reset",
                                                "decode_step", "kv"}),
             boost::test_tools::per_element());
  auto it = events.begin();
  BOOST_TEST(it->second.get<std::size_t>("args.bytes") == 4096u);
  std::advance(it, 3);
  BOOST_TEST(it->second.get<std::string>("ph") == "X");
  BOOST_TEST(it->second.get<double>("dur") == 1.5);
}

BOOST_AUTO_TEST_CASE(a_plain_event_range_is_written_one_microsecond_apart) {
  std::vector<trace::event> events{trace::allocation{"a", 1}, trace::release{"a", 1}};
  std::stringstream json;
  trace::write_chrome_trace(json, events);
  boost::property_tree::ptree doc;
  boost::property_tree::read_json(json, doc);
  std::vector<double> ts;
  for (const auto& [_, e] : doc.get_child("traceEvents")) ts.push_back(e.get<double>("ts"));
  BOOST_TEST(ts == (std::vector<double>{0.0, 1.0}), boost::test_tools::per_element());
}
