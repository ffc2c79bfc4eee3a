// attend_batch: a batch of sequences' layers attended in one call, each entry exactly its own
// step or prefill (the batch never enters an entry's arithmetic), the entries spread over a pool.
module;
#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
module ringkv.attention;

namespace ringkv {
namespace {

[[noreturn]] void refuse(std::size_t i, const std::string& what) {
  throw std::invalid_argument("ringkv::attend_batch: entry " + std::to_string(i) + ": " + what);
}

/// Whether entry e is one token (a decode step) rather than a prefill chunk.
bool one_token(const batch_entry& e) {
  const kv_cache_config c = e.layer->store().config();
  return e.keys.size() == c.row_floats();
}

/// Checks entry i as its step or prefill would, and that no earlier entry has its layer.
void check(std::span<const batch_entry> entries, std::size_t i) {
  const batch_entry& e = entries[i];
  if (e.layer == nullptr) refuse(i, "layer is null");
  for (std::size_t j = 0; j < i; ++j)
    if (&entries[j].layer->store() == &e.layer->store() &&
        entries[j].layer->layer() == e.layer->layer())
      refuse(i, "layer " + std::to_string(e.layer->layer()) + " of its store is entry " +
                    std::to_string(j) + "'s too (a batch appends to each layer once)");
  if (!one_token(e)) return e.layer->check_chunk(e.queries, e.keys, e.values, e.out);
  e.layer->check({e.queries, e.keys, e.values});
  if (e.out.size() != e.queries.size())
    refuse(i, "out has " + std::to_string(e.out.size()) + " floats, queries has " +
                  std::to_string(e.queries.size()));
  // What the store's append would refuse, refused before any entry appends (a step alone
  // leaves that to append, which refuses before it changes anything).
  const kv_cache_store& store = e.layer->store();
  const kv_cache_config c = store.config();
  require_storable("attend_batch", "entry " + std::to_string(i) + " keys", e.keys, c.key_type);
  require_storable("attend_batch", "entry " + std::to_string(i) + " values", e.values,
                   c.value_type);
  if (!store.options().sliding_window && store.length(e.layer->layer()) == c.capacity)
    throw cache_full("ringkv::attend_batch: entry " + std::to_string(i) + ": layer " +
                     std::to_string(e.layer->layer()) + " holds all " + std::to_string(c.capacity) +
                     " positions of its dense store");
}

/// Multiply-adds of an entry's scores, to weigh it against the batch: queries × the positions
/// each sees (at most the window); O(1).
std::size_t work(const batch_entry& e) {
  const std::size_t tokens = e.keys.size() / e.layer->store().config().row_floats();
  const std::size_t seen = e.layer->store().length(e.layer->layer()) + tokens;
  return e.queries.size() * std::min(seen, e.layer->window());
}

void run(const batch_entry& e) {
  if (one_token(e))
    e.layer->step({e.queries, e.keys, e.values}, e.out);
  else
    e.layer->prefill(e.queries, e.keys, e.values, e.out);
}

}  // namespace

void attend_batch(std::span<const batch_entry> entries, thread_pool* pool) {
  bool traced = false;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    check(entries, i);
    traced = traced || entries[i].layer->sink().enabled();
  }
  // Memory for every entry's rows (a pool's dense blocks) before any entry appends: a budget
  // refuses here, leaving every store's positions and rows as they were.
  for (const batch_entry& e : entries) {
    kv_cache_store& store = e.layer->store();
    store.reserve(e.layer->layer(), e.keys.size() / store.config().row_floats());
  }
  if (pool == nullptr || pool->size() <= 1 || entries.size() <= 1 || traced) {
    for (const batch_entry& e : entries) run(e);
    return;
  }
  // An entry with more than a thread's share of the work whose layer splits over this same pool
  // runs first on its own, split by kv head and segment or tile (its own split, so its bits);
  // the others go whole to the threads. The batch decides the schedule, never the arithmetic.
  std::size_t total = 0;
  for (const batch_entry& e : entries) total += work(e);
  const std::size_t share = total / pool->size();
  const auto alone = [&](const batch_entry& e) {
    return e.layer->options().pool == pool && work(e) > share;
  };
  for (const batch_entry& e : entries)
    if (alone(e)) run(e);
  pool->parallel_for(entries.size(), [&](std::size_t i) {
    if (!alone(entries[i])) run(entries[i]);
  });
}

void layer_attention::check_chunk(std::span<const float> queries, std::span<const float> keys,
                                  std::span<const float> values, std::span<const float> out) const {
  layer_options o = options_;
  o.window = window_;
  detail::check_chunk(*store_, layer_, queries, keys, values, out, o);
}

}  // namespace ringkv
