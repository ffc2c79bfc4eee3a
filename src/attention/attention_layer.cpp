// layer_attention: one layer's prefill and decode steps over one store with one set of options
// (the decode stream, layer_decoder and windowed_attention::prefill are forms of it).
module;
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
module ringkv.attention;

namespace ringkv {

layer_attention::layer_attention(kv_cache_store& store, std::size_t layer, layer_options options,
                                 trace::sink& sink)
    : layer_attention(store, layer, options, sink, "ringkv::layer_attention",
                      "ringkv::layer_attention::step") {}

layer_attention::layer_attention(kv_cache_store& store, std::size_t layer, layer_options options,
                                 trace::sink& sink, std::string_view checks, std::string_view step)
    : checks_(checks), step_(step), store_(&store), layer_(layer), options_(options),
      window_(detail::check_store(store, layer, options.window, checks)), sink_(&sink),
      attention_(attention_options{&sink, options.pool}), arena_(64, sink) {
  // Every check a step makes of the options, here: a step refusing after its token was appended
  // would leave the store one token longer with no row out.
  kernels::check_scale(checks_, options.scale, store.config().head_dim);
}

void layer_attention::check(const token_qkv& t) const {
  const kv_cache_config& c = store_->config();
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(std::string(checks_) + ": " + what);
  };
  const std::size_t kv = c.kv_heads * c.head_dim;
  if (t.k.size() != kv || t.v.size() != kv)
    refuse("token k/v have " + std::to_string(t.k.size()) + "/" + std::to_string(t.v.size()) +
           " floats, expected kv_heads * head_dim = " + std::to_string(kv));
  const std::size_t q = t.q.size();
  if (q == 0 || q % kv != 0)
    refuse("token q has " + std::to_string(q) +
           " floats, expected a non-zero multiple of kv_heads * head_dim = " + std::to_string(kv));
  // require_finite adds the "ringkv::" of the name itself.
  const std::string_view name = checks_.substr(std::string_view("ringkv::").size());
  require_finite(name, "token q", t.q);
  require_finite(name, "token k", t.k);
  require_finite(name, "token v", t.v);
  kernels::check_sinks(checks_, options_.sinks, q / c.head_dim);
}

void layer_attention::step(const token_qkv& t, std::span<float> out) {
  check(t);
  if (out.size() != t.q.size())
    throw std::invalid_argument(std::string(step_) + ": out has " + std::to_string(out.size()) +
                                " floats, token q has " + std::to_string(t.q.size()));
  if (reserved_q_ != t.q.size()) {
    const std::size_t dim = store_->config().head_dim;
    attention_.reserve(t.q.size() / dim, dim, window_);  // with a pool: its scratch, once
    reserved_q_ = t.q.size();
  }
  detail::append_and_attend(*store_, layer_, window_,
                            {t.q, t.k, t.v, out, options_.scale, options_.sinks, options_.gather},
                            attention_, options_.arena ? options_.arena : &arena_);
}

void layer_attention::prefill(std::span<const float> queries, std::span<const float> keys,
                              std::span<const float> values, std::span<float> out) {
  layer_options o = options_;
  o.window = window_;
  o.arena = options_.arena ? options_.arena : &arena_;
  if (o.arena->live() > 0) o.arena->reset();  // the last call's rounded rows or copies
  attention_.prefill(*store_, layer_, queries, keys, values, out, o);
}

}  // namespace ringkv
