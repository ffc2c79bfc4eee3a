#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace gguf_run {
namespace {

[[noreturn]] void bad_tensor(const std::string& name, const std::string& what) {
  throw gguf::format_error("tensor " + name, 0, what);
}

std::string dims_text(const std::vector<std::uint64_t>& d) {
  std::string s = "{";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "}";
}

const gguf::tensor_info& need_tensor(const gguf::file& f, const std::string& name,
                                     std::vector<std::uint64_t> dims) {
  const gguf::tensor_info* t = f.find_tensor(name);
  if (t == nullptr) bad_tensor(name, "required tensor is missing");
  if (t->dims != dims)
    bad_tensor(name, "has dims " + dims_text(t->dims) + ", expected " + dims_text(dims));
  return *t;
}

std::vector<float> vec(const gguf::file& f, const std::string& name, std::size_t n) {
  return gguf::to_floats(need_tensor(f, name, {n}));
}

matrix mat(const gguf::file& f, const std::string& name, std::size_t rows, std::size_t cols) {
  return {rows, cols, gguf::to_floats(need_tensor(f, name, {cols, rows}))};
}

std::size_t positive(const gguf::file& f, const std::string& key, std::uint32_t v) {
  if (v == 0) throw gguf::format_error(key, 0, "must be positive");
  return v;
}

}  // namespace

std::optional<cache_type> parse_cache_type(std::string_view s) {
  for (cache_type t : {cache_type::f32, cache_type::f16, cache_type::bf16, cache_type::fp8,
                       cache_type::turboquant, cache_type::int8})
    if (s == name_of(t)) return t;
  return std::nullopt;
}

const char* name_of(cache_type t) noexcept {
  switch (t) {
    case cache_type::f32:
      return "f32";
    case cache_type::f16:
      return "f16";
    case cache_type::bf16:
      return "bf16";
    case cache_type::fp8:
      return "fp8";
    case cache_type::turboquant:
      return "turboquant";
    case cache_type::int8:
      return "int8";
  }
  return "?";
}

const char* name_of(architecture a) noexcept {
  return a == architecture::granite_swa ? "granite_swa" : "gemma3";
}

