#define BOOST_TEST_MODULE model
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <range/v3/iterator/operations.hpp>
#include <range/v3/range/access.hpp>
#include <range/v3/range/operations.hpp>

import ringkv;

#include "store_support.hpp"
#include "deque_store.hpp"
#include "outcome.hpp"

namespace trace = ringkv::trace;
using ringkv::kv_cache_config;
using ringkv::kv_side;
using ringkv::store_options;
using store_test::deque_store;
using store_test::positions_of;

namespace {

/// How often each kind of operation succeeded and was refused, so the check cannot silently
/// degenerate into only the easy cases.
struct tally {
  std::size_t windows[2]{}, reads[2]{}, truncates[2]{}, full_appends = 0;
};

struct shape {
  std::size_t capacity, keep, slack;
  bool ring;
};

/// The stores the check runs: the default f32 store and the compressed ones, whose rows are
/// lossy (the reference then keeps the rows as the store read them back right after appending,
/// so a row landing in the wrong slot still shows).
enum class store_kind { f32, int8, turboquant, turboquant_qjl };
std::ostream& operator<<(std::ostream& os, store_kind k) {
  const char* names[] = {"default f32", "int8", "turboquant 3-bit", "turboquant 4-bit + QJL"};
  return os << names[int(k)];
}

std::unique_ptr<ringkv::kv_cache_store> make_store(store_kind kind, const kv_cache_config& c,
                                                   const store_options& o, trace::sink& sink) {
  switch (kind) {
    case store_kind::f32:
      return std::make_unique<ringkv::default_kv_cache_store>(c, o, sink);
    case store_kind::int8:
      return std::make_unique<ringkv::int8_kv_cache_store>(c, o, sink);
    case store_kind::turboquant:
      return std::make_unique<ringkv::turboquant_kv_cache_store>(
          c, ringkv::turboquant_options{.key_bits = 3, .value_bits = 3}, o, sink);
    case store_kind::turboquant_qjl:
      return std::make_unique<ringkv::turboquant_kv_cache_store>(
          c, ringkv::turboquant_options{.key_bits = 4, .value_bits = 2, .qjl = true}, o, sink);
  }
  throw std::invalid_argument("make_store: kind");
}

/// The store's compressed window [from, to) (plus sinks), for stores that have one.
std::optional<ringkv::compressed_window> compressed(const ringkv::kv_cache_store& s, kv_side side,
                                                    std::size_t l, std::size_t from,
                                                    std::size_t to) {
  const bool keys = side == kv_side::keys;
  if (auto* t = dynamic_cast<const ringkv::turboquant_kv_cache_store*>(&s))
    return keys ? t->compressed_key_window(l, from, to) : t->compressed_value_window(l, from, to);
  if (auto* i = dynamic_cast<const ringkv::int8_kv_cache_store*>(&s))
    return keys ? i->compressed_key_window(l, from, to) : i->compressed_value_window(l, from, to);
  return std::nullopt;
}

std::ostream& operator<<(std::ostream& os, const shape& s) {
  return os << "capacity " << s.capacity << " keep " << s.keep << " slack " << s.slack
            << (s.ring ? " ring" : " dense");
}

/// Runs random operations on a default store and the reference side by side, checking that
/// contents, windows and refusals agree after every step. Returns the number of steps.
class model_check {
 public:
  model_check(store_kind kind, shape sh, std::uint32_t seed, tally& t)
      : kind_(kind), sh_(sh), tally_(t),
        cfg_{.layers = 2, .kv_heads = 2, .head_dim = 3, .capacity = sh.capacity},
        opt_{.sliding_window = sh.ring, .keep = sh.keep, .slack = sh.slack},
        owned_(make_store(kind, cfg_, opt_, store_trace_)), store_(*owned_),
        model_(cfg_, opt_, model_trace_), rng_(seed), key_(cfg_.row_floats()),
        value_(cfg_.row_floats()), arena_(4096) {
    store_trace_.clear();  // forget the construction's allocations
  }

