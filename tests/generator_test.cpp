#define BOOST_TEST_MODULE generator
#include <boost/test/unit_test.hpp>

#include <coroutine>
#include <iterator>
#include <ranges>
#include <stdexcept>
#include <vector>
#include <range/v3/range/concepts.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/take.hpp>
#include <range/v3/view/transform.hpp>

import ringkv;

using ringkv::generator;

namespace {
generator<int> count_from(int first, int* resumed = nullptr) {
  for (int i = first;; ++i) {
    if (resumed) ++*resumed;
    co_yield i;
  }
}

generator<int> three_then_throw() {
  co_yield 1;
  co_yield 2;
  co_yield 3;
  throw std::runtime_error("source ran dry");
}

struct tracked {
  static inline int alive = 0;
  tracked() { ++alive; }
  tracked(const tracked&) { ++alive; }
  ~tracked() { --alive; }
};

generator<int> holds_a_tracked_object() {
  tracked t;
  for (int i = 0;; ++i) co_yield i;
}
}  // namespace

// The concepts both libraries need, checked at compile time.
static_assert(std::ranges::input_range<generator<int>>);
static_assert(std::ranges::view<generator<int>>);
static_assert(std::ranges::viewable_range<generator<int>>);
static_assert(std::input_iterator<generator<int>::iterator>);
static_assert(std::copyable<generator<int>::iterator>);
static_assert(std::semiregular<generator<int>>);
static_assert(std::sentinel_for<std::default_sentinel_t, generator<int>::iterator>);
static_assert(ranges::input_range<generator<int>>);
static_assert(ranges::view_<generator<int>>);
static_assert(ranges::viewable_range<generator<int>>);
static_assert(ranges::input_iterator<generator<int>::iterator>);
static_assert(ranges::sentinel_for<std::default_sentinel_t, generator<int>::iterator>);

BOOST_AUTO_TEST_CASE(a_generator_yields_its_values_in_order_and_lazily) {
  int resumed = 0;
  auto g = count_from(5, &resumed);
  BOOST_TEST(resumed == 0);  // nothing runs before begin()
  std::vector<int> got;
  for (int v : g) {
    got.push_back(v);
    if (got.size() == 4) break;
  }
  BOOST_TEST(got == (std::vector<int>{5, 6, 7, 8}), boost::test_tools::per_element());
  BOOST_TEST(resumed == 4);
}

BOOST_AUTO_TEST_CASE(it_composes_with_std_views_take) {
  std::vector<int> got;
  for (int v :
       count_from(0) | std::views::take(3) | std::views::transform([](int i) { return i * i; }))
    got.push_back(v);
  BOOST_TEST(got == (std::vector<int>{0, 1, 4}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(it_composes_with_range_v3_views_take) {
  auto got = count_from(10) | ranges::views::take(3) | ranges::to<std::vector>();
  BOOST_TEST(got == (std::vector<int>{10, 11, 12}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_exception_in_the_body_comes_out_of_the_operation_that_runs_it) {
  auto g = three_then_throw();
  auto it = g.begin();
  BOOST_TEST(*it == 1);
  ++it;
  ++it;  // the first increment runs here, the second is pending
  BOOST_TEST(*it == 3);
  ++it;
  BOOST_CHECK_EXCEPTION(
      (void)(it == std::default_sentinel), std::runtime_error,
      [](const std::runtime_error& e) { return std::string(e.what()) == "source ran dry"; });
  BOOST_TEST((it == std::default_sentinel));
  auto h = three_then_throw();
  auto jt = h.begin();
  ++jt;
  ++jt;
  ++jt;  // runs the pending advance to 3, then marks one more
  BOOST_CHECK_THROW(++jt, std::runtime_error);  // a second increment runs the body: it throws
}

BOOST_AUTO_TEST_CASE(take_n_runs_the_body_exactly_n_times) {
  int resumed = 0;
  std::vector<int> got;
  for (int v : count_from(0, &resumed) | std::views::take(4)) got.push_back(v);
  BOOST_TEST(resumed == 4);
  resumed = 0;
  for (int v : count_from(0, &resumed) | ranges::views::take(3)) got.push_back(v);
  BOOST_TEST(resumed == 3);
  BOOST_TEST(got.size() == 7u);
}

BOOST_AUTO_TEST_CASE(an_exception_before_the_first_yield_comes_out_of_begin) {
  auto g = []() -> generator<int> {
    throw std::invalid_argument("bad first token");
    co_return;
  }();
  BOOST_CHECK_THROW(g.begin(), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(breaking_early_destroys_the_frame_and_its_locals) {
  {
    auto g = holds_a_tracked_object();
    for (int v : g)
      if (v == 2) break;
    BOOST_TEST(tracked::alive == 1);
  }
  BOOST_TEST(tracked::alive == 0);
}

BOOST_AUTO_TEST_CASE(a_finished_generator_is_empty_and_a_default_one_too) {
  auto g = []() -> generator<int> { co_return; }();
  BOOST_TEST((g.begin() == std::default_sentinel));
  generator<int> none;
  BOOST_TEST((none.begin() == std::default_sentinel));
}

BOOST_AUTO_TEST_CASE(a_moved_generator_continues_where_it_was) {
  auto g = count_from(1);
  auto it = g.begin();
  ++it;
  generator<int> h = std::move(g);
  auto it2 = h.begin();  // already started: begin() does not resume again
  BOOST_TEST(*it2 == 2);
}

BOOST_AUTO_TEST_CASE(copies_share_one_sequence_and_the_last_copy_destroys_it) {
  {
    auto g = holds_a_tracked_object();
    auto it = g.begin();
    ++it;
    {
      generator<int> copy = g;
      BOOST_TEST(*copy.begin() == 1);  // the same coroutine, not a restart
    }
    BOOST_TEST(tracked::alive == 1);  // still owned by g
  }
  BOOST_TEST(tracked::alive == 0);
}

BOOST_AUTO_TEST_CASE(a_generator_can_feed_another) {
  auto doubled = [](generator<int> in) -> generator<int> {
    for (int v : in) co_yield 2 * v;
  }(count_from(1));
  std::vector<int> got;
  for (int v : doubled | std::views::take(3)) got.push_back(v);
  BOOST_TEST(got == (std::vector<int>{2, 4, 6}), boost::test_tools::per_element());
}
