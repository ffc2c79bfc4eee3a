// kv_cache_pool: the budget's ledger, a sequence's dense layers in blocks (pooled_dense_store),
// its rings (the library's stores), and add / fork / remove / save / load.
module;
#include <algorithm>
#include <array>
#include <istream>
#include <ostream>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pool/block_arena.hpp"
module ringkv.pool;

namespace ringkv {
namespace {

using pool_detail::block_arena;
using pool_detail::no_unit;
using pool_detail::reservation;
using pool_detail::unit;

std::string str(std::size_t n) { return std::to_string(n); }

/// What the budget holds: the rings' bytes and the arena's blocks, under the arena's lock.
struct ledger {
  std::size_t budget = 0;
  std::size_t ring_bytes = 0;  // every live sequence's rings
  block_arena arena;

  ledger(std::size_t budget_bytes, std::size_t unit_bytes)
      : budget(budget_bytes), arena(unit_bytes, unit_bytes ? budget_bytes / unit_bytes : 0) {}
  /// Bytes in use; callers hold the lock.
  std::size_t in_use() const noexcept { return ring_bytes + arena.used() * arena.unit_bytes(); }
  std::size_t free() const noexcept { return budget - in_use(); }
  /// Throws pool_budget_exceeded unless `bytes` more fit (and, as blocks, `units` are free);
  /// callers hold the lock. O(1); `what()` names the request, called only to refuse it.
  template <class What>
  void admit(const What& what, std::size_t bytes, std::size_t units) const {
    if (bytes <= free() && arena.has_free(units)) return;
    throw pool_budget_exceeded("ringkv::kv_cache_pool: " + what() + " asks " + str(bytes) +
                                   " bytes of the budget of " + str(budget) + " bytes; " +
                                   str(free()) + " free",
                               bytes, free());
  }
};

/// The reserved address ranges of a dense group's layers, one a side; a base of the store so
/// they exist before the default store's constructor takes their addresses.
struct dense_ranges {
  std::vector<reservation> keys, values;  // [layers]
};

/// A dense group of one sequence: the default store's rows and slots over address ranges into
/// which blocks of `block` positions are mapped as appends reach them. A block of one side is
/// one unit a kv head: [kv_heads][capacity][head_dim] stays the layout, one run a window.
class pooled_dense_store final : private dense_ranges, public default_kv_cache_store {
 public:
  pooled_dense_store(const kv_cache_config& config, std::size_t block, ledger& book,
                     trace::sink& sink)
      : dense_ranges(reserve(config)),
        default_kv_cache_store(config, {}, memory_of(*this), "kv_cache_pool dense group", sink),
        book_(&book), block_(block), blocks_(config.capacity / block),
        chunk_{block * config.head_dim * size_of(config.key_type),
               block * config.head_dim * size_of(config.value_type)},
        units_(config.layers), exclusive_(config.layers, no_block) {
    for (auto& l : units_)
      for (auto& side : l) side.assign(config.kv_heads * blocks_, no_unit);
  }
  pooled_dense_store(const pooled_dense_store&) = delete;
  pooled_dense_store& operator=(const pooled_dense_store&) = delete;
  ~pooled_dense_store() override {
    const std::lock_guard hold(book_->arena.lock());
    for (std::size_t l = 0; l < units_.size(); ++l) release_from(l, 0);
  }

  /// Shares every mapped block of `from` (same group): the fork's dense layers; O(blocks).
  void share(pooled_dense_store& from) {
    copy_positions(from);
    const std::lock_guard hold(book_->arena.lock());
    for (std::size_t l = 0; l < units_.size(); ++l) {
      for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t i = 0; i < units_[l][s].size(); ++i) {
          const unit u = from.units_[l][s][i];
          if (u == no_unit) continue;
          book_->arena.map(at(l, s, i), u, chunk_[s]);
          book_->arena.share(u);
          units_[l][s][i] = u;
        }
      exclusive_[l] = from.exclusive_[l] = no_block;
    }
  }

