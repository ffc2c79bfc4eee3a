// slotted_kv_cache_store: the position bookkeeping every slot-based store shares (dense or a
// ring with pinned sinks and slack): lengths, the slot rule, append's refusals, truncate, and
// the slot runs of a window.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
module ringkv.store;

namespace ringkv {
namespace {
std::string str(std::size_t n) { return std::to_string(n); }

void check_options(const char* name, const kv_cache_config& c, const store_options& o) {
  const std::string who = std::string("ringkv::") + name + ": ";
  if (!o.sliding_window) {
    // A dense store never overwrites, so there is nothing to pin and nothing to reserve.
    if (o.keep != 0)
      throw std::invalid_argument(who + "keep " + str(o.keep) + " needs sliding_window = true");
    if (o.slack != 0)
      throw std::invalid_argument(who + "slack " + str(o.slack) + " needs sliding_window = true");
  } else if (o.keep + o.slack >= c.capacity) {
    throw std::invalid_argument(who + "keep " + str(o.keep) + " + slack " + str(o.slack) +
                                " must be < capacity " + str(c.capacity) +
                                " (the attention window needs at least one rolling slot)");
  }
}

// Elements per side per layer, refusing a size whose f32 bytes do not fit in size_t.
std::size_t checked_side_elements(const char* name, const kv_cache_config& c) {
  std::size_t n = 0;
  if (__builtin_mul_overflow(c.kv_heads, c.capacity, &n) ||
      __builtin_mul_overflow(n, c.head_dim, &n) || __builtin_mul_overflow(n, std::size_t{4}, &n))
    throw std::invalid_argument(std::string("ringkv::") + name +
                                ": kv_heads * capacity * head_dim overflows size_t");
  return n / 4;
}

kv_cache_config validated(kv_cache_config c) {
  c.validate();
  return c;
}
}  // namespace

slotted_kv_cache_store::slotted_kv_cache_store(kv_cache_config config, store_options options,
                                               const char* name, trace::sink& sink)
    : kv_cache_store(sink), config_(validated(config)), options_(options), name_(name),
      ring_slots_(0), side_elements_(0) {
  check_options(name_, config_, options_);
  ring_slots_ = config_.capacity - options_.keep;
  side_elements_ = checked_side_elements(name_, config_);
  layers_.resize(config_.layers);
}

void slotted_kv_cache_store::check_layer_of(const char* member, std::size_t layer) const {
  if (layer >= config_.layers) check_layer((std::string(name_) + "::" + member).c_str(), layer);
}

std::size_t slotted_kv_cache_store::slot_of(std::size_t position) const noexcept {
  if (!options_.sliding_window || position < options_.keep) return position;
  return options_.keep + (position - options_.keep) % ring_slots_;
}

std::size_t slotted_kv_cache_store::length(std::size_t layer) const {
  check_layer_of("length", layer);
  return layers_[layer].length;
}

std::size_t slotted_kv_cache_store::window_start(std::size_t layer) const {
  check_layer_of("window_start", layer);
  return layers_[layer].window_start;
}

std::size_t slotted_kv_cache_store::prepare_append(std::size_t layer, std::span<const float> key,
                                                   std::span<const float> value) const {
  check_layer_of("append", layer);
  const std::size_t row = config_.row_floats();
  for (const auto& [what, span] : {std::pair{"key", key}, std::pair{"value", value}})
    if (span.size() != row)
      throw std::invalid_argument(std::string("ringkv::") + name_ + "::append: " + what + " has " +
                                  str(span.size()) +
                                  " floats, expected kv_heads * head_dim = " + str(row));
  // README "NaN and Inf": refused, not stored (nor rounded to ±Inf by an f16/bf16 store).
  if (!all_finite(key) || !all_finite(value) || !all_storable(key, config_.key_type) ||
      !all_storable(value, config_.value_type)) {
    const std::string who = std::string(name_) + "::append";  // only now: append allocates nothing
    require_finite(who, "key", key);
    require_finite(who, "value", value);
    require_storable(who, "key", key, config_.key_type);
    require_storable(who, "value", value, config_.value_type);
  }
  const std::size_t p = layers_[layer].length;
  if (!options_.sliding_window && p == config_.capacity)
    throw cache_full(std::string("ringkv::") + name_ + "::append: layer " + str(layer) +
                     " is full (length " + str(p) + " = capacity " + str(config_.capacity) +
                     "); a ring (store_options::sliding_window) overwrites instead");
  return slot_of(p);
}

std::size_t slotted_kv_cache_store::commit_append(std::size_t layer) noexcept {
  counters& s = layers_[layer];
  const std::size_t p = s.length;
  if (options_.sliding_window && p >= options_.keep) {
    // The rolling part holds at most ring_slots_ positions: a full one just lost its oldest.
    const std::size_t rolling_start = std::max(s.window_start, options_.keep);
    if (p - rolling_start == ring_slots_) s.window_start = rolling_start + 1;
  }
  s.length = p + 1;
  return p;
}

void slotted_kv_cache_store::truncate(std::size_t layer, std::size_t new_length) {
  check_layer_of("truncate", layer);
  counters& s = layers_[layer];
  auto who = [&] { return std::string("ringkv::") + name_ + "::truncate: new_length "; };
  if (new_length > s.length)
    throw std::out_of_range(who() + str(new_length) + " > length " + str(s.length) + " of layer " +
                            str(layer) + " (truncate only rolls back)");
  const std::size_t keep = options_.keep;
  // The token appended next sits at new_length; its rolling keys before it must still be held.
  const std::size_t need_from = std::min(std::max(keep, query_window(new_length).from), new_length);
  if (!holds(layer, need_from, new_length))
    throw std::out_of_range(who() + str(new_length) + " of layer " + str(layer) +
                            " needs positions [" + str(need_from) + ", " + str(new_length) +
                            ") for the next token's window (W " + str(attention_window()) +
                            ", keep " + str(keep) + ") but window_start is " + str(s.window_start) +
                            " (length " + str(s.length) + ", slack " + str(options_.slack) + ")");
  s.length = new_length;
  // Positions >= new_length are forgotten; overwritten ones before window_start stay lost.
  s.window_start = new_length <= keep ? 0 : std::min(s.window_start, new_length);
}

void slotted_kv_cache_store::clear() noexcept {
  for (counters& s : layers_) s = counters{};
}

void slotted_kv_cache_store::clear(std::size_t layer) {
  check_layer_of("clear", layer);
  layers_[layer] = counters{};
}

void slotted_kv_cache_store::add_slots(slot_runs& out, position_range r) const noexcept {
  auto push = [&](std::size_t first_position, std::size_t slot, std::size_t count) {
    if (out.count > 0) {
      slot_run& last = out.runs[out.count - 1];
      if (last.first_position + last.count == first_position && last.slot + last.count == slot) {
        last.count += count;
        return;
      }
    }
    out.runs[out.count++] = slot_run{first_position, slot, count};
  };
  const std::size_t pinned_end = std::min(r.to, options_.keep);
  std::size_t p = r.from;
  if (p < pinned_end) {
    push(p, p, pinned_end - p);
    p = pinned_end;
  }
  while (p < r.to) {  // at most twice for a held range: up to the ring's end, then from its start
    const std::size_t slot = slot_of(p);
    const std::size_t count = std::min(r.to - p, config_.capacity - slot);
    push(p, slot, count);
    p += count;
  }
}

slotted_kv_cache_store::slot_runs slotted_kv_cache_store::window_slots(const char* who,
                                                                       std::size_t layer,
                                                                       std::size_t from,
                                                                       std::size_t to) const {
  check_range(who, layer, from, to);
  slot_runs out;
  for (const position_range& r : window_positions(from, to))
    if (!r.empty()) add_slots(out, r);
  return out;
}

slotted_kv_cache_store::slot_runs slotted_kv_cache_store::read_slots(const char* who,
                                                                     std::size_t layer,
                                                                     std::size_t from,
                                                                     std::size_t to,
                                                                     std::span<float> out) const {
  check_range(who, layer, from, to);
  const std::size_t expected = config_.row_floats() * (to - from);
  if (out.size() != expected)
    throw std::invalid_argument(
        std::string("ringkv::") + who + ": out has " + str(out.size()) +
        " floats, expected kv_heads * (to - from) * head_dim = " + str(expected));
  slot_runs runs;
  add_slots(runs, {from, to});
  return runs;
}

memory_report slotted_kv_cache_store::report(std::size_t key_bytes, std::size_t value_bytes) const {
  memory_report r;
  std::size_t rows = 0;
  for (std::size_t l = 0; l < config_.layers; ++l) rows += held(l);
  const std::size_t logical = rows * config_.row_floats() * sizeof(float);
  r.keys = {key_bytes, logical};
  r.values = {value_bytes, logical};
  r.physical_bytes = key_bytes + value_bytes;
  r.logical_bytes = 2 * logical;
  const double full_f32 = 2.0 * double(config_.layers) * double(side_elements_) * sizeof(float);
  r.compression_ratio = full_f32 / double(r.physical_bytes);
  return r;
}

void slotted_kv_cache_store::copy_positions(const slotted_kv_cache_store& from) {
  const kv_cache_config& a = config_;
  const kv_cache_config& b = from.config_;
  if (a.layers != b.layers || a.kv_heads != b.kv_heads || a.head_dim != b.head_dim ||
      a.capacity != b.capacity || options_.sliding_window != from.options_.sliding_window ||
      options_.keep != from.options_.keep || options_.slack != from.options_.slack)
    throw std::invalid_argument(std::string(name_) +
                                "::copy_positions: the stores' configs or options differ");
  layers_ = from.layers_;
}

}  // namespace ringkv