  void run(std::size_t steps) {
    for (std::size_t i = 0; i < steps; ++i) {
      const std::size_t l = pick(0, cfg_.layers - 1);
      const std::size_t op = pick(0, 99);
      if (op < 45)
        append(l);
      else if (op < 65)
        window(l);
      else if (op < 78)
        read(l);
      else if (op < 92)
        truncate(l);
      else if (op < 96)
        bad_append(l);
      else if (op < 99)
        both([&](auto& s) { s.clear(l); });
      else
        both([](auto& s) { s.clear(); });
      compare_positions();
      arena_.reset();
    }
    BOOST_REQUIRE((store_test::snap(store_) == store_test::snap(model_)));
    BOOST_REQUIRE(store_trace_.emitted() == 0u);  // no copy but the announced dequantizations
  }

 private:
  std::size_t pick(std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng_);
  }
  // Runs f on both stores; they must both succeed or both refuse with the same exception type.
  template <class F>
  int both(F f) {
    const int a = outcome(f, store_), b = outcome(f, model_);
    BOOST_REQUIRE_MESSAGE(a == b,
                          kind_ << ", " << sh_ << ": store outcome " << a << ", reference " << b);
    return a;
  }
  template <class F, class S>
  static int outcome(F&& f, S& s) {
    return ringkv_test::outcome([&] { f(s); });
  }
  void append(std::size_t l) {
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    for (float& x : key_) x = value(rng_);
    for (float& x : value_) x = value(rng_);
    const std::size_t position = model_.length(l);
    if (kind_ == store_kind::f32) {
      tally_.full_appends +=
          both([&](auto& s) { BOOST_REQUIRE(s.append(l, key_, value_) == position); }) == 1;
      return;
    }
    // Lossy: the reference keeps the row the store reads back at that position.
    auto append = [&](auto& s) { BOOST_REQUIRE(s.append(l, key_, value_) == position); };
    const int a = outcome(append, store_);
    if (a == 0) {
      store_.read_keys(l, position, position + 1, key_);
      store_.read_values(l, position, position + 1, value_);
    }
    BOOST_REQUIRE(outcome(append, model_) == a);
    tally_.full_appends += a == 1;
  }
  void bad_append(std::size_t l) {
    std::vector<float> wrong(cfg_.row_floats() + (pick(0, 1) ? 1 : -1));
    const int a = outcome([&](auto& s) { s.append(l, wrong, value_); }, store_);
    const int b = outcome([&](auto& s) { s.append(cfg_.layers + l, key_, value_); }, store_);
    BOOST_REQUIRE(a == 3);
    BOOST_REQUIRE(b == 2);
  }
  // A range around what is held, sometimes reversed or past the end.
  std::pair<std::size_t, std::size_t> random_range(std::size_t l) {
    const std::size_t n = model_.length(l);
    const std::size_t lo = n > sh_.capacity + 2 ? n - sh_.capacity - 2 : 0;
    std::size_t from = pick(lo, n + 1), to = pick(lo, n + 1);
    if (from > to && pick(0, 3) != 0) std::swap(from, to);
    return {from, to};
  }
  bool held(std::size_t l, std::size_t from, std::size_t to) const {
    if (from > to || to > model_.length(l)) return false;
    for (std::size_t p = from; p < to; ++p)
      if (model_.find(l, p) == nullptr) return false;
    return true;
  }
  void window(std::size_t l) {
    const auto [from, to] = random_range(l);
    const bool ok = held(l, from, to);
    const kv_side side = pick(0, 1) ? kv_side::keys : kv_side::values;
    std::optional<ringkv::windowed_kv> zero_copy, copied;
    // Both through the interface: the default store overrides the scope-taking window.
    auto take = [&](std::optional<ringkv::windowed_kv>& out) {
      return [&, &out = out](const ringkv::kv_cache_store& s) {
        out = side == kv_side::keys ? s.key_window(l, from, to, arena_)
                                    : s.value_window(l, from, to, arena_);
      };
    };
    const int a = outcome(take(zero_copy), store_), b = outcome(take(copied), model_);
    BOOST_REQUIRE(a == b);
    ++tally_.windows[a != 0];
    BOOST_REQUIRE_MESSAGE(zero_copy.has_value() == ok,
                          sh_ << ": window [" << from << ", " << to << ") held " << ok);
    if (!ok) return;
    std::vector<std::size_t> expected;
    if (sh_.keep > 0 && from > 0)
      for (std::size_t p = 0; p < std::min(sh_.keep, from); ++p) expected.push_back(p);
    for (std::size_t p = std::max(from, expected.size()); p < to; ++p) expected.push_back(p);
    BOOST_REQUIRE(positions_of(*zero_copy) == expected);
    BOOST_REQUIRE(positions_of(*copied) == expected);
    BOOST_REQUIRE(zero_copy->runs().size() <= 3u);
    BOOST_REQUIRE(wrong_rows(*zero_copy, side, l) == 0u);
    BOOST_REQUIRE(wrong_rows(*copied, side, l) == 0u);
    if (auto* f32 = dynamic_cast<const ringkv::default_kv_cache_store*>(&store_)) {
      const auto& buffer = side == kv_side::keys ? f32->key_storage(l) : f32->value_storage(l);
      for (const auto& run : zero_copy->runs()) BOOST_REQUIRE(buffer.contains(run.data()));
    } else {
      check_copy_trace(store_trace_, "dequantize-kv-window", side, expected.size());
      const auto codes = compressed(store_, side, l, from, to);
      BOOST_REQUIRE(positions_of(*codes) == expected);
      BOOST_REQUIRE(codes->runs().size() <= 3u);
      BOOST_REQUIRE(store_trace_.emitted() == 0u);  // a compressed window copies nothing
    }
    check_copy_trace(model_trace_, "copy-kv-window", side, expected.size());
  }
  void check_copy_trace(trace::recorder& rec, std::string_view kind, kv_side side,
                        std::size_t positions) {
    auto adapters = rec.of<trace::adapter_inserted>();
    BOOST_REQUIRE(ranges::distance(adapters) == (positions > 0 ? 1 : 0));
    if (positions > 0) {
      const trace::adapter_inserted& a = *ranges::begin(adapters);
      BOOST_REQUIRE(a.kind == kind);
      BOOST_REQUIRE(a.target == (side == kv_side::keys ? "keys" : "values"));
      BOOST_REQUIRE(a.bytes == positions * cfg_.row_floats() * sizeof(float));
    }
    BOOST_REQUIRE(rec.emitted() == ranges::distance(adapters));  // nothing else, no allocation
    rec.clear();
  }
  std::size_t wrong_rows(const ringkv::windowed_kv& w, kv_side side, std::size_t l) const {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < w.runs().size(); ++i)
      for (std::size_t p = 0; p < w.runs()[i].positions(); ++p) {
        const auto* r = model_.find(l, w.run_first_position(i) + p);
        for (std::size_t h = 0; h < cfg_.kv_heads; ++h)
          for (std::size_t d = 0; d < cfg_.head_dim; ++d)
            wrong += w.runs()[i].row<float>(h, p)[d] !=
                     (side == kv_side::keys ? r->key : r->value)[h * cfg_.head_dim + d];
      }
    return wrong;
  }
  void read(std::size_t l) {
    const auto [from, to] = random_range(l);
    const std::size_t size = from <= to ? (to - from) * cfg_.row_floats() : 0;
    std::vector<float> a(size, -1.0f), b(size, -2.0f);
    const bool keys = pick(0, 1);
    const int ra = outcome(
        [&](auto& s) { keys ? s.read_keys(l, from, to, a) : s.read_values(l, from, to, a); },
        store_);
    const int rb = outcome(
        [&](auto& s) { keys ? s.read_keys(l, from, to, b) : s.read_values(l, from, to, b); },
        model_);
    BOOST_REQUIRE(ra == rb);
    BOOST_REQUIRE(ra == (held(l, from, to) ? 0 : 2));
    ++tally_.reads[ra != 0];
    if (ra == 0)
      BOOST_REQUIRE(a == b);
    else
      BOOST_REQUIRE(a == std::vector<float>(size, -1.0f));  // out untouched when refused
  }
  void truncate(std::size_t l) {
    const std::size_t n = model_.length(l), back = pick(0, sh_.slack + 5);
    const std::size_t to = back > n ? 0 : n - back + (pick(0, 9) == 0);  // sometimes past the end
    ++tally_.truncates[both([&](auto& s) { s.truncate(l, to); }) != 0];
  }
  void compare_positions() {
    for (std::size_t l = 0; l < cfg_.layers; ++l)
      if (store_.length(l) != model_.length(l) ||
          store_.window_start(l) != model_.window_start(l) || store_.held(l) != model_.held(l))
        BOOST_FAIL(sh_ << ": layer " << l << " length/window_start/held " << store_.length(l) << "/"
                       << store_.window_start(l) << "/" << store_.held(l) << ", reference "
                       << model_.length(l) << "/" << model_.window_start(l) << "/"
                       << model_.held(l));
  }

  store_kind kind_;
  shape sh_;
  tally& tally_;
  kv_cache_config cfg_;
  store_options opt_;
  trace::recorder store_trace_{64}, model_trace_{64};
  std::unique_ptr<ringkv::kv_cache_store> owned_;
  ringkv::kv_cache_store& store_;
  deque_store model_;
  std::mt19937 rng_;
  std::vector<float> key_, value_;
  ringkv::scope arena_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_store_that_implements_only_the_core_copies_its_windows_once_and_says_so) {
  trace::recorder rec(16);
  const kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = 3, .capacity = 5};
  deque_store s(c, {.sliding_window = true, .keep = 1}, rec);
  store_test::rows r(c);
  r.append_all(s, 9);  // held 0, [5, 9)
  ringkv::scope arena(4096);
  const auto w = s.key_window(0, 6, 9, arena);
  BOOST_TEST(positions_of(w) == (std::vector<std::size_t>{0, 6, 7, 8}),
             boost::test_tools::per_element());
  BOOST_TEST(store_test::wrong_elements(w, kv_side::keys, 0) == 0u);
  BOOST_TEST(arena.live() > 0u);  // the rows live in the caller's scope
  const auto v = s.value_window(0, 5, 9, arena);
  BOOST_TEST(store_test::wrong_elements(v, kv_side::values, 0) == 0u);
  std::vector<std::string> seen;
  for (const auto& a : rec.of<trace::adapter_inserted>()) {
    seen.emplace_back(a.target);
    BOOST_TEST(a.kind == "copy-kv-window");
  }
  BOOST_TEST(seen == (std::vector<std::string>{"keys", "values"}),
             boost::test_tools::per_element());
  auto adapters = rec.of<trace::adapter_inserted>();
  BOOST_TEST((*ranges::begin(adapters)).bytes == 4u * 2u * 3u * 4u);
  BOOST_TEST(rec.emitted() == 2u);
  BOOST_CHECK_THROW(s.key_window(0, 4, 9, arena), std::out_of_range);
  const std::size_t live = arena.live();
  BOOST_CHECK_THROW(s.value_window(0, 7, 10, arena), std::out_of_range);
  BOOST_TEST(arena.live() == live);  // refused before taking memory
  BOOST_TEST(rec.emitted() == 2u);
  rec.clear();
  BOOST_TEST(deque_store(c, {}, rec).key_window(0, 0, 0, arena).empty());
  BOOST_TEST(rec.emitted() == 0u);  // nothing copied, nothing said
}