  void truncate(std::size_t layer, std::size_t new_length) override {
    default_kv_cache_store::truncate(layer, new_length);
    const std::lock_guard hold(book_->arena.lock());
    release_from(layer, (new_length + block_ - 1) / block_);
  }
  void clear() noexcept override {
    default_kv_cache_store::clear();
    const std::lock_guard hold(book_->arena.lock());
    for (std::size_t l = 0; l < units_.size(); ++l) release_from(l, 0);
  }
  void clear(std::size_t layer) override {
    default_kv_cache_store::clear(layer);
    const std::lock_guard hold(book_->arena.lock());
    release_from(layer, 0);
  }

  memory_report memory() const override {
    const auto [held, shared] = blocks_held();
    (void)shared;
    return report(held[0] * book_->arena.unit_bytes(), held[1] * book_->arena.unit_bytes());
  }

  /// Units held per side, and how many of them another holder shares; O(blocks).
  std::pair<std::array<std::size_t, 2>, std::size_t> blocks_held() const {
    const std::lock_guard hold(book_->arena.lock());
    std::array<std::size_t, 2> held{};
    std::size_t shared = 0;
    for (const auto& l : units_)
      for (std::size_t s = 0; s < 2; ++s)
        for (const unit u : l[s]) {
          if (u == no_unit) continue;
          ++held[s];
          shared += book_->arena.refs(u) > 1 ? 1 : 0;
        }
    return {held, shared};
  }

 protected:
  void prepare_write(std::size_t layer, std::size_t slot) override {
    if (exclusive_[layer] != slot / block_) own_blocks(layer, slot, slot + 1);
  }

 public:
  /// Takes the blocks of positions [length, length + positions), within the capacity (appends
  /// past it are refused as cache_full by append itself).
  void reserve(std::size_t layer, std::size_t positions) override {
    check_layer("kv_cache_pool dense group::reserve", layer);
    const std::size_t from = length(layer);
    const std::size_t to = from + std::min(positions, config().capacity - from);
    if (to > from) own_blocks(layer, from, to);
  }

 private:
  /// Maps blocks of its own under slots [from, to) on both sides: a new one, or a copy of one
  /// another sequence shares. All or nothing: the budget is asked for every unit first.
  void own_blocks(std::size_t layer, std::size_t from, std::size_t to) {
    const std::size_t first = from / block_, last = (to - 1) / block_;
    const std::lock_guard hold(book_->arena.lock());
    const std::size_t heads = config().kv_heads;
    std::size_t need = 0;
    for (std::size_t b = first; b <= last; ++b)
      for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t h = 0; h < heads; ++h) need += owned(layer, s, h * blocks_ + b) ? 0 : 1;
    book_->admit(
        [&] {
          return "appending positions " + str(from) + ".." + str(to - 1) + " of dense layer " +
                 str(layer);
        },
        need * book_->arena.unit_bytes(), need);
    for (std::size_t b = first; b <= last; ++b)
      for (std::size_t s = 0; s < 2; ++s)
        for (std::size_t h = 0; h < heads; ++h) own(layer, s, h * blocks_ + b);
    exclusive_[layer] = last;
  }
  /// Makes unit i of a side of `layer` mapped and held alone (a copy of a shared one's rows);
  /// callers hold the lock and admitted it. O(block).
  void own(std::size_t layer, std::size_t s, std::size_t i) {
    if (owned(layer, s, i)) return;
    const unit old = units_[layer][s][i];
    const unit fresh = book_->arena.take();
    if (old != no_unit)  // copy-on-write: the rows already in this block
      std::memcpy(book_->arena.bytes_of(fresh), book_->arena.bytes_of(old), chunk_[s]);
    book_->arena.map(at(layer, s, i), fresh, chunk_[s]);
    if (old != no_unit) book_->arena.drop(old);
    units_[layer][s][i] = fresh;
    if (sink().enabled())
      sink().emit(trace::allocation{"kv-pool-block", book_->arena.unit_bytes()});
  }

  static constexpr std::size_t no_block = ~std::size_t(0);

