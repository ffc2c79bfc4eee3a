// Differential: a byte string decoded into a store (default f32/f16/bf16, TurboQuant with its
// bit widths, QJL and seed, or int8), its shape, and a sequence of append, window,
// read, truncate, clear and save→load operations, run on that store and on the deque-of-rows
// reference (tests/support/deque_store.hpp); positions, refusals and contents must agree after
// every operation. The rows appended are exact in f32, f16 and bf16, so the reference of a default
// store (any dtype) keeps the rows as given and a wrongly stored value shows; for lossy stores
// (TurboQuant, int8) it keeps the row the store reads back right after appending, so a row in the
// wrong slot still shows. The number of operations run is printed at exit ("store_diff: N
// operations").
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <fuzzer/FuzzedDataProvider.h>

import ringkv;

#include "store_support.hpp"
#include "deque_store.hpp"
#include "fuzz_support.hpp"

namespace {

std::size_t operations = 0;

void report() { std::fprintf(stderr, "store_diff: %zu operations\n", operations); }

class differential {
 public:
  differential(FuzzedDataProvider& in, const ringkv::kv_cache_config& c,
               const ringkv::store_options& o, std::unique_ptr<ringkv::kv_cache_store> store)
      : in_(in), c_(c), store_(std::move(store)), model_(c, o, ringkv::trace::null_sink()),
        key_(c.row_floats()), value_(c.row_floats()), arena_(4096),
        lossy_(dynamic_cast<ringkv::default_kv_cache_store*>(store_.get()) == nullptr),
        half_views_(!lossy_ &&
                    (c.key_type != ringkv::dtype::f32 || c.value_type != ringkv::dtype::f32)) {}

  void run() {
    while (in_.remaining_bytes() > 0 && steps_ < 512) {
      const std::size_t l = in_.ConsumeIntegralInRange<std::size_t>(0, c_.layers - 1);
      switch (in_.ConsumeIntegralInRange(0, 9)) {
        case 0:
        case 1:
        case 2:
          append(l);
          break;
        case 3:
          window(l);
          break;
        case 4:
          read(l);
          break;
        case 5:
          truncate(l);
          break;
        case 6:
          both([&](ringkv::kv_cache_store& s) { s.clear(l); });
          break;
        case 7:
          both([&](ringkv::kv_cache_store& s) { s.clear(); });
          break;
        case 8:
          save_load();
          break;
        default:
          append_many(l);
          break;
      }
      compare_positions();
      arena_.reset();
      ++steps_;
      ++operations;
    }
    fuzz::require(store_test::snap(*store_) == store_test::snap(model_), "final contents");
  }

