#define BOOST_TEST_MODULE pool
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "count_new.hpp"

import ringkv;

#include "held_rows.hpp"

// A pool's sequences against independent stores fed the same rows: every read, window and
// attention output bit for bit, through forks, wraps, budget refusals, saves and removal.

namespace {

// Group 0: a ring of 40 slots (2 pinned, 3 slack) of f16 rows; group 1: dense f32 layers in
// blocks of 64 positions (a head's f32 block of D 32 is two 4 KiB pages).
std::vector<ringkv::kv_pool_group> shape() {
  return {{.config = {.layers = 2,
                      .kv_heads = 2,
                      .head_dim = 32,
                      .capacity = 40,
                      .key_type = ringkv::dtype::f16,
                      .value_type = ringkv::dtype::f16},
           .options = {.sliding_window = true, .keep = 2, .slack = 3}},
          {.config = {.layers = 1, .kv_heads = 2, .head_dim = 32, .capacity = 640}}};
}
constexpr ringkv::kv_pool_options blocks_of_64{.block_positions = 64};
constexpr std::size_t row = 2 * 32;  // floats of one token's key (or value) in a layer

/// The rows of one token, from its seed: a key and a value per layer of each group.
std::vector<float> token_rows(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(3 * 2 * row);  // 3 layers × (key, value)
  for (float& x : v) x = normal(rng);
  return v;
}

/// Appends token `seed` to every layer of a sequence's two group stores.
void feed(ringkv::kv_cache_store& ring, ringkv::kv_cache_store& dense, std::uint32_t seed) {
  const std::vector<float> r = token_rows(seed);
  const std::span<const float> all(r);
  for (std::size_t l = 0; l < 3; ++l) {
    ringkv::kv_cache_store& s = l < 2 ? ring : dense;
    s.append(l < 2 ? l : 0, all.subspan(2 * l * row, row), all.subspan((2 * l + 1) * row, row));
  }
}

/// A sequence's independent twin: a default store per group fed the same tokens.
struct twin {
  ringkv::default_kv_cache_store ring{shape()[0].config, shape()[0].options};
  ringkv::default_kv_cache_store dense{shape()[1].config};
  std::vector<std::uint32_t> tokens;
  void feed(ringkv::kv_cache_pool& pool, ringkv::sequence_id id, std::uint32_t seed) {
    ::feed(pool.store(id, 0), pool.store(id, 1), seed);
    ::feed(ring, dense, seed);
    tokens.push_back(seed);
  }
  /// A twin of a fork: a fresh pair fed this one's tokens.
  std::unique_ptr<twin> replay() const {
    auto t = std::make_unique<twin>();
    for (const std::uint32_t s : tokens) ::feed(t->ring, t->dense, s);
    t->tokens = tokens;
    return t;
  }
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_twin(ringkv::kv_cache_pool& pool, ringkv::sequence_id id, const twin& t) {
  BOOST_TEST(ringkv_test::same_held_rows(pool.store(id, 0), t.ring));
  BOOST_TEST(ringkv_test::same_held_rows(pool.store(id, 1), t.dense));
}

std::string saved(const ringkv::kv_cache_pool& pool, ringkv::sequence_id id) {
  std::ostringstream out;
  pool.save(id, out);
  return out.str();
}

/// The budget one sequence's rings take (its dense layers take nothing until written).
std::size_t ring_bytes() {
  ringkv::kv_cache_pool probe(std::size_t(1) << 20, shape(), blocks_of_64);
  return probe.memory(probe.add()).ring_bytes;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_pool_sequence_holds_what_an_independent_store_holds) {
  ringkv::kv_cache_pool pool(std::size_t(8) << 20, shape(), blocks_of_64);
  std::vector<std::unique_ptr<twin>> twins;
  std::vector<ringkv::sequence_id> ids;
  for (std::uint32_t s = 0; s < 3; ++s) {
    ids.push_back(pool.add());
    twins.push_back(std::make_unique<twin>());
    for (std::uint32_t t = 0; t < 50 + 90 * s; ++t) twins[s]->feed(pool, ids[s], 1000 * s + t);
  }
  for (std::size_t s = 0; s < 3; ++s) {
    check_twin(pool, ids[s], *twins[s]);
    // A dense layer over several blocks is still one run, zero-copy.
    const auto w = pool.store(ids[s], 1).stored_window(ringkv::kv_side::values, 0, 0,
                                                       pool.store(ids[s], 1).length(0));
    BOOST_TEST_REQUIRE(w.has_value());
    BOOST_TEST(w->run_count() == 1u);
  }
  // Each sequence's blocks: ceil(length / 64) a side and head, of 8 KiB.
  BOOST_TEST(pool.memory(ids[2]).block_bytes == 4u * 2 * 2 * 8192);  // 230 positions
  BOOST_TEST(pool.memory().in_use == 3 * ring_bytes() + (1 + 3 + 4) * 2 * 2 * 8192u);
}

BOOST_AUTO_TEST_CASE(a_fork_shares_dense_blocks_and_each_side_diverges_after_both_wrap) {
  ringkv::kv_cache_pool pool(std::size_t(8) << 20, shape(), blocks_of_64);
  const ringkv::sequence_id parent = pool.add();
  twin p;
  for (std::uint32_t t = 0; t < 100; ++t) p.feed(pool, parent, t);  // block 0 full, block 1 part
  const std::size_t before = pool.memory().in_use;
  const ringkv::sequence_id child = pool.fork(parent);
  std::unique_ptr<twin> c = p.replay();
  BOOST_TEST(pool.memory().in_use == before + ring_bytes());  // the blocks are shared
  BOOST_TEST(pool.memory(child).shared_bytes == 2u * 2 * 2 * 8192);
  BOOST_TEST(pool.memory().shared == 2u * 2 * 2 * 8192);
  check_twin(pool, child, *c);
  // Both append past the ring's wrap and into new blocks, the child's rows different.
  for (std::uint32_t t = 0; t < 90; ++t) {
    p.feed(pool, parent, 5000 + t);
    c->feed(pool, child, 9000 + t);
  }
  check_twin(pool, parent, p);
  check_twin(pool, child, *c);
  // The partial block was copied on the first write; the full block 0 stays shared.
  BOOST_TEST(pool.memory().shared == 1u * 2 * 2 * 8192);
  // Truncating the child into its shared block and appending copies that block, not the
  // parent's rows.
  pool.store(child, 1).truncate(0, 30);
  c->dense.truncate(0, 30);
  for (std::uint32_t t = 0; t < 5; ++t) {
    const std::vector<float> r = token_rows(7000 + t);
    const std::span<const float> all(r);
    pool.store(child, 1).append(0, all.first(row), all.subspan(row, row));
    c->dense.append(0, all.first(row), all.subspan(row, row));
  }
  check_twin(pool, parent, p);
  check_twin(pool, child, *c);
  BOOST_TEST(pool.memory().shared == 0u);
}

BOOST_AUTO_TEST_CASE(the_budget_refuses_add_fork_and_append_and_changes_nothing) {
  const std::size_t rings = ring_bytes(), block = 2 * 2 * 8192;  // a position's new blocks
  // Two sequences' rings and three positions' worth of blocks.
  ringkv::kv_cache_pool pool(2 * rings + 3 * block, shape(), blocks_of_64);
  const ringkv::sequence_id a = pool.add();
  twin ta;
  for (std::uint32_t t = 0; t < 150; ++t) ta.feed(pool, a, t);  // 3 blocks: the budget is full
  const ringkv::sequence_id b = pool.add();
  const std::string a_saved = saved(pool, a), b_saved = saved(pool, b);
  const ringkv::pool_memory full = pool.memory();
  BOOST_TEST(full.free == 0u);
  const auto unchanged = [&] {
    BOOST_TEST(pool.sequences() == (std::vector<ringkv::sequence_id>{a, b}));
    BOOST_TEST(pool.memory().in_use == full.in_use);
    BOOST_TEST(saved(pool, a) == a_saved);
    BOOST_TEST(saved(pool, b) == b_saved);
  };
  const auto asks = [&](std::size_t bytes) {
    return [bytes](const ringkv::pool_budget_exceeded& e) {
      const std::string what = e.what();
      return e.asked() == bytes && e.free() == 0 &&
             what.find("asks " + std::to_string(bytes) + " bytes") != std::string::npos &&
             what.find("budget of") != std::string::npos;
    };
  };
  BOOST_CHECK_EXCEPTION(pool.add(), ringkv::pool_budget_exceeded, asks(rings));
  unchanged();
  BOOST_CHECK_EXCEPTION(pool.fork(a), ringkv::pool_budget_exceeded, asks(rings));
  unchanged();
  // b's first dense position needs a block a side and head: refused as a full cache.
  const std::vector<float> r = token_rows(1);
  const std::span<const float> all(r);
  BOOST_CHECK_EXCEPTION(pool.store(b, 1).append(0, all.first(row), all.subspan(row, row)),
                        ringkv::pool_budget_exceeded, asks(block));
  BOOST_CHECK_THROW(pool.store(b, 1).append(0, all.first(row), all.subspan(row, row)),
                    ringkv::cache_full);
  unchanged();
  // Within a's last block there is room: appends go on, and a's ring never needs the budget.
  for (std::uint32_t t = 150; t < 192; ++t) ta.feed(pool, a, t);
  check_twin(pool, a, ta);
  pool.remove(a);
  BOOST_TEST(pool.memory().in_use == rings);
  pool.store(b, 1).append(0, all.first(row), all.subspan(row, row));
}

BOOST_AUTO_TEST_CASE(removing_every_sequence_returns_every_byte) {
  ringkv::kv_cache_pool pool(std::size_t(8) << 20, shape(), blocks_of_64);
  std::mt19937 rng(7);
  std::vector<ringkv::sequence_id> live;
  std::vector<std::unique_ptr<twin>> twins;
  for (int step = 0; step < 200; ++step) {
    const std::uint32_t action = rng() % 10;
    if (live.empty() || action == 0) {
      live.push_back(pool.add());
      twins.push_back(std::make_unique<twin>());
    } else if (action == 1) {
      const std::size_t i = rng() % live.size();
      live.push_back(pool.fork(live[i]));
      twins.push_back(twins[i]->replay());
    } else if (action == 2) {
      const std::size_t i = rng() % live.size();
      pool.remove(live[i]);
      live.erase(live.begin() + std::ptrdiff_t(i));
      twins.erase(twins.begin() + std::ptrdiff_t(i));
    } else {
      const std::size_t i = rng() % live.size();
      for (int t = rng() % 40; t > 0; --t) twins[i]->feed(pool, live[i], rng());
    }
  }
  for (std::size_t i = 0; i < live.size(); ++i) check_twin(pool, live[i], *twins[i]);
  for (const ringkv::sequence_id id : live) pool.remove(id);
  const ringkv::pool_memory m = pool.memory();
  BOOST_TEST(m.in_use == 0u);
  BOOST_TEST(m.shared == 0u);
  BOOST_TEST(m.free == m.budget);
  BOOST_TEST(m.sequences == 0u);
}

BOOST_AUTO_TEST_CASE(a_saved_sequence_loads_into_another_pool_with_the_same_rows) {
  ringkv::kv_cache_pool from(std::size_t(8) << 20, shape(), blocks_of_64);
  const ringkv::sequence_id id = from.add();
  twin t;
  for (std::uint32_t i = 0; i < 170; ++i) t.feed(from, id, i);
  const std::string bytes = saved(from, id);
  ringkv::kv_cache_pool to(std::size_t(4) << 20, shape(), blocks_of_64);
  to.add();
  std::istringstream in(bytes);
  const ringkv::sequence_id loaded = to.load(in);
  check_twin(to, loaded, t);
  BOOST_TEST(saved(to, loaded) == bytes);
  // And it goes on as the original does.
  for (std::uint32_t i = 0; i < 30; ++i) {
    feed(to.store(loaded, 0), to.store(loaded, 1), 500 + i);
    t.feed(from, id, 500 + i);
  }
  check_twin(to, loaded, t);

  // A pool without room for its rows refuses it before taking anything: 170 dense positions
  // need 3 blocks a side and head, 12 of 8 KiB.
  ringkv::kv_cache_pool small(ring_bytes() + 11 * 8192, shape(), blocks_of_64);
  std::istringstream too_big(bytes);
  BOOST_CHECK_EXCEPTION(
      small.load(too_big), ringkv::pool_budget_exceeded, [](const ringkv::pool_budget_exceeded& e) {
        return e.asked() == ring_bytes() + 12 * 8192 && e.free() == ring_bytes() + 11 * 8192;
      });
  BOOST_TEST(small.memory().in_use == 0u);
  BOOST_TEST(small.sequences().empty());

  // A pool of another shape refuses it and adds nothing.
  std::vector<ringkv::kv_pool_group> other = shape();
  other[0].options.keep = 1;
  ringkv::kv_cache_pool elsewhere(std::size_t(4) << 20, other, blocks_of_64);
  std::istringstream again(bytes);
  BOOST_CHECK_THROW(elsewhere.load(again), ringkv::snapshot_error);
  BOOST_TEST(elsewhere.memory().in_use == 0u);
  BOOST_TEST(elsewhere.sequences().empty());
}

BOOST_AUTO_TEST_CASE(the_events_of_a_sequence_name_it) {
  ringkv::trace::recorder events(1024);
  ringkv::kv_cache_pool pool(std::size_t(8) << 20, shape(), blocks_of_64, events);
  const ringkv::sequence_id a = pool.add();
  const ringkv::sequence_id b = pool.add();
  feed(pool.store(b, 0), pool.store(b, 1), 1);
  pool.remove(a);
  std::size_t rings_of_a = 0, blocks_of_b = 0, released_of_a = 0;
  for (const auto& e : events.of<ringkv::trace::allocation>()) {
    BOOST_TEST((e.sequence == a || e.sequence == b));
    rings_of_a += e.sequence == a && e.site != "kv-pool-block" ? 1 : 0;
    blocks_of_b += e.sequence == b && e.site == "kv-pool-block" ? 1 : 0;
  }
  for (const auto& e : events.of<ringkv::trace::release>()) released_of_a += e.sequence == a;
  BOOST_TEST(rings_of_a == 4u);   // keys and values of two ring layers
  BOOST_TEST(blocks_of_b == 4u);  // a block a side and kv head
  BOOST_TEST(released_of_a == 4u);

  // Steps inside a block allocate nothing; the step that opens the next block takes its units,
  // each an event naming b.
  events.clear();
  for (std::uint32_t t = 2; t <= 64; ++t) feed(pool.store(b, 0), pool.store(b, 1), t);
  BOOST_TEST(events.size() == 0u);
  feed(pool.store(b, 0), pool.store(b, 1), 65);
  BOOST_TEST(events.size() == 4u);
  for (const auto& e : events.of<ringkv::trace::allocation>())
    BOOST_TEST((e.site == "kv-pool-block" && e.sequence == b));
}

BOOST_AUTO_TEST_CASE(a_batch_over_pool_sequences_gives_each_the_bits_it_gets_alone) {
  ringkv::kv_cache_pool pool(std::size_t(16) << 20, shape(), blocks_of_64);
  ringkv::default_thread_pool threads(2);
  std::vector<ringkv::sequence_id> ids;
  std::vector<std::unique_ptr<twin>> twins;
  for (std::uint32_t s = 0; s < 6; ++s) {
    ids.push_back(s % 3 == 2 ? pool.fork(ids[s - 1]) : pool.add());
    twins.push_back(s % 3 == 2 ? twins[s - 1]->replay() : std::make_unique<twin>());
    for (std::uint32_t t = 0; t < 20 + 13 * s; ++t) twins[s]->feed(pool, ids[s], 100 * s + t);
  }
  // Layer 1 of the ring group and the dense layer of each sequence, in the pool and alone.
  std::vector<ringkv::layer_attention> batched, alone;
  batched.reserve(2 * ids.size());
  alone.reserve(2 * ids.size());
  for (std::size_t s = 0; s < ids.size(); ++s) {
    batched.emplace_back(pool.store(ids[s], 0), 1, ringkv::layer_options{}, pool.sink(ids[s]));
    batched.emplace_back(pool.store(ids[s], 1), 0);
    alone.emplace_back(twins[s]->ring, 1);
    alone.emplace_back(twins[s]->dense, 0);
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const std::size_t n = batched.size(), width = 2 * row;  // 4 query heads a layer
  std::vector<float> q(n * width), k(n * row), v(n * row), out(n * width), solo(width);
  std::uint64_t allocations = 0;
  for (int step = 0; step < 80; ++step) {  // the dense layers cross a block boundary
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<ringkv::batch_entry> entries;
    for (std::size_t e = 0; e < n; ++e)
      entries.push_back({&batched[e], std::span(q).subspan(e * width, width),
                         std::span(k).subspan(e * row, row), std::span(v).subspan(e * row, row),
                         std::span(out).subspan(e * width, width)});
    {
      const ringkv_test::new_counter count;
      ringkv::attend_batch(entries, &threads);
      allocations += step > 0 ? count.calls() : 0;
    }
    for (std::size_t e = 0; e < n; ++e) {
      alone[e].step({entries[e].queries, entries[e].keys, entries[e].values}, solo);
      BOOST_TEST_REQUIRE(same_bits(entries[e].out, solo));
    }
  }
  BOOST_TEST(allocations == 0u);
}

BOOST_AUTO_TEST_CASE(a_batch_the_budget_cannot_hold_appends_nothing) {
  const std::size_t block = 2 * 2 * 8192;  // a block of both sides and kv heads
  ringkv::kv_cache_pool pool(2 * ring_bytes() + 2 * block, shape(), blocks_of_64);
  const ringkv::sequence_id a = pool.add(), b = pool.add();
  twin ta, tb;
  for (std::uint32_t t = 0; t < 10; ++t) ta.feed(pool, a, t);
  for (std::uint32_t t = 0; t < 64; ++t) tb.feed(pool, b, 100 + t);  // b's block is full
  ringkv::layer_attention la(pool.store(a, 1), 0), lb(pool.store(b, 1), 0);
  const std::vector<float> r = token_rows(9);
  const std::span<const float> all(r);
  std::vector<float> q(2 * row, 0.5f), out(4 * row, 7.0f);
  const std::vector<ringkv::batch_entry> entries{
      {&la, q, all.first(row), all.subspan(row, row), std::span(out).first(2 * row)},
      {&lb, q, all.first(row), all.subspan(row, row), std::span(out).subspan(2 * row)}};
  // a's row fits its block; b's needs a new one, and none is free: refused before a appends.
  BOOST_CHECK_THROW(ringkv::attend_batch(entries), ringkv::pool_budget_exceeded);
  check_twin(pool, a, ta);
  check_twin(pool, b, tb);
  BOOST_TEST(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
}

BOOST_AUTO_TEST_CASE(a_pool_refuses_what_it_cannot_hold_by_name) {
  const auto names = [](const std::string& part) {
    return [part](const std::exception& e) {
      return std::string(e.what()).find(part) != std::string::npos;
    };
  };
  std::vector<ringkv::kv_pool_group> g = shape();
  g[1].codes = ringkv::compression::int8;
  BOOST_CHECK_EXCEPTION(ringkv::kv_cache_pool(1 << 20, g), std::invalid_argument,
                        names("group 1: a dense group holds element rows"));
  g = shape();
  g[0].config.head_dim = 0;
  BOOST_CHECK_EXCEPTION(ringkv::kv_cache_pool(1 << 20, g), std::invalid_argument, names("group 0"));
  BOOST_CHECK_EXCEPTION(ringkv::kv_cache_pool(0, shape()), std::invalid_argument,
                        names("budget_bytes"));
  ringkv::kv_cache_pool pool(1 << 20, shape());
  const ringkv::sequence_id id = pool.add();
  BOOST_CHECK_EXCEPTION(pool.store(id + 1), std::out_of_range, names("no sequence 2"));
  BOOST_CHECK_EXCEPTION(pool.fork(id + 1), std::out_of_range, names("fork"));
  BOOST_CHECK_EXCEPTION(pool.remove(id + 1), std::out_of_range, names("remove"));
  BOOST_CHECK_EXCEPTION(pool.store(id, 2), std::out_of_range, names("group 2 >= groups 2"));
  BOOST_TEST(pool.contains(id));
  BOOST_TEST(!pool.contains(id + 1));
}