  static dense_ranges reserve(const kv_cache_config& c) {
    dense_ranges r;
    for (std::size_t l = 0; l < c.layers; ++l) {
      r.keys.emplace_back(c.kv_heads * c.capacity * c.head_dim * size_of(c.key_type));
      r.values.emplace_back(c.kv_heads * c.capacity * c.head_dim * size_of(c.value_type));
    }
    return r;
  }
  static std::vector<layer_memory> memory_of(const dense_ranges& r) {
    std::vector<layer_memory> m;
    m.reserve(r.keys.size());
    for (std::size_t l = 0; l < r.keys.size(); ++l)
      m.push_back({r.keys[l].data(), r.values[l].data()});
    return m;
  }
  /// Where unit i (head i / blocks_, block i % blocks_) of a side of `layer` is mapped; O(1).
  std::byte* at(std::size_t layer, std::size_t side, std::size_t i) const {
    const std::size_t h = i / blocks_, b = i % blocks_;
    const reservation& r = side == 0 ? keys[layer] : values[layer];
    return r.data() + (h * blocks_ + b) * chunk_[side];
  }
  /// Whether unit i is mapped and this store its only holder; callers hold the lock.
  bool owned(std::size_t layer, std::size_t side, std::size_t i) const {
    const unit u = units_[layer][side][i];
    return u != no_unit && book_->arena.refs(u) == 1;
  }
  /// Unmaps and drops every block >= `first` of `layer`; callers hold the lock. O(blocks).
  void release_from(std::size_t layer, std::size_t first) noexcept {
    for (std::size_t s = 0; s < 2; ++s)
      for (std::size_t i = 0; i < units_[layer][s].size(); ++i) {
        unit& u = units_[layer][s][i];
        if (u == no_unit || i % blocks_ < first) continue;
        block_arena::unmap(at(layer, s, i), chunk_[s]);
        book_->arena.drop(u);
        u = no_unit;
        if (sink().enabled())
          sink().emit(trace::release{"kv-pool-block", book_->arena.unit_bytes()});
      }
    if (exclusive_[layer] != no_block && exclusive_[layer] >= first) exclusive_[layer] = no_block;
  }

  ledger* book_;
  std::size_t block_;                 // positions a block
  std::size_t blocks_;                // capacity / block_
  std::array<std::size_t, 2> chunk_;  // bytes of one head's block, keys and values
  std::vector<std::array<std::vector<unit>, 2>> units_;  // [layers][side][kv_heads · blocks_]
  std::vector<std::size_t> exclusive_;  // [layers] the block known mapped and held alone
};

/// Appends positions [0, n) of one layer from rows laid out [kv_heads, n, head_dim] (what
/// read_keys gives) to `to`, position by position; O(n · row).
void append_positions(kv_cache_store& to, std::size_t layer, std::size_t n,
                      std::span<const float> keys, std::span<const float> values) {
  const kv_cache_config c = to.config();
  std::vector<float> k(c.row_floats()), v(c.row_floats());
  for (std::size_t p = 0; p < n; ++p) {
    for (std::size_t h = 0; h < c.kv_heads; ++h) {
      const std::size_t from = (h * n + p) * c.head_dim;
      std::copy_n(keys.begin() + std::ptrdiff_t(from), c.head_dim,
                  k.begin() + std::ptrdiff_t(h * c.head_dim));
      std::copy_n(values.begin() + std::ptrdiff_t(from), c.head_dim,
                  v.begin() + std::ptrdiff_t(h * c.head_dim));
    }
    to.append(layer, k, v);
  }
}

/// A block's positions for a dense group: `wanted` rounded up so one head's block of each side
/// fills whole pages (mappings are page-grained); O(1).
std::size_t block_positions_of(const kv_cache_config& c, std::size_t wanted) {
  const std::size_t page = pool_detail::page_bytes();
  const auto step = [&](dtype t) { return page / std::gcd(page, c.head_dim * size_of(t)); };
  const std::size_t unit = std::lcm(step(c.key_type), step(c.value_type));
  return (std::max<std::size_t>(wanted, 1) + unit - 1) / unit * unit;
}

[[noreturn]] void refuse_group(std::size_t g, const std::string& what) {
  throw std::invalid_argument("ringkv::kv_cache_pool: group " + str(g) + ": " + what);
}

/// A ring group's store for one sequence; O(its bytes).
std::unique_ptr<kv_cache_store> make_ring(const kv_pool_group& g, trace::sink& sink) {
  if (!g.codes) return std::make_unique<default_kv_cache_store>(g.config, g.options, sink);
  switch (*g.codes) {
    case compression::int8:
      return std::make_unique<int8_kv_cache_store>(g.config, g.options, sink);
    case compression::turboquant:
      return std::make_unique<turboquant_kv_cache_store>(g.config, g.turboquant, g.options, sink);
  }
  throw std::logic_error("unreachable: every compression has its case");
}

