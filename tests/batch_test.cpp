#define BOOST_TEST_MODULE batch
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "count_new.hpp"

import ringkv;

// Batch invariance: every entry of attend_batch gives the bits its own layer_attention gives
// alone, whatever the batch around it.

namespace {

/// One sequence twice: a store attended alone and its twin attended in batches, fed the same
/// rows, each with a layer_attention of the same options.
struct sequence {
  std::unique_ptr<ringkv::kv_cache_store> alone_store, batched_store;
  std::unique_ptr<ringkv::layer_attention> alone, batched;
  std::vector<float> sinks;
  std::size_t q_width = 0, kv_width = 0;
};

/// A store of a random kind (f32, f16, bf16, fp8, int8 or TurboQuant) and shape: a ring (with
/// pinned sinks at times) or a dense store.
std::unique_ptr<ringkv::kv_cache_store> make_store(std::uint32_t seed, std::size_t kind) {
  std::mt19937 shape(seed);  // the twins share the shape
  const std::size_t kv = 1 + shape() % 2, dim = shape() % 2 ? 16 : 32;
  const std::size_t capacity = 8 + shape() % 40;
  const bool ring = shape() % 4 != 0;
  const ringkv::store_options o{
      .sliding_window = ring, .keep = ring ? shape() % 3 : 0, .slack = ring ? shape() % 2 : 0};
  ringkv::kv_cache_config c{
      .layers = 2, .kv_heads = kv, .head_dim = dim, .capacity = ring ? capacity : 400};
  switch (kind) {
    case 4:
      return std::make_unique<ringkv::int8_kv_cache_store>(c, o);
    case 5:
      return std::make_unique<ringkv::turboquant_kv_cache_store>(
          c, ringkv::turboquant_options{.key_bits = 3, .value_bits = 4, .qjl = shape() % 2 == 0},
          o);
    default:
      c.key_type = c.value_type = ringkv::all_dtypes[kind];
      return std::make_unique<ringkv::default_kv_cache_store>(c, o);
  }
}

std::vector<float> normal_rows(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// `count` sequences of random kinds and shapes, each twin pair given the same random prefix of
/// 0–60 tokens (so rings sit at every phase), layer 1 of each store attended. With a pool, some
/// batched layers split over it themselves (a batch runs an entry with more than a thread's
/// share of the work that way, on its own).
std::vector<sequence> make_sequences(std::mt19937& rng, std::size_t count,
                                     ringkv::thread_pool* pool = nullptr) {
  std::vector<sequence> out(count);
  for (sequence& s : out) {
    const std::uint32_t seed = rng();
    const std::size_t kind = rng() % 6;
    s.alone_store = make_store(seed, kind);
    s.batched_store = make_store(seed, kind);
    const ringkv::kv_cache_config c = s.alone_store->config();
    const std::size_t group = std::size_t(1) << (rng() % 3);
    s.q_width = group * c.row_floats();
    s.kv_width = c.row_floats();
    if (rng() % 2) s.sinks = normal_rows(rng, group * c.kv_heads);
    const std::size_t limit = c.capacity - s.alone_store->options().slack;
    const std::size_t keep = s.alone_store->options().keep;
    const ringkv::layer_options o{.window = keep + 1 + rng() % (limit - keep), .sinks = s.sinks};
    s.alone = std::make_unique<ringkv::layer_attention>(*s.alone_store, 1, o);
    ringkv::layer_options split = o;
    if (rng() % 2) split.pool = pool;
    s.batched = std::make_unique<ringkv::layer_attention>(*s.batched_store, 1, split);
    const std::size_t prefix = s.alone_store->options().sliding_window ? rng() % 61 : rng() % 20;
    const auto q = normal_rows(rng, prefix * s.q_width), k = normal_rows(rng, prefix * s.kv_width),
               v = normal_rows(rng, prefix * s.kv_width);
    std::vector<float> scratch(q.size());
    s.alone->prefill(q, k, v, scratch);
    s.batched->prefill(q, k, v, scratch);
  }
  return out;
}

/// One round's tokens for a sequence: one (a decode step) or 2–20 (a prefill chunk).
struct tokens {
  std::vector<float> q, k, v, alone_out, batched_out;
};

/// One decode step's rows for each sequence (out filled with `fill`).
struct one_token_each {
  std::vector<std::vector<float>> q, k, v, out;
  one_token_each(std::mt19937& rng, const std::vector<sequence>& seqs, float fill) {
    for (const sequence& s : seqs) {
      q.push_back(normal_rows(rng, s.q_width));
      k.push_back(normal_rows(rng, s.kv_width));
      v.push_back(normal_rows(rng, s.kv_width));
      out.emplace_back(s.q_width, fill);
    }
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_entry_of_a_random_batch_gives_the_bits_it_gets_alone) {
  std::size_t compared = 0, batches = 0;
  for (const std::size_t threads : {1, 2, 3}) {
    ringkv::default_thread_pool pool(threads);
    for (const std::size_t count : {1, 7, 64}) {
      std::mt19937 rng(std::uint32_t(1000 * threads + count));
      std::vector<sequence> seqs = make_sequences(rng, count, &pool);
      for (int round = 0; round < 4; ++round) {
        // A random subset of the sequences, in shuffled order, decode steps and chunks mixed.
        std::vector<std::size_t> members;
        for (std::size_t i = 0; i < count; ++i)
          if (count == 1 || rng() % 4 != 0) members.push_back(i);
        std::shuffle(members.begin(), members.end(), rng);
        std::vector<tokens> data(count);
        std::vector<ringkv::batch_entry> entries;
        for (const std::size_t i : members) {
          sequence& s = seqs[i];
          const std::size_t n = rng() % 2 ? 1 : 2 + rng() % 19;
          tokens& t = data[i];
          t.q = normal_rows(rng, n * s.q_width);
          t.k = normal_rows(rng, n * s.kv_width);
          t.v = normal_rows(rng, n * s.kv_width);
          t.alone_out.assign(t.q.size(), 0.0f);
          t.batched_out.assign(t.q.size(), 1.0f);
          if (n == 1)
            s.alone->step({t.q, t.k, t.v}, t.alone_out);
          else
            s.alone->prefill(t.q, t.k, t.v, t.alone_out);
          entries.push_back({s.batched.get(), t.q, t.k, t.v, t.batched_out});
        }
        ringkv::attend_batch(entries, &pool);
        ++batches;
        for (const std::size_t i : members) {
          BOOST_TEST(same_bits(data[i].alone_out, data[i].batched_out),
                     threads << " threads, " << count << " sequences, round " << round
                             << ", sequence " << i);
          BOOST_TEST(seqs[i].alone_store->length(1) == seqs[i].batched_store->length(1));
          compared += data[i].alone_out.size();
        }
      }
    }
  }
  BOOST_TEST_MESSAGE(batches << " batches, " << compared << " output floats compared");
}

BOOST_AUTO_TEST_CASE(a_bad_entry_is_refused_before_any_entry_changes_anything) {
  std::mt19937 rng(5);
  std::vector<sequence> seqs = make_sequences(rng, 3);
  one_token_each rows(rng, seqs, 7.0f);
  auto &q = rows.q, &k = rows.k, &v = rows.v, &out = rows.out;
  const auto entry = [&](std::size_t i) {
    return ringkv::batch_entry{seqs[i].batched.get(), q[i], k[i], v[i], out[i]};
  };
  std::vector<std::size_t> before;
  for (const sequence& s : seqs) before.push_back(s.batched_store->length(1));
  const auto unchanged = [&] {
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      BOOST_TEST(seqs[i].batched_store->length(1) == before[i]);
      BOOST_TEST(std::count(out[i].begin(), out[i].end(), 7.0f) == long(out[i].size()));
    }
  };
  ringkv::default_thread_pool pool(2);
  const auto refused = [&](std::vector<ringkv::batch_entry> entries, const char* words) {
    BOOST_CHECK_EXCEPTION(ringkv::attend_batch(entries, &pool), std::invalid_argument,
                          [&](const std::invalid_argument& e) {
                            return std::string(e.what()).find(words) != std::string::npos;
                          });
    unchanged();
  };
  // The last entry's key row is short: the first two are not appended either.
  std::vector<float> short_k(k[2].size() - 1);
  refused({entry(0), entry(1), {seqs[2].batched.get(), q[2], short_k, v[2], out[2]}},
          "kv_heads * head_dim");
  refused({entry(0), entry(1), entry(0)}, "entry 2: layer 1 of its store is entry 0's too");
  q[1][0] = std::numeric_limits<float>::quiet_NaN();
  refused({entry(0), entry(1)}, "non-finite");
  q[1][0] = 0.0f;
  // What the last entry's store would refuse at its append: a value its f16 cannot hold, a full
  // dense layer.
  ringkv::default_kv_cache_store half({.layers = 1,
                                       .kv_heads = 1,
                                       .head_dim = 4,
                                       .capacity = 2,
                                       .key_type = ringkv::dtype::f16,
                                       .value_type = ringkv::dtype::f16});
  ringkv::layer_attention half_layer(half, 0);
  std::vector<float> hq(4, 0.5f), hk(4, 0.5f), hv(4, 0.5f), hout(4, 7.0f);
  hv[2] = 70000.0f;
  refused({entry(0), entry(1), {&half_layer, hq, hk, hv, hout}}, "entry 2 values[2] = 70000");
  hv[2] = 0.5f;
  half_layer.step({hq, hk, hv}, hout);
  half_layer.step({hq, hk, hv}, hout);
  std::fill(hout.begin(), hout.end(), 7.0f);
  BOOST_CHECK_THROW(
      ringkv::attend_batch(
          std::vector<ringkv::batch_entry>{entry(0), {&half_layer, hq, hk, hv, hout}}, &pool),
      ringkv::cache_full);
  unchanged();
  BOOST_TEST(half.length(0) == 2u);
}

BOOST_AUTO_TEST_CASE(a_warm_batch_of_decode_steps_allocates_nothing_on_any_thread_count) {
  std::mt19937 rng(9);
  std::vector<sequence> seqs = make_sequences(rng, 16);
  one_token_each rows(rng, seqs, 0.0f);
  auto &q = rows.q, &k = rows.k, &v = rows.v, &out = rows.out;
  std::vector<ringkv::batch_entry> entries;
  for (std::size_t i = 0; i < seqs.size(); ++i)
    entries.push_back({seqs[i].batched.get(), q[i], k[i], v[i], out[i]});
  for (const std::size_t threads : {1, 2, 3}) {
    ringkv::default_thread_pool pool(threads);
    ringkv::attend_batch(entries, &pool);  // warm: each layer sizes what it keeps
    ringkv::attend_batch(entries, &pool);
    const ringkv_test::new_counter counter;
    for (int step = 0; step < 8; ++step) ringkv::attend_batch(entries, &pool);
    BOOST_TEST(counter.calls() == 0u, threads << " threads");
  }
}