model model::from(const gguf::file& f) {
  model m;
  hyper& hp = m.hp;
  const std::string arch = f.get_string("general.architecture");
  if (arch == "granite_swa")
    hp.arch = architecture::granite_swa;
  else if (arch == "gemma3")
    hp.arch = architecture::gemma3;
  else
    throw gguf::format_error("general.architecture", 0,
                             "\"" + arch + "\" is not supported (granite_swa, gemma3)");
  const auto key = [&](const char* k) { return arch + "." + k; };
  hp.embd = positive(f, key("embedding_length"), f.get_u32(key("embedding_length")));
  hp.layers = positive(f, key("block_count"), f.get_u32(key("block_count")));
  hp.ff = positive(f, key("feed_forward_length"), f.get_u32(key("feed_forward_length")));
  hp.heads = positive(f, key("attention.head_count"), f.get_u32(key("attention.head_count")));
  hp.kv_heads = positive(f, key("attention.head_count_kv"),
                         f.get_u32(key("attention.head_count_kv"), std::uint32_t(hp.heads)));
  if (hp.heads % hp.kv_heads != 0)
    throw gguf::format_error(
        key("attention.head_count_kv"), 0,
        std::to_string(hp.kv_heads) + " does not divide head_count " + std::to_string(hp.heads));
  hp.head_dim = positive(f, key("attention.key_length"),
                         f.get_u32(key("attention.key_length"), std::uint32_t(hp.embd / hp.heads)));
  const std::uint32_t value_length =
      f.get_u32(key("attention.value_length"), std::uint32_t(hp.head_dim));
  if (value_length != hp.head_dim && f.find(key("attention.key_length")) == nullptr)
    throw gguf::format_error(key("attention.key_length"), 0,
                             "is missing, and its default embedding_length / head_count = " +
                                 std::to_string(hp.head_dim) + " differs from value_length " +
                                 std::to_string(value_length));
  if (value_length != hp.head_dim)
    throw gguf::format_error(
        key("attention.value_length"), 0,
        std::to_string(value_length) + " must equal key_length " + std::to_string(hp.head_dim));
  if (f.get_u32(key("rope.dimension_count"), std::uint32_t(hp.head_dim)) != hp.head_dim)
    throw gguf::format_error(key("rope.dimension_count"), 0,
                             "partial RoPE is not supported: must equal the head dimension");
  if (hp.head_dim % 2 != 0)
    throw gguf::format_error(key("attention.key_length"), 0, "must be even (RoPE pairs)");
  hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
  hp.rope_base = f.get_f32(key("rope.freq_base"), 10000.0f);
  // What llama.cpp's loader applies for these architectures and this runner does not: refused
  // by name rather than run with logits that silently differ.
  for (const char* k : {"rope.scaling.type", "rope.scaling.factor", "rope.scaling.attn_factor",
                        "rope.scaling.original_context_length", "rope.scaling.yarn_log_multiplier",
                        "attention.rope_pattern", "attention.logit_softcapping",
                        "attention.layer_norm_epsilon", "expert_count", "expert_used_count"})
    if (f.find(key(k)) != nullptr)
      throw gguf::format_error(key(k), 0, "is not supported by this runner");
  for (const char* t : {"rope_freqs.weight", "blk.0.attn_q.bias", "blk.0.attn_k.bias",
                        "blk.0.attn_v.bias", "blk.0.attn_output.bias", "output_norm.bias"})
    if (f.find_tensor(t) != nullptr) bad_tensor(t, "is not supported by this runner");
  hp.sliding.assign(hp.layers, false);
  if (hp.arch == architecture::granite_swa) {
    hp.logit_scale = f.get_f32(key("logit_scale"));
    hp.attention_scale = f.get_f32(key("attention.scale"), 0.0f);
    hp.embedding_scale = f.get_f32(key("embedding_scale"), 0.0f);
    hp.residual_scale = f.get_f32(key("residual_scale"), 0.0f);
    hp.window =
        positive(f, key("attention.sliding_window"), f.get_u32(key("attention.sliding_window")));
    const auto pattern = f.get_uint_array(key("attention.sliding_window_pattern"));
    if (pattern.size() != hp.layers)
      throw gguf::format_error(
          key("attention.sliding_window_pattern"), 0,
          std::to_string(pattern.size()) + " entries for " + std::to_string(hp.layers) + " layers");
    for (std::size_t l = 0; l < hp.layers; ++l) hp.sliding[l] = pattern[l] != 0;
  } else {
    hp.window = f.get_u32(key("attention.sliding_window"), 0);
    if (hp.window > 0) {
      // llama.cpp: every period-th layer (the last of each period) is global; 0: all sliding.
      const std::size_t period = f.get_u32(key("attention.sliding_window_pattern"), 6);
      for (std::size_t l = 0; l < hp.layers; ++l)
        hp.sliding[l] = period == 0 || l % period < period - 1;
      hp.rope_base_swa = f.get_f32(key("rope.freq_base_swa"), 10000.0f);
    }
    hp.softcap = f.get_f32(key("final_logit_softcapping"), 0.0f);
    // gemma_pytorch's query scale (llama.cpp: 1/sqrt(embd / heads) for the 27B's 62 layers).
    hp.attention_scale = hp.layers == 62 ? 1.0f / std::sqrt(float(hp.embd / hp.heads))
                                         : 1.0f / std::sqrt(float(hp.head_dim));
  }
  if (hp.logit_scale == 0.0f) throw gguf::format_error(key("logit_scale"), 0, "must not be 0");

  const gguf::tensor_info* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) bad_tensor("token_embd.weight", "required tensor is missing");
  if (embd->dims.size() != 2 || embd->dims[0] != hp.embd)
    bad_tensor("token_embd.weight", "has dims " + dims_text(embd->dims) + ", expected {" +
                                        std::to_string(hp.embd) + ", vocab}");
  hp.vocab = embd->dims[1];
  m.embd = mat(f, "token_embd.weight", hp.vocab, hp.embd);
  m.output = f.find_tensor("output.weight") ? mat(f, "output.weight", hp.vocab, hp.embd) : m.embd;
  m.output_norm = vec(f, "output_norm.weight", hp.embd);
  const std::size_t q_width = hp.heads * hp.head_dim, kv_width = hp.kv_heads * hp.head_dim;
  for (std::size_t l = 0; l < hp.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    layer_weights w;
    w.attn_norm = vec(f, b + "attn_norm.weight", hp.embd);
    w.wq = mat(f, b + "attn_q.weight", q_width, hp.embd);
    w.wk = mat(f, b + "attn_k.weight", kv_width, hp.embd);
    w.wv = mat(f, b + "attn_v.weight", kv_width, hp.embd);
    w.wo = mat(f, b + "attn_output.weight", hp.embd, q_width);
    w.ffn_norm = vec(f, b + "ffn_norm.weight", hp.embd);
    w.gate = mat(f, b + "ffn_gate.weight", hp.ff, hp.embd);
    w.up = mat(f, b + "ffn_up.weight", hp.ff, hp.embd);
    w.down = mat(f, b + "ffn_down.weight", hp.embd, hp.ff);
    for (const char* bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                             "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias", "attn_qkv.weight"})
      if (f.find_tensor(b + bias) != nullptr)
        bad_tensor(b + bias, "is not supported by this runner");
    if (hp.arch == architecture::granite_swa) {
      w.sinks = vec(f, b + "attn_sinks.weight", hp.heads);
    } else {
      w.q_norm = vec(f, b + "attn_q_norm.weight", hp.head_dim);
      w.k_norm = vec(f, b + "attn_k_norm.weight", hp.head_dim);
      w.post_attn_norm = vec(f, b + "post_attention_norm.weight", hp.embd);
      w.post_ffn_norm = vec(f, b + "post_ffw_norm.weight", hp.embd);
    }
    m.layers.push_back(std::move(w));
  }
  return m;
}

std::int32_t argmax(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace gguf_run