/// The row format a group's stores hold; O(1).
kv_encoding rows_of(const kv_pool_group& g) {
  if (!g.codes) return encoding_of(g.config.key_type);
  switch (*g.codes) {
    case compression::int8:
      return kv_encoding::int8;
    case compression::turboquant:
      return kv_encoding::turboquant;
  }
  return kv_encoding::turboquant;  // unreachable: every compression has its case
}

bool same_shape(const kv_cache_config& a, const kv_cache_config& b) {
  return a.layers == b.layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim &&
         a.key_type == b.key_type && a.value_type == b.value_type;
}

constexpr char sequence_magic[8] = {'R', 'K', 'V', 'S', 'E', 'Q', '0', '1'};

}  // namespace

/// One sequence: its sink (naming it) and one store a group.
struct pool_sequence {
  pool_sequence(trace::sink& to, sequence_id id) : sink(to, id) {}
  trace::sequence_sink sink;
  std::vector<std::unique_ptr<kv_cache_store>> groups;
  std::size_t ring_bytes = 0;  // charged to the ledger while it lives
  ledger* book = nullptr;
  ~pool_sequence() {
    groups.clear();
    if (book == nullptr) return;
    const std::lock_guard hold(book->arena.lock());
    book->ring_bytes -= ring_bytes;
  }
};

struct kv_cache_pool::state {
  std::vector<kv_pool_group> groups;
  std::vector<std::size_t> ring_bytes;  // [groups] a sequence's ring of the group (0: dense)
  std::vector<std::size_t> block;       // [groups] a dense group's block positions
  trace::sink* sink;
  std::unique_ptr<ledger> book;
  std::map<sequence_id, std::unique_ptr<pool_sequence>> live;
  sequence_id next = 1;

  pool_sequence& find(const char* who, sequence_id id) const {
    const auto it = live.find(id);
    if (it == live.end())
      throw std::out_of_range(std::string("ringkv::kv_cache_pool::") + who + ": no sequence " +
                              str(id) + " (ids of live sequences only)");
    return *it->second;
  }
  /// A new sequence, nothing charged yet (its id is taken: ids are never reused).
  std::unique_ptr<pool_sequence> fresh() { return std::make_unique<pool_sequence>(*sink, next++); }
  /// Charges `q` its rings, refusing (pool_budget_exceeded, nothing charged) unless they and
  /// `units` blocks more fit; O(groups).
  void charge(pool_sequence& q, const std::string& what, std::size_t units = 0) {
    const std::size_t rings = std::accumulate(ring_bytes.begin(), ring_bytes.end(), std::size_t(0));
    const std::lock_guard hold(book->arena.lock());
    book->admit([&] { return what; }, rings + units * book->arena.unit_bytes(), units);
    book->ring_bytes += rings;
    q.ring_bytes = rings;
    q.book = book.get();
  }
  std::unique_ptr<pooled_dense_store> dense(std::size_t g, pool_sequence& s) const {
    return std::make_unique<pooled_dense_store>(groups[g].config, block[g], *book, s.sink);
  }
  sequence_id keep(std::unique_ptr<pool_sequence> s) {
    const sequence_id id = s->sink.sequence();
    live.emplace(id, std::move(s));
    return id;
  }
};

