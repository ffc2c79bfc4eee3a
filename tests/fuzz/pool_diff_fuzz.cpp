// Differential: a byte string decoded into a pool (a ring group of f32, f16, bf16 or int8 rows
// and a dense group in blocks, a budget) and a sequence of add, remove, fork, append, truncate,
// batched attention and save→load over many sequences, run on the pool and on independent
// stores per sequence (a fork's reference is its parent's copied through a snapshot); lengths,
// refusals, held rows and attention outputs must agree bit for bit, a budget refusal must leave
// the pool as it was, and removing every sequence must return every byte. The number of
// operations run is printed at exit ("pool_diff: N operations").
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <vector>
#include <fuzzer/FuzzedDataProvider.h>

import ringkv;

#include "fuzz_support.hpp"
#include "held_rows.hpp"

namespace {

std::size_t operations = 0;

void report() { std::fprintf(stderr, "pool_diff: %zu operations\n", operations); }

/// A sequence's references: an independent store a group.
struct reference {
  ringkv::sequence_id id = 0;
  std::vector<std::unique_ptr<ringkv::kv_cache_store>> groups;
};

std::unique_ptr<ringkv::kv_cache_store> copy_of(const ringkv::kv_cache_store& s) {
  std::stringstream bytes;
  ringkv::save(s, bytes);
  return ringkv::load(bytes);
}

class differential {
 public:
  differential(FuzzedDataProvider& in, std::size_t budget, std::vector<ringkv::kv_pool_group> g,
               std::size_t block)
      : in_(in), groups_(g), pool_(budget, std::move(g), {.block_positions = block}),
        rng_(in.ConsumeIntegral<std::uint32_t>()) {}

  void run() {
    while (in_.remaining_bytes() > 0 && operations_ < 256) {
      ++operations_;
      ++operations;
      switch (in_.ConsumeIntegralInRange(0, 9)) {
        case 0:
          add();
          break;
        case 1:
          remove();
          break;
        case 2:
          fork();
          break;
        case 3:
        case 4:
          append();
          break;
        case 5:
          truncate();
          break;
        case 6:
        case 7:
          attend();
          break;
        case 8:
          move();
          break;
        default:
          check_all();
          break;
      }
    }
    check_all();
    for (const reference& r : refs_) pool_.remove(r.id);
    const ringkv::pool_memory m = pool_.memory();
    fuzz::require(m.in_use == 0 && m.shared == 0 && m.sequences == 0, "bytes left in use");
  }

