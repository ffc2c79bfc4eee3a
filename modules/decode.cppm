// ringkv.decode — the user-facing stream: one output row per token, appended to and attended
// over a (ring) store through its zero-copy windows, as a coroutine generator.
module;
#include <coroutine>
#include <cstddef>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>
export module ringkv.decode;
export import ringkv.generator;
export import ringkv.store;
export import ringkv.attention;

export namespace ringkv {

/// One token's projections for one layer: q [q_heads * head_dim], k and v [kv_heads * head_dim].
struct token_qkv {
  std::span<const float> q, k, v;
};

struct decode_options {
  std::size_t window = 0;             // keys a query sees, counting itself; 0: capacity - slack
  float scale = 0.0f;                 // 0: 1 / sqrt(head_dim)
  std::span<const float> sinks = {};  // learned sink logit per query head, or empty
  bool gather = false;                // copy each window into one run first (traced), to compare
  thread_pool* pool = nullptr;        // split each step across it (same bits); null: this thread
};

namespace detail {
/// Checks store, layer and options before the stream starts; returns the effective window.
std::size_t check_decode(const kv_cache_store& store, std::size_t layer, const decode_options& o);
/// Checks one token against the store's geometry before anything is appended.
void check_token(const kv_cache_store& store, const token_qkv& t, const decode_options& o);
/// Appends one token and attends it (append_and_attend; `codes`: codes_of(store, o.gather));
/// `out` is the output row. Allocates only when the arena must first hold the window's copies
/// (hold_window_copies).
void decode_one(kv_cache_store& store, compressed_kv_cache_store* codes, std::size_t layer,
                const token_qkv& t, const decode_options& o, std::size_t window,
                const windowed_attention& attention, trace::sink& sink, scope& arena,
                std::span<float> out);

template <class R>
R& unwrap(R& r) noexcept {
  return r;
}
template <class R>
R& unwrap(std::reference_wrapper<R> r) noexcept {
  return r.get();
}

}  // namespace detail

/// One layer's decode as a call a token: what a model loop wants, where layer l's q, k and v
/// come from layer l - 1's output of the same token, so a pull stream per layer does not fit.
/// Each step appends the token's k and v and attends its q over its window (the decode stream
/// is built on it, so the bits are the stream's). Holds the attention object, the arena for
/// stores whose windows copy and the compressed store's codes pointer; the store is referenced
/// and must outlive it.
class layer_decoder {
 public:
  /// Checks store, layer and options as decode() does (same exceptions); allocates the arena's
  /// small slab (traced); O(1).
  layer_decoder(kv_cache_store& store, std::size_t layer, decode_options options = {},
                trace::sink& sink = trace::null_sink());
  /// Moves the references and the arena (a model keeps one decoder a layer in a vector); O(1).
  layer_decoder(layer_decoder&&) = default;

  /// Appends t.k, t.v at the next position of the layer (overwriting the oldest of a full ring)
  /// and writes the attention of t.q over its window to `out` ([q_heads * head_dim], not
  /// overlapping t.q). Checks t and out first (std::invalid_argument naming them; then the store
  /// and `out` are untouched). O(window * q_heads * head_dim); no heap allocation once warm
  /// (the first step sizes a pool's scratch; a store whose windows copy, or .gather, sizes the
  /// arena for the full window then).
  void step(const token_qkv& t, std::span<float> out);

  /// The store it appends to; O(1).
  kv_cache_store& store() const noexcept { return *store_; }
  /// The layer of the store it appends to; O(1).
  std::size_t layer() const noexcept { return layer_; }
  /// The effective window (options.window, or capacity - slack); O(1).
  std::size_t window() const noexcept { return window_; }

 private:
  kv_cache_store* store_;
  std::size_t layer_;
  decode_options options_;
  std::size_t window_;
  trace::sink* sink_;
  windowed_attention attention_;
  compressed_kv_cache_store* codes_;  // found once, not per token
  scope arena_;                       // grows only for stores whose windows copy (or .gather)
  std::size_t reserved_q_ = 0;        // query width the pool's scratch was sized for
};

namespace detail {
template <class Source>
generator<std::span<const float>> decode_stream(kv_cache_store& store, std::size_t layer,
                                                Source tokens, decode_options opts,
                                                trace::sink& sink) {
  layer_decoder decoder(store, layer, opts, sink);
  storage row;  // [q_heads * head_dim] the output row, sized by the first token
  std::span<float> out;
  for (auto&& item : unwrap(tokens)) {
    const token_qkv& t = item;
    if (out.size() != t.q.size()) {
      check_token(store, t, opts);  // before sizing the row by a token the step would refuse
      row = storage(t.q.size_bytes(), "decode-row", sink);
      out = {reinterpret_cast<float*>(row.data()), t.q.size()};
    }
    decoder.step(t, out);
    co_yield std::span<const float>(out);
  }
}
}  // namespace detail

/// Streams `tokens` (any input range of token_qkv) through `layer` of `store`: each pulled row
/// appends k, v at the next position (overwriting the oldest of a full ring), attends q over its
/// window and yields the output row, valid until the next increment. O(window * heads * head_dim)
/// per token; no heap allocation per token after the first (a store whose windows are copies, or
/// .gather, sizes the stream's arena for the full window at the first token). A compressed store
/// is attended straight from its codes by compressed_kv_attention (no copy; .pool does not apply
/// there), unless .gather asks for its dequantized windows gathered. An lvalue range
/// is referenced, an rvalue one moved into the stream. Options are checked here, at the call
/// (also that the store's key_type and value_type agree: f32, f16 or bf16, one dtype for both).
template <class Tokens>
generator<std::span<const float>> decode(kv_cache_store& store, std::size_t layer, Tokens&& tokens,
                                         decode_options options = {},
                                         trace::sink& sink = trace::null_sink()) {
  detail::check_decode(store, layer, options);
  if constexpr (std::is_lvalue_reference_v<Tokens>)
    return detail::decode_stream(store, layer, std::ref(tokens), options, sink);
  else
    return detail::decode_stream(store, layer, std::forward<Tokens>(tokens), options, sink);
}

}  // namespace ringkv
