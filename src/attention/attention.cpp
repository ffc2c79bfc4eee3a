// ringkv.attention: checks, the optional kernel_run trace, and the gather path around the kernels.
module;
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
module ringkv.attention;

namespace ringkv {
namespace {

/// Grows `scratch` to hold `floats` floats (one traced allocation) unless it does already.
void fit(storage& scratch, std::size_t floats, trace::sink& sink) {
  if (scratch.bytes() < floats * sizeof(float))
    scratch = storage(floats * sizeof(float), "split-decode-scratch", sink);
}

}  // namespace

windowed_attention::windowed_attention() noexcept : windowed_attention(attention_options{}) {}

windowed_attention::windowed_attention(attention_options options) noexcept
    : sink_(options.sink ? options.sink : &trace::null_sink()), pool_(options.pool) {}

windowed_attention::windowed_attention(const windowed_attention& other) noexcept
    : sink_(other.sink_), pool_(other.pool_) {}

// Copies two pointers, so assigning an object to itself changes nothing.
// NOLINTNEXTLINE(bugprone-unhandled-self-assignment)
windowed_attention& windowed_attention::operator=(const windowed_attention& other) noexcept {
  sink_ = other.sink_;
  pool_ = other.pool_;  // the scratch stays: it is sized for windows, not for a pool
  return *this;
}

void windowed_attention::reserve(std::size_t q_heads, std::size_t head_dim, std::size_t positions) {
  if (pool_ == nullptr) return;
  fit(scratch_, kernels::split_scratch_floats(q_heads, head_dim, positions), *sink_);
}

void windowed_attention::attend(std::span<const float> query, const windowed_kv& keys,
                                const windowed_kv& values, std::span<float> out, float scale,
                                std::span<const float> sinks) const {
  if (pool_ == nullptr || pool_->size() <= 1 ||
      scratch_busy_.test_and_set(std::memory_order_acquire)) {
    kernels::decode(query, keys, values, out, scale, sinks);
    return;
  }
  struct release {
    std::atomic_flag& busy;
    ~release() { busy.clear(std::memory_order_release); }
  } const held{scratch_busy_};
  const std::size_t dim = keys.head_dim();
  fit(scratch_, kernels::split_scratch_floats(query.size() / dim, dim, keys.length()), *sink_);
  kernels::decode(query, keys, values, out, scale, sinks, *pool_, scratch_.as<float>());
}

void windowed_attention::decode_step(std::span<const float> query, const windowed_kv& keys,
                                     const windowed_kv& values, std::span<float> out, float scale,
                                     std::span<const float> sinks) const {
  if (keys.compressed() || values.compressed()) {
    compressed_kv_attention({sink_, pool_}).decode_step(query, keys, values, out, scale, sinks);
    return;
  }
  kernels::check_decode("ringkv::windowed_attention::decode_step", query, keys, values, out, scale,
                        sinks);
  require_finite("windowed_attention::decode_step", "query", query);
  const std::size_t read = keys.bytes() + values.bytes() + query.size_bytes() + sinks.size_bytes();
  detail::traced(*sink_, "attention.decode_step", read, out.size_bytes(),
                 [&] { attend(query, keys, values, out, scale, sinks); });
}

void windowed_attention::decode_step_gathered(std::span<const float> query, const windowed_kv& keys,
                                              const windowed_kv& values, std::span<float> out,
                                              scope& arena, float scale,
                                              std::span<const float> sinks) const {
  constexpr std::string_view who = "ringkv::windowed_attention::decode_step_gathered";
  if (keys.compressed() || values.compressed()) {
    detail::check_codes(who, query, keys, values, out, scale, sinks);
  } else {
    kernels::check_decode(who, query, keys, values, out, scale, sinks);
    require_finite("windowed_attention::decode_step_gathered", "query", query);
  }
  const std::size_t copied = keys.bytes() + values.bytes();
  // The copy is read once to gather and once by the kernel.
  detail::traced(*sink_, "attention.decode_step_gathered",
                 2 * copied + query.size_bytes() + sinks.size_bytes(), copied + out.size_bytes(),
                 [&] {
                   const windowed_kv k = keys.gathered(arena, *sink_, "keys");
                   const windowed_kv v = values.gathered(arena, *sink_, "values");
                   attend(query, k, v, out, scale, sinks);
                 });
}

}  // namespace ringkv

