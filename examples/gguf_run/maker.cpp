#include "maker.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace gguf_run {
namespace {

/// splitmix64: the same stream on every platform (std's distributions are not portable).
class random_stream {
 public:
  explicit random_stream(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1).
  float uniform() { return float(double(next() >> 40) / double(1ull << 23) - 1.0); }

 private:
  std::uint64_t s_;
};

std::vector<std::byte> encode(const std::vector<float>& v, gguf::tensor_type t) {
  std::vector<std::byte> out(v.size() * gguf::element_size(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == gguf::tensor_type::f32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t h =
          t == gguf::tensor_type::f16 ? gguf::float_to_half(v[i]) : gguf::float_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

}  // namespace

gguf::writer make_model(const model_spec& s) {
  const auto refuse = [](const std::string& what) {
    throw std::invalid_argument("gguf_run::make_model: " + what);
  };
  if (s.vocab == 0 || s.embd == 0 || s.layers == 0 || s.heads == 0 || s.kv_heads == 0 ||
      s.head_dim == 0 || s.ff == 0 || s.window == 0)
    refuse("every size must be positive");
  if (s.heads % s.kv_heads != 0) refuse("kv_heads must divide heads");
  if (s.head_dim % 2 != 0) refuse("head_dim must be even (RoPE pairs)");
  if (!s.sliding.empty() && s.sliding.size() != s.layers)
    refuse("sliding has " + std::to_string(s.sliding.size()) + " entries for " +
           std::to_string(s.layers) + " layers");
  const bool granite = s.arch == architecture::granite_swa;
  const std::string a = name_of(s.arch);
  gguf::writer w;
  w.add_string("general.architecture", a);
  w.add_string("general.name", "ringkv random " + a);
  w.add_u32(a + ".context_length", 32768);
  w.add_u32(a + ".embedding_length", std::uint32_t(s.embd));
  w.add_u32(a + ".block_count", std::uint32_t(s.layers));
  w.add_u32(a + ".feed_forward_length", std::uint32_t(s.ff));
  w.add_u32(a + ".attention.head_count", std::uint32_t(s.heads));
  w.add_u32(a + ".attention.head_count_kv", std::uint32_t(s.kv_heads));
  w.add_u32(a + ".attention.key_length", std::uint32_t(s.head_dim));
  w.add_u32(a + ".attention.value_length", std::uint32_t(s.head_dim));
  w.add_u32(a + ".rope.dimension_count", std::uint32_t(s.head_dim));
  w.add_f32(a + ".rope.freq_base", granite ? 10000.0f : 1000000.0f);
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_u32(a + ".attention.sliding_window", std::uint32_t(s.window));
  if (granite) {
    std::vector<bool> sliding = s.sliding;
    if (sliding.empty())
      for (std::size_t l = 0; l < s.layers; ++l) sliding.push_back(l % 4 != 3);
    w.add_bool_array(a + ".attention.sliding_window_pattern", sliding);
    w.add_f32(a + ".logit_scale", 2.0f);
    w.add_f32(a + ".embedding_scale", 4.0f);
    w.add_f32(a + ".residual_scale", 0.5f);
    w.add_f32(a + ".attention.scale", 1.0f / float(s.head_dim) * 2.0f);
  } else {
    w.add_u32(a + ".attention.sliding_window_pattern", std::uint32_t(s.period));
    w.add_f32(a + ".rope.freq_base_swa", 10000.0f);
  }
  // No tokenizer: llama.cpp takes token ids straight, with vocab_size dummy tokens.
  w.add_string("tokenizer.ggml.model", "none");
  w.add_u32(a + ".vocab_size", std::uint32_t(s.vocab));

  random_stream rng(s.seed);
  const auto weights = [&](std::size_t rows, std::size_t cols) {
    std::vector<float> v(rows * cols);
    const float a = std::sqrt(3.0f / float(cols));  // variance 1 / cols
    for (float& x : v) x = a * rng.uniform();
    return v;
  };
  const auto norm = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = 1.0f + 0.1f * rng.uniform();
    return v;
  };
  const auto tensor2 = [&](const std::string& name, std::size_t rows, std::size_t cols) {
    w.add_tensor(name, {cols, rows}, s.weights, encode(weights(rows, cols), s.weights));
  };
  // Norm and sink vectors stay F32, as converters write them.
  const auto tensor1 = [&](const std::string& name, std::vector<float> v) {
    const std::uint64_t n = v.size();
    w.add_tensor(name, {n}, gguf::tensor_type::f32, encode(v, gguf::tensor_type::f32));
  };
  {
    std::vector<float> e(s.vocab * s.embd);
    for (float& x : e) x = s.embedding_range * rng.uniform();
    w.add_tensor("token_embd.weight", {s.embd, s.vocab}, s.weights, encode(e, s.weights));
  }
  tensor1("output_norm.weight", norm(s.embd));
  if (!s.tied) tensor2("output.weight", s.vocab, s.embd);
  const std::size_t qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  for (std::size_t l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor1(b + "attn_norm.weight", norm(s.embd));
    tensor2(b + "attn_q.weight", qw, s.embd);
    tensor2(b + "attn_k.weight", kw, s.embd);
    tensor2(b + "attn_v.weight", kw, s.embd);
    tensor2(b + "attn_output.weight", s.embd, qw);
    if (granite) {
      std::vector<float> sinks(s.heads);
      for (float& x : sinks) x = 2.0f * rng.uniform();
      tensor1(b + "attn_sinks.weight", sinks);
    } else {
      tensor1(b + "attn_q_norm.weight", norm(s.head_dim));
      tensor1(b + "attn_k_norm.weight", norm(s.head_dim));
      tensor1(b + "post_attention_norm.weight", norm(s.embd));
      tensor1(b + "post_ffw_norm.weight", norm(s.embd));
    }
    tensor1(b + "ffn_norm.weight", norm(s.embd));
    tensor2(b + "ffn_gate.weight", s.ff, s.embd);
    tensor2(b + "ffn_up.weight", s.ff, s.embd);
    tensor2(b + "ffn_down.weight", s.embd, s.ff);
  }
  return w;
}

}  // namespace gguf_run