 private:
  /// Runs `change` on the pool; a budget refusal must leave its report as it was.
  template <class Change>
  bool admitted(Change change) {
    const ringkv::pool_memory before = pool_.memory();
    try {
      change();
      return true;
    } catch (const ringkv::pool_budget_exceeded& e) {
      const ringkv::pool_memory after = pool_.memory();
      fuzz::require(after.in_use == before.in_use && after.sequences == before.sequences &&
                        e.free() == before.free && e.asked() > e.free(),
                    "a refusal changed the pool");
      return false;
    }
  }
  template <class Append>
  static bool refuses_full(Append append) {
    try {
      append();
      return false;
    } catch (const ringkv::cache_full&) {
      return true;
    }
  }
  reference* pick() {
    return refs_.empty() ? nullptr
                         : &refs_[in_.ConsumeIntegralInRange<std::size_t>(0, refs_.size() - 1)];
  }
  std::unique_ptr<ringkv::kv_cache_store> fresh(std::size_t g) const {
    const ringkv::kv_pool_group& group = groups_[g];
    if (group.codes)
      return std::make_unique<ringkv::int8_kv_cache_store>(group.config, group.options);
    ringkv::kv_cache_config c = group.config;
    c.capacity = pool_.groups()[g].config.capacity;  // a dense group's, rounded to blocks
    return std::make_unique<ringkv::default_kv_cache_store>(c, group.options);
  }
  void add() {
    ringkv::sequence_id id = 0;
    if (!admitted([&] { id = pool_.add(); })) return;
    reference r{id, {}};
    for (std::size_t g = 0; g < groups_.size(); ++g) r.groups.push_back(fresh(g));
    refs_.push_back(std::move(r));
  }
  void remove() {
    if (refs_.empty()) return;
    const std::size_t i = in_.ConsumeIntegralInRange<std::size_t>(0, refs_.size() - 1);
    pool_.remove(refs_[i].id);
    refs_.erase(refs_.begin() + std::ptrdiff_t(i));
  }
  void fork() {
    reference* p = pick();
    if (p == nullptr) return;
    ringkv::sequence_id id = 0;
    if (!admitted([&] { id = pool_.fork(p->id); })) return;
    reference r{id, {}};
    for (const auto& s : p->groups) r.groups.push_back(copy_of(*s));
    refs_.push_back(std::move(r));
  }
  std::vector<float> rows(std::size_t n) {
    std::normal_distribution<float> normal;
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_);
    return v;
  }
  void append() {
    reference* r = pick();
    if (r == nullptr) return;
    for (int t = in_.ConsumeIntegralInRange(1, 6); t > 0; --t)
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        const ringkv::kv_cache_config c = groups_[g].config;
        const std::vector<float> k = rows(c.row_floats()), v = rows(c.row_floats());
        for (std::size_t l = 0; l < c.layers; ++l) {
          ringkv::kv_cache_store& s = pool_.store(r->id, g);
          const std::size_t before = s.length(l);
          if (s.length(l) == s.config().capacity && !s.options().sliding_window) {
            // A full dense layer: both refuse.
            fuzz::require(refuses_full([&] { s.append(l, k, v); }) &&
                              refuses_full([&] { r->groups[g]->append(l, k, v); }),
                          "a full dense layer took a row");
          } else if (admitted([&] { s.append(l, k, v); })) {
            r->groups[g]->append(l, k, v);
          } else {
            fuzz::require(s.length(l) == before, "a refused append changed the length");
          }
        }
      }
  }
  void truncate() {
    reference* r = pick();
    if (r == nullptr) return;
    const std::size_t g = in_.ConsumeIntegralInRange<std::size_t>(0, groups_.size() - 1);
    ringkv::kv_cache_store& s = pool_.store(r->id, g);
    const std::size_t l = in_.ConsumeIntegralInRange<std::size_t>(0, groups_[g].config.layers - 1);
    const std::size_t n = in_.ConsumeIntegralInRange<std::size_t>(0, s.length(l));
    bool a = true, b = true;
    try {
      s.truncate(l, n);
    } catch (const std::out_of_range&) {
      a = false;
    }
    try {
      r->groups[g]->truncate(l, n);
    } catch (const std::out_of_range&) {
      b = false;
    }
    fuzz::require(a == b, "truncate refused on one side only");
  }
  /// One attend_batch over layer 0 of every group of some sequences against each alone; only
  /// with room for a block a side and head for every entry (a refusal mid-batch is not undone).
  void attend() {
    if (refs_.empty()) return;
    std::vector<ringkv::layer_attention> batched, alone;
    std::vector<std::vector<float>> q, k, v, out, solo;
    batched.reserve(2 * refs_.size());
    alone.reserve(2 * refs_.size());
    for (const reference& r : refs_) {
      const ringkv::kv_cache_store& dense = pool_.store(r.id, 1);
      if (!in_.ConsumeBool() || dense.length(0) == dense.config().capacity) continue;
      for (std::size_t g = 0; g < groups_.size(); ++g) {
        const ringkv::kv_cache_config c = groups_[g].config;
        batched.emplace_back(pool_.store(r.id, g), 0);
        alone.emplace_back(*r.groups[g], 0);
        q.push_back(rows(2 * c.row_floats()));
        k.push_back(rows(c.row_floats()));
        v.push_back(rows(c.row_floats()));
        out.emplace_back(q.back().size());
        solo.emplace_back(q.back().size());
      }
    }
    const ringkv::kv_cache_config d = groups_[1].config;
    if (pool_.memory().free < batched.size() * 2 * d.kv_heads * 64 * d.head_dim * 4) return;
    std::vector<ringkv::batch_entry> entries;
    for (std::size_t e = 0; e < batched.size(); ++e)
      entries.push_back({&batched[e], q[e], k[e], v[e], out[e]});
    ringkv::attend_batch(entries);
    for (std::size_t e = 0; e < alone.size(); ++e) {
      alone[e].step({q[e], k[e], v[e]}, solo[e]);
      fuzz::require(std::memcmp(out[e].data(), solo[e].data(), out[e].size() * 4) == 0,
                    "a batched output differs from the sequence's own");
    }
  }
  void move() {
    reference* r = pick();
    if (r == nullptr) return;
    std::stringstream bytes;
    pool_.save(r->id, bytes);
    ringkv::sequence_id id = 0;
    if (!admitted([&] { id = pool_.load(bytes); })) return;
    reference copy{id, {}};
    for (const auto& s : r->groups) copy.groups.push_back(copy_of(*s));
    refs_.push_back(std::move(copy));
  }
  void check_all() {
    for (const reference& r : refs_)
      for (std::size_t g = 0; g < groups_.size(); ++g)
        fuzz::require(ringkv_test::same_held_rows(pool_.store(r.id, g), *r.groups[g]),
                      "rows differ");
  }

  FuzzedDataProvider& in_;
  std::vector<ringkv::kv_pool_group> groups_;
  ringkv::kv_cache_pool pool_;
  std::mt19937 rng_;
  std::vector<reference> refs_;
  std::size_t operations_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool registered = (std::atexit(report), true);
  (void)registered;
  FuzzedDataProvider in(data, size);
  const std::size_t heads = in.ConsumeIntegralInRange<std::size_t>(1, 2);
  const std::size_t dim = in.ConsumeBool() ? 64 : 128;
  ringkv::kv_pool_group ring{.config = {.layers = in.ConsumeIntegralInRange<std::size_t>(1, 2),
                                        .kv_heads = heads,
                                        .head_dim = dim,
                                        .capacity = in.ConsumeIntegralInRange<std::size_t>(4, 24)}};
  ring.options.sliding_window = true;
  ring.options.keep = in.ConsumeIntegralInRange<std::size_t>(0, 2);
  ring.options.slack = in.ConsumeIntegralInRange<std::size_t>(0, 1);
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      break;
    case 1:
      ring.config.key_type = ring.config.value_type = ringkv::dtype::f16;
      break;
    case 2:
      ring.config.key_type = ring.config.value_type = ringkv::dtype::bf16;
      break;
    default:
      ring.codes = ringkv::compression::int8;
      break;
  }
  ringkv::kv_pool_group dense{
      .config = {.layers = 1,
                 .kv_heads = heads,
                 .head_dim = dim,
                 .capacity = in.ConsumeIntegralInRange<std::size_t>(1, 300)}};
  if (in.ConsumeBool()) dense.config.key_type = dense.config.value_type = ringkv::dtype::f16;
  const std::size_t block = in.ConsumeIntegralInRange<std::size_t>(1, 40);
  const std::size_t budget = in.ConsumeIntegralInRange<std::size_t>(1, 64) << 15;
  differential(in, budget, {ring, dense}, block).run();
  return 0;
}
