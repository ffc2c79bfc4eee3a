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

/// Options of decode() and layer_decoder: the layer's options (layer_attention).
using decode_options = layer_options;

/// One layer's decode as a call a token: what a model loop wants, where layer l's q, k and v
/// come from layer l - 1's output of the same token, so a pull stream per layer does not fit.
/// layer_attention under the name the decode stream's users know: each step appends the
/// token's k and v and attends its q over its window (the decode stream is built on it, so the
/// bits are the stream's); refusals name ringkv::decode (and ringkv::layer_decoder::step for
/// `out`). The store is referenced and must outlive it.
class layer_decoder : public layer_attention {
 public:
  /// Checks store, layer and options as decode() does (same exceptions); allocates the arena's
  /// small slab (traced); O(1).
  layer_decoder(kv_cache_store& store, std::size_t layer, decode_options options = {},
                trace::sink& sink = trace::null_sink())
      : layer_attention(store, layer, options, sink, "ringkv::decode",
                        "ringkv::layer_decoder::step") {}
  /// Moves the references and the arena (a model keeps one decoder a layer in a vector); O(1).
  layer_decoder(layer_decoder&&) = default;
};

namespace detail {
template <class R>
R& unwrap(R& r) noexcept {
  return r;
}
template <class R>
R& unwrap(std::reference_wrapper<R> r) noexcept {
  return r.get();
}

template <class Source>
generator<std::span<const float>> decode_stream(layer_decoder decoder, Source tokens,
                                                trace::sink& sink) {
  storage row;  // [q_heads * head_dim] the output row, sized by the first token
  std::span<float> out;
  for (auto&& item : unwrap(tokens)) {
    const token_qkv& t = item;
    if (out.size() != t.q.size()) {
      decoder.check(t);  // before sizing the row by a token the step would refuse
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
/// is attended straight from its codes by compressed_kv_attention (no copy; split across .pool
/// too), unless .gather asks for its dequantized windows gathered. An lvalue range
/// is referenced, an rvalue one moved into the stream. Options are checked here, at the call
/// (also that the store's key_type and value_type agree: one dtype for both), where the
/// stream's layer_decoder is made.
template <class Tokens>
generator<std::span<const float>> decode(kv_cache_store& store, std::size_t layer, Tokens&& tokens,
                                         decode_options options = {},
                                         trace::sink& sink = trace::null_sink()) {
  layer_decoder decoder(store, layer, options, sink);
  if constexpr (std::is_lvalue_reference_v<Tokens>)
    return detail::decode_stream(std::move(decoder), std::ref(tokens), sink);
  else
    return detail::decode_stream(std::move(decoder), std::forward<Tokens>(tokens), sink);
}

}  // namespace ringkv