 private:
  template <class F>
  int both(F f) {
    const int a = fuzz::outcome([&] { f(*store_); }), b = fuzz::outcome([&] { f(model_); });
    if (a != b) fuzz::diverged("outcome", std::size_t(a), std::size_t(b));
    return a;
  }
  void fill_row() {
    // Multiples of 1/8 in [-16, 16): exact in f32, f16 and bf16.
    for (auto* row : {&key_, &value_})
      for (float& x : *row) x = float(in_.ConsumeIntegral<std::int8_t>()) / 8.0f;
  }
  void append(std::size_t l) {
    fill_row();
    const std::size_t position = model_.length(l);
    const int a = fuzz::outcome([&] {
      if (store_->append(l, key_, value_) != position) fuzz::diverged("position", 0, position);
    });
    if (a == 0 && lossy()) {  // the reference keeps what the store holds
      store_->read_keys(l, position, position + 1, key_);
      store_->read_values(l, position, position + 1, value_);
    }
    const int b = fuzz::outcome([&] { model_.append(l, key_, value_); });
    if (a != b) fuzz::diverged("append outcome", std::size_t(a), std::size_t(b));
  }
  void append_many(std::size_t l) {  // long runs wrap rings many times cheaply
    const std::size_t n = in_.ConsumeIntegralInRange<std::size_t>(1, 3 * c_.capacity + 1);
    for (std::size_t i = 0; i < n; ++i) append(l);
  }
  bool lossy() const { return lossy_; }
  std::pair<std::size_t, std::size_t> range(std::size_t l) {
    const std::size_t n = model_.length(l);
    const std::size_t lo = n > c_.capacity + 2 ? n - c_.capacity - 2 : 0;
    return {in_.ConsumeIntegralInRange<std::size_t>(lo, n + 1),
            in_.ConsumeIntegralInRange<std::size_t>(lo, n + 1)};
  }
  void window(std::size_t l) {
    const auto [from, to] = range(l);
    const bool keys = in_.ConsumeBool();
    std::optional<ringkv::windowed_kv> a, b;
    const int ra = fuzz::outcome([&] {
      a = keys ? store_->key_window(l, from, to, arena_)
               : store_->value_window(l, from, to, arena_);
    });
    const int rb = fuzz::outcome([&] {
      b = keys ? model_.key_window(l, from, to, arena_) : model_.value_window(l, from, to, arena_);
    });
    if (ra != rb) fuzz::diverged("window outcome", std::size_t(ra), std::size_t(rb));
    if (ra != 0) return;
    fuzz::require(a->runs().size() <= 3, "a window has more than three runs");
    fuzz::require(store_test::positions_of(*a) == store_test::positions_of(*b), "window positions");
    if (half_views_) return;  // f16/bf16 views: their contents are compared through read
    const auto side = keys ? ringkv::kv_side::keys : ringkv::kv_side::values;
    for (std::size_t i = 0; i < a->runs().size(); ++i)
      for (std::size_t h = 0; h < c_.kv_heads; ++h)
        for (std::size_t p = 0; p < a->runs()[i].positions(); ++p) {
          const auto* row = model_.find(l, a->run_first_position(i) + p);
          const auto& want = side == ringkv::kv_side::keys ? row->key : row->value;
          const auto got = a->runs()[i].row<float>(h, p);
          fuzz::require(std::memcmp(got.data(), want.data() + h * c_.head_dim,
                                    c_.head_dim * sizeof(float)) == 0,
                        "window contents");
        }
  }
  void read(std::size_t l) {
    const auto [from, to] = range(l);
    const bool keys = in_.ConsumeBool();
    const std::size_t size = from <= to ? (to - from) * c_.row_floats() : 0;
    std::vector<float> a(size, -1.0f), b(size, -2.0f);
    const int ra = fuzz::outcome(
        [&] { keys ? store_->read_keys(l, from, to, a) : store_->read_values(l, from, to, a); });
    const int rb = fuzz::outcome(
        [&] { keys ? model_.read_keys(l, from, to, b) : model_.read_values(l, from, to, b); });
    if (ra != rb) fuzz::diverged("read outcome", std::size_t(ra), std::size_t(rb));
    if (ra == 0)
      fuzz::require(a == b || std::memcmp(a.data(), b.data(), size * sizeof(float)) == 0,
                    "read contents");  // == first: also NaN-free, and empty spans have no data
    else
      fuzz::require(a == std::vector<float>(size, -1.0f), "a refused read wrote its output");
  }
  void truncate(std::size_t l) {
    const std::size_t n = model_.length(l);
    const std::size_t back = in_.ConsumeIntegralInRange<std::size_t>(0, c_.capacity + 2);
    const std::size_t to = back > n ? 0 : n - back + in_.ConsumeIntegralInRange(0, 1);
    both([&](ringkv::kv_cache_store& s) { s.truncate(l, to); });
  }
  void save_load() {
    std::ostringstream out(std::ios::binary);
    ringkv::save(*store_, out);
    std::istringstream in(out.str(), std::ios::binary);
    auto loaded = ringkv::load(in);
    std::ostringstream again(std::ios::binary);
    ringkv::save(*loaded, again);
    fuzz::require(again.str() == out.str(), "a reloaded store saves to other bytes");
    store_ = std::move(loaded);  // the rest of the sequence runs on the loaded store
  }
  void compare_positions() {
    for (std::size_t l = 0; l < c_.layers; ++l) {
      if (store_->length(l) != model_.length(l))
        fuzz::diverged("length", store_->length(l), model_.length(l));
      if (store_->window_start(l) != model_.window_start(l))
        fuzz::diverged("window_start", store_->window_start(l), model_.window_start(l));
      if (store_->held(l) != model_.held(l))
        fuzz::diverged("held", store_->held(l), model_.held(l));
    }
  }

  FuzzedDataProvider& in_;
  ringkv::kv_cache_config c_;
  std::unique_ptr<ringkv::kv_cache_store> store_;
  store_test::deque_store model_;
  std::vector<float> key_, value_;
  ringkv::scope arena_;
  bool lossy_;       // a compressed store: it does not hold the rows exactly as given
  bool half_views_;  // its windows are f16/bf16 views (not comparable as f32 rows)
  std::size_t steps_ = 0;
};

std::unique_ptr<ringkv::kv_cache_store> make_store(FuzzedDataProvider& in,
                                                   ringkv::kv_cache_config& c,
                                                   const ringkv::store_options& o) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1:
      c.key_type = ringkv::dtype(in.ConsumeIntegralInRange(0, 2));
      c.value_type = ringkv::dtype(in.ConsumeIntegralInRange(0, 2));
      return std::make_unique<ringkv::default_kv_cache_store>(c, o);
    case 2: {
      ringkv::turboquant_options t;
      t.key_bits = in.ConsumeIntegralInRange(2u, 4u);
      t.value_bits = in.ConsumeIntegralInRange(2u, 4u);
      t.qjl = in.ConsumeBool();
      t.seed = in.ConsumeIntegral<std::uint64_t>();
      return std::make_unique<ringkv::turboquant_kv_cache_store>(c, t, o);
    }
    default:
      return std::make_unique<ringkv::int8_kv_cache_store>(c, o);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(report);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  ringkv::kv_cache_config c;
  c.layers = in.ConsumeIntegralInRange<std::size_t>(1, 2);
  c.kv_heads = in.ConsumeIntegralInRange<std::size_t>(1, 2);
  c.head_dim = in.ConsumeIntegralInRange<std::size_t>(1, 4);
  c.capacity = in.ConsumeIntegralInRange<std::size_t>(1, 9);
  ringkv::store_options o;
  o.sliding_window = in.ConsumeBool();
  if (o.sliding_window) {
    o.keep = in.ConsumeIntegralInRange<std::size_t>(0, c.capacity - 1);
    o.slack = in.ConsumeIntegralInRange<std::size_t>(0, c.capacity - 1 - o.keep);
  }
  auto store = make_store(in, c, o);
  differential(in, c, o, std::move(store)).run();
  return 0;
}