kv_cache_pool::kv_cache_pool(std::size_t budget_bytes, std::vector<kv_pool_group> groups,
                             kv_pool_options options, trace::sink& sink)
    : state_(std::make_unique<state>()) {
  state& s = *state_;
  if (budget_bytes == 0)
    throw std::invalid_argument("ringkv::kv_cache_pool: budget_bytes must be > 0");
  if (groups.empty())
    throw std::invalid_argument("ringkv::kv_cache_pool: groups must not be empty");
  s.sink = &sink;
  std::size_t unit_bytes = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    kv_pool_group& group = groups[g];
    try {
      group.config.validate();
    } catch (const std::invalid_argument& e) {
      refuse_group(g, e.what());
    }
    if (group.options.sliding_window) {
      s.ring_bytes.push_back(make_ring(group, trace::null_sink())->memory().physical_bytes);
      s.block.push_back(0);
      continue;
    }
    if (group.codes)
      refuse_group(g, "a dense group holds element rows (int8 and TurboQuant rows need a ring)");
    if (group.options.keep != 0 || group.options.slack != 0)
      refuse_group(g, "keep and slack are for rings (sliding_window)");
    const std::size_t b = block_positions_of(group.config, options.block_positions);
    group.config.capacity = (group.config.capacity + b - 1) / b * b;
    const std::size_t row = group.config.head_dim * std::max(size_of(group.config.key_type),
                                                             size_of(group.config.value_type));
    unit_bytes = std::max(unit_bytes, b * row);
    s.ring_bytes.push_back(0);
    s.block.push_back(b);
  }
  s.groups = std::move(groups);
  s.book = std::make_unique<ledger>(budget_bytes, unit_bytes);
}

kv_cache_pool::~kv_cache_pool() = default;

sequence_id kv_cache_pool::add() {
  state& s = *state_;
  std::unique_ptr<pool_sequence> q = s.fresh();
  s.charge(*q, "add");
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (s.groups[g].options.sliding_window)
      q->groups.push_back(make_ring(s.groups[g], q->sink));
    else
      q->groups.push_back(s.dense(g, *q));
  }
  return s.keep(std::move(q));
}

sequence_id kv_cache_pool::fork(sequence_id parent) {
  state& s = *state_;
  pool_sequence& from = s.find("fork", parent);
  std::unique_ptr<pool_sequence> q = s.fresh();
  s.charge(*q, "fork of sequence " + str(parent));
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (s.groups[g].options.sliding_window) {
      // A ring is at most W rows: copied through the snapshot codec, which knows every store
      // kind's state.
      std::stringstream rows;
      ringkv::save(*from.groups[g], rows);
      q->groups.push_back(ringkv::load(rows, q->sink));
    } else {
      auto d = s.dense(g, *q);
      d->share(static_cast<pooled_dense_store&>(*from.groups[g]));
      q->groups.push_back(std::move(d));
    }
  }
  return s.keep(std::move(q));
}

void kv_cache_pool::remove(sequence_id id) {
  state_->find("remove", id);
  state_->live.erase(id);
}

kv_cache_store& kv_cache_pool::store(sequence_id id, std::size_t group) {
  pool_sequence& q = state_->find("store", id);
  if (group >= q.groups.size())
    throw std::out_of_range("ringkv::kv_cache_pool::store: group " + str(group) + " >= groups " +
                            str(q.groups.size()));
  return *q.groups[group];
}

const kv_cache_store& kv_cache_pool::store(sequence_id id, std::size_t group) const {
  return const_cast<kv_cache_pool*>(this)->store(id, group);
}

trace::sink& kv_cache_pool::sink(sequence_id id) { return state_->find("sink", id).sink; }

bool kv_cache_pool::contains(sequence_id id) const noexcept { return state_->live.contains(id); }

std::vector<sequence_id> kv_cache_pool::sequences() const {
  std::vector<sequence_id> ids;
  for (const auto& [id, q] : state_->live) ids.push_back(id);
  return ids;
}

std::span<const kv_pool_group> kv_cache_pool::groups() const noexcept { return state_->groups; }

pool_memory kv_cache_pool::memory() const {
  const ledger& b = *state_->book;
  const std::lock_guard hold(b.arena.lock());
  return {b.budget, b.in_use(), b.arena.shared() * b.arena.unit_bytes(), b.free(),
          state_->live.size()};
}

sequence_memory kv_cache_pool::memory(sequence_id id) const {
  const state& s = *state_;
  const pool_sequence& q = s.find("memory", id);
  sequence_memory m{q.ring_bytes, 0, 0};
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (s.groups[g].options.sliding_window) continue;
    const auto [held, shared] = static_cast<const pooled_dense_store&>(*q.groups[g]).blocks_held();
    m.block_bytes += (held[0] + held[1]) * s.book->arena.unit_bytes();
    m.shared_bytes += shared * s.book->arena.unit_bytes();
  }
  return m;
}

