module;
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
module ringkv.decode;

namespace ringkv::detail {
namespace {
[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument("ringkv::decode: " + what);
}
}  // namespace

std::size_t check_decode(const kv_cache_store& store, std::size_t layer, const decode_options& o) {
  const std::size_t window = check_store(store, layer, o.window, "ringkv::decode");
  // Every check decode_step makes of the options, here: a step refusing after its token was
  // appended would leave the store one token longer with no row out.
  kernels::check_scale("ringkv::decode", o.scale, store.config().head_dim);
  return window;
}

void check_token(const kv_cache_store& store, const token_qkv& t, const decode_options& o) {
  const kv_cache_config& c = store.config();
  const std::size_t kv = c.kv_heads * c.head_dim;
  if (t.k.size() != kv || t.v.size() != kv)
    refuse("token k/v have " + std::to_string(t.k.size()) + "/" + std::to_string(t.v.size()) +
           " floats, expected kv_heads * head_dim = " + std::to_string(kv));
  const std::size_t q = t.q.size();
  if (q == 0 || q % kv != 0)
    refuse("token q has " + std::to_string(q) +
           " floats, expected a non-zero multiple of kv_heads * head_dim = " + std::to_string(kv));
  // Before anything is appended, so a refused token leaves the store as it was.
  require_finite("decode", "token q", t.q);
  require_finite("decode", "token k", t.k);
  require_finite("decode", "token v", t.v);
  kernels::check_sinks("ringkv::decode", o.sinks, q / c.head_dim);
}

void decode_one(kv_cache_store& store, compressed_kv_cache_store* codes, std::size_t layer,
                const token_qkv& t, const decode_options& o, std::size_t window,
                const windowed_attention& attention, trace::sink& sink, scope& arena,
                std::span<float> out) {
  append_and_attend(store, codes, layer, window, {t.q, t.k, t.v, out, o.scale, o.sinks, o.gather},
                    attention, sink, &arena);
}

}  // namespace ringkv::detail

namespace ringkv {

layer_decoder::layer_decoder(kv_cache_store& store, std::size_t layer, decode_options options,
                             trace::sink& sink)
    : store_(&store), layer_(layer), options_(options),
      window_(detail::check_decode(store, layer, options)), sink_(&sink),
      attention_(attention_options{&sink, options.pool}),
      codes_(detail::codes_of(store, options.gather)), arena_(64, sink) {}

void layer_decoder::step(const token_qkv& t, std::span<float> out) {
  detail::check_token(*store_, t, options_);
  if (out.size() != t.q.size())
    throw std::invalid_argument("ringkv::layer_decoder::step: out has " +
                                std::to_string(out.size()) + " floats, token q has " +
                                std::to_string(t.q.size()));
  if (reserved_q_ != t.q.size()) {
    const std::size_t dim = store_->config().head_dim;
    attention_.reserve(t.q.size() / dim, dim, window_);  // with a pool: its scratch, once
    reserved_q_ = t.q.size();
  }
  detail::decode_one(*store_, codes_, layer_, t, options_, window_, attention_, *sink_, arena_,
                     out);
}

}  // namespace ringkv