BOOST_AUTO_TEST_CASE(random_operations_agree_with_a_deque_of_rows_reference) {
  const shape shapes[] = {{4, 0, 0, false}, {7, 0, 0, false}, {1, 0, 0, true}, {4, 0, 0, true},
                          {5, 0, 2, true},  {6, 2, 0, true},  {7, 2, 2, true}, {8, 3, 1, true},
                          {3, 2, 0, true},  {6, 1, 4, true}};
  for (store_kind kind :
       {store_kind::f32, store_kind::int8, store_kind::turboquant, store_kind::turboquant_qjl}) {
    BOOST_TEST_CONTEXT(kind) {
      // The compressed stores share the slot bookkeeping: half the sequences keep the suite fast.
      const std::uint32_t seeds = kind == store_kind::f32 ? 200 : 100;
      std::size_t sequences = 0;
      tally t;
      for (const shape& sh : shapes) {
        BOOST_TEST_CONTEXT(sh) {
          for (std::uint32_t seed = 1; seed <= seeds; ++seed, ++sequences) {
            model_check check(kind, sh, seed, t);
            check.run(80);
          }
        }
      }
      BOOST_TEST_MESSAGE(
          kind << ": " << sequences << " random sequences of 80 operations; windows held/refused "
               << t.windows[0] << "/" << t.windows[1] << ", reads " << t.reads[0] << "/"
               << t.reads[1] << ", truncates " << t.truncates[0] << "/" << t.truncates[1]
               << ", appends to a full dense layer " << t.full_appends);
      BOOST_TEST(sequences == 10u * seeds);
      for (const std::size_t* counts : {t.windows, t.reads, t.truncates}) {
        BOOST_TEST(counts[0] > 1000u);
        BOOST_TEST(counts[1] > 500u);
      }
      BOOST_TEST(t.full_appends > 100u);
    }
  }
}