void kv_cache_pool::save(sequence_id id, std::ostream& out) const {
  const state& s = *state_;
  const pool_sequence& q = s.find("save", id);
  out.write(sequence_magic, sizeof sequence_magic);
  const std::uint32_t groups = std::uint32_t(s.groups.size());
  out.write(reinterpret_cast<const char*>(&groups), sizeof groups);
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const kv_cache_store& from = *q.groups[g];
    if (s.groups[g].options.sliding_window) {
      ringkv::save(from, out);
      continue;
    }
    // A dense group's snapshot holds its positions only: a default store as long as its longest
    // layer (its own capacity is address space, not rows).
    kv_cache_config c = from.config();
    c.capacity = 1;
    for (std::size_t l = 0; l < c.layers; ++l) c.capacity = std::max(c.capacity, from.length(l));
    default_kv_cache_store copy(c);
    std::vector<float> k(c.row_floats() * c.capacity), v(k.size());
    for (std::size_t l = 0; l < c.layers; ++l) {
      const std::size_t n = from.length(l);
      from.read_keys(l, 0, n, std::span(k).first(c.row_floats() * n));
      from.read_values(l, 0, n, std::span(v).first(c.row_floats() * n));
      append_positions(copy, l, n, k, v);
    }
    ringkv::save(copy, out);
  }
}

sequence_id kv_cache_pool::load(std::istream& in) {
  state& s = *state_;
  char magic[sizeof sequence_magic] = {};
  std::uint32_t groups = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(&groups), sizeof groups);
  if (!in || !std::equal(magic, magic + sizeof magic, sequence_magic))
    throw snapshot_error("ringkv::kv_cache_pool::load: not a pool sequence (magic RKVSEQ01)", 0);
  if (groups != s.groups.size())
    throw snapshot_error("ringkv::kv_cache_pool::load: " + str(groups) + " groups, the pool has " +
                             str(s.groups.size()),
                         8);
  // Every group read and checked, and the budget asked for its rings and blocks, before the
  // sequence takes anything of the pool.
  std::unique_ptr<pool_sequence> q = s.fresh();
  std::vector<std::unique_ptr<kv_cache_store>> got;
  std::size_t units = 0;
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const kv_pool_group& want = s.groups[g];
    got.push_back(ringkv::load(in, q->sink, s.book->budget));
    const kv_cache_store& r = *got.back();
    const auto refuse = [&](const std::string& what) {
      throw snapshot_error("ringkv::kv_cache_pool::load: group " + str(g) + ": " + what, 0);
    };
    if (!same_shape(r.config(), want.config)) refuse("layers, kv heads, head_dim or types differ");
    if (want.options.sliding_window) {
      const store_options o = r.options();
      const std::optional<windowed_kv> rows = r.stored_window(kv_side::keys, 0, 0, 0);
      // An empty element window names no element type (same_shape compared the config's).
      const bool same_rows = rows && rows->compressed() == want.codes.has_value() &&
                             (!want.codes || rows->encoding() == rows_of(want));
      if (r.config().capacity != want.config.capacity || !o.sliding_window ||
          o.keep != want.options.keep || o.slack != want.options.slack || !same_rows)
        refuse("a ring of another capacity, keep, slack or row format");
      continue;
    }
    for (std::size_t l = 0; l < r.config().layers; ++l) {
      if (r.length(l) > want.config.capacity)
        refuse(str(r.length(l)) + " positions past the group's capacity " +
               str(want.config.capacity));
      units += 2 * want.config.kv_heads * ((r.length(l) + s.block[g] - 1) / s.block[g]);
    }
  }
  s.charge(*q, "load", units);
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (s.groups[g].options.sliding_window) {
      q->groups.push_back(std::move(got[g]));
      continue;
    }
    auto d = s.dense(g, *q);
    const kv_cache_store& r = *got[g];
    const kv_cache_config c = r.config();
    std::vector<float> k(c.row_floats() * c.capacity), v(k.size());
    for (std::size_t l = 0; l < c.layers; ++l) {
      const std::size_t n = r.length(l);
      r.read_keys(l, 0, n, std::span(k).first(c.row_floats() * n));
      r.read_values(l, 0, n, std::span(v).first(c.row_floats() * n));
      append_positions(*d, l, n, k, v);
    }
    q->groups.push_back(std::move(d));
  }
  return s.keep(std::move(q));
}

}  // namespace ringkv