namespace ringkv::detail {

std::size_t check_store(const kv_cache_store& store, std::size_t layer, std::size_t requested,
                        std::string_view caller) {
  const kv_cache_config c = store.config();
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(std::string(caller) + ": " + what);
  };
  if (layer >= c.layers)
    throw std::out_of_range(std::string(caller) + ": layer " + std::to_string(layer) +
                            " >= layers " + std::to_string(c.layers));
  if (c.head_dim > kernels::max_head_dim)
    refuse("head_dim " + std::to_string(c.head_dim) + " exceeds max_head_dim " +
           std::to_string(kernels::max_head_dim));
  // The kernels take one dtype for K and V; refused here, not after a token was appended.
  if (c.key_type != c.value_type)
    refuse("the store's keys are " + std::string(name_of(c.key_type)) + " but values are " +
           std::string(name_of(c.value_type)) + "; attention needs one dtype for both");
  const std::size_t limit = c.capacity - store.options().slack;
  const std::size_t window = requested == 0 ? limit : requested;
  if (window > limit)
    refuse("window " + std::to_string(window) + " > capacity - slack = " + std::to_string(limit) +
           " (the store cannot hold it)");
  if (store.options().keep >= window && store.options().keep > 0)
    refuse("window " + std::to_string(window) + " must exceed keep " +
           std::to_string(store.options().keep));
  return window;
}

std::size_t window_from(std::size_t p, std::size_t window, std::size_t keep) noexcept {
  return p + 1 > window ? p + 1 - (window - keep) : 0;
}

std::optional<std::array<windowed_kv, 2>> stored_windows(const kv_cache_store& store,
                                                         std::size_t layer, std::size_t from,
                                                         std::size_t to) {
  std::optional<windowed_kv> keys = store.stored_window(kv_side::keys, layer, from, to);
  if (!keys ||
      (keys->compressed() && store.config().head_dim > compressed_kv_attention::max_head_dim))
    return std::nullopt;
  std::optional<windowed_kv> values = store.stored_window(kv_side::values, layer, from, to);
  if (!values) return std::nullopt;
  return std::array<windowed_kv, 2>{*keys, *values};
}

std::size_t window_copy_bytes(const kv_cache_config& c, std::size_t window) noexcept {
  // Per side: up to two runs of f32 rows, each padded to the alignment; gathering copies the
  // side once more (one run, rows of at most 4 bytes an element).
  const std::size_t side = c.kv_heads * window * c.head_dim * sizeof(float);
  return 2 * (2 * side + 3 * storage::alignment);
}

void append_and_attend(kv_cache_store& store, std::size_t layer, std::size_t window,
                       const token_step& t, const windowed_attention& attention, scope* copies) {
  const std::size_t p = store.append(layer, t.k, t.v);
  const std::size_t from = window_from(p, window, store.options().keep);
  if (!t.gather) {
    if (const auto own = stored_windows(store, layer, from, p + 1)) {
      attention.decode_step(t.q, (*own)[0], (*own)[1], t.out, t.scale, t.sinks);
      return;
    }
  }
  scope& arena = *copies;
  if (arena.live() > 0) arena.reset();
  const windowed_kv keys = store.key_window(layer, from, p + 1, arena);
  const windowed_kv values = store.value_window(layer, from, p + 1, arena);
  if (t.gather)
    attention.decode_step_gathered(t.q, keys, values, t.out, arena, t.scale, t.sinks);
  else
    attention.decode_step(t.q, keys, values, t.out, t.scale, t.sinks);
  // Sized at once for the copies of the full window, not grown token after token as it fills.
  const std::size_t full = window_copy_bytes(store.config(), window);
  if (arena.capacity() < full) arena.reset(full);
}

}  // namespace ringkv::detail
