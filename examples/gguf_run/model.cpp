#include "model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "matmul.hpp"

import ringkv;

namespace gguf_run {
namespace {

// ggml's GELU constants (tanh approximation), so the exact path matches its formula.
constexpr float gelu_coef_a = 0.044715f;
constexpr float sqrt_2_over_pi = 0.79788456080286535587989211986876f;

float gelu(float x) {
  return 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * x * (1.0f + gelu_coef_a * x * x)));
}

/// llama.cpp's CPU GELU: the input rounded to f16 indexes a table of f16 results (exact
/// outside ±10).
float gelu_f16_table(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float in = gguf::half_to_float(gguf::float_to_half(x));
  return gguf::half_to_float(gguf::float_to_half(gelu(in)));
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

/// RMSNorm of each row of `n` rows of `dim` times `weight`, as ggml computes it: the sum of
/// squares in double, the mean and the scale in float, then (x * scale) * weight.
void rms_norm(const float* x, std::size_t n, std::size_t dim, const std::vector<float>& weight,
              float eps, float* y) {
  for (std::size_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (std::size_t i = 0; i < dim; ++i) sum += double(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / double(dim));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (std::size_t i = 0; i < dim; ++i) yr[i] = (xr[i] * scale) * weight[i];
  }
}

/// RoPE of `heads` heads of each of n rows at positions pos0 …, as ggml's CPU backend: the
/// angle of pair i is the position times base^(-2i/dim), formed by repeated multiplication in
/// float. `neox`: pairs (i, i + dim/2) (gemma3); else adjacent pairs (2i, 2i+1) (granite).
void rope(float* x, std::size_t n, std::size_t heads, std::size_t dim, std::size_t pos0, float base,
          bool neox) {
  const float theta_scale = std::pow(base, -2.0f / float(dim));
  std::vector<float> cs(dim);
  for (std::size_t r = 0; r < n; ++r) {
    float theta = float(pos0 + r);
    for (std::size_t i = 0; i < dim; i += 2) {
      cs[i] = std::cos(theta);
      cs[i + 1] = std::sin(theta);
      theta *= theta_scale;
    }
    for (std::size_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * dim;
      for (std::size_t i = 0; i < dim; i += 2) {
        const std::size_t a = neox ? i / 2 : i, b = neox ? i / 2 + dim / 2 : i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[i] - x1 * cs[i + 1];
        v[b] = x0 * cs[i + 1] + x1 * cs[i];
      }
    }
  }
}

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

struct runner::impl {
  const model& m;
  run_options o;
  ringkv::default_thread_pool pool;
  std::vector<std::unique_ptr<ringkv::kv_cache_store>> stores;
  std::vector<ringkv::layer_attention> layers;  // a layer's prefill and steps over its store
  std::size_t position = 0;
  double attention_seconds = 0.0;
  std::vector<float> x, h, q, k, v, att, o_buf, gate, up;  // [n, width] activations of a chunk

  impl(const model& model, run_options options)
      : m(model), o(options), pool(std::max<std::size_t>(1, options.threads)) {
    const hyper& hp = m.hp;
    for (std::size_t l = 0; l < hp.layers; ++l) {
      const bool ring = hp.sliding[l];
      const ringkv::dtype t = element_type(o.cache);
      const ringkv::kv_cache_config c{.layers = 1,
                                      .kv_heads = hp.kv_heads,
                                      .head_dim = hp.head_dim,
                                      .capacity = ring ? hp.window : o.max_positions,
                                      .key_type = t,
                                      .value_type = t};
      const ringkv::store_options so{.sliding_window = ring};
      if (o.cache == cache_type::turboquant)
        stores.push_back(std::make_unique<ringkv::turboquant_kv_cache_store>(
            c, ringkv::turboquant_options{}, so));
      else if (o.cache == cache_type::int8)
        stores.push_back(std::make_unique<ringkv::int8_kv_cache_store>(c, so));
      else
        stores.push_back(std::make_unique<ringkv::default_kv_cache_store>(c, so));
      layers.emplace_back(*stores.back(), 0, layer_options(l));
    }
  }

  /// The element type of a cache of element rows (f32 for the compressed ones' config).
  static ringkv::dtype element_type(cache_type c) noexcept {
    switch (c) {
      case cache_type::f16:
        return ringkv::dtype::f16;
      case cache_type::bf16:
        return ringkv::dtype::bf16;
      case cache_type::fp8:
        return ringkv::dtype::fp8_e4m3;
      case cache_type::f32:
      case cache_type::turboquant:
      case cache_type::int8:
        break;
    }
    return ringkv::dtype::f32;
  }

  float scale() const {
    if (m.hp.arch == architecture::gemma3) return 1.0f;  // q was scaled already, as llama.cpp does
    return m.hp.attention_scale != 0.0f ? m.hp.attention_scale
                                        : 1.0f / std::sqrt(float(m.hp.head_dim));
  }
  std::span<const float> sinks(std::size_t l) const { return m.layers[l].sinks; }
  ringkv::layer_options layer_options(std::size_t l) {
    return {.window = window(l), .scale = scale(), .sinks = sinks(l), .pool = &pool};
  }
  std::size_t window(std::size_t l) const { return m.hp.sliding[l] ? m.hp.window : 0; }

  /// y[n, w.rows] = x[n, w.cols] · wᵀ, rows split across the pool (same bits for any split).
  void matmul(const matrix& w, const std::vector<float>& in, std::size_t n, std::vector<float>& y) {
    y.resize(n * w.rows);
    constexpr std::size_t rows_a_task = 32;
    const std::size_t tasks = (w.rows + rows_a_task - 1) / rows_a_task;
    pool.parallel_for(tasks, [&](std::size_t i) {
      const std::size_t r0 = i * rows_a_task, r1 = std::min(w.rows, r0 + rows_a_task);
      matmul_rows(w.w.data(), r0, r1, w.cols, in.data(), n, y.data(), w.rows);
    });
  }

  /// Runs n tokens (n == 1 with `step`: one decode step a layer) and writes their logits.
  void run(std::span<const std::int32_t> tokens, std::span<float> logits, bool step) {
    const hyper& hp = m.hp;
    const std::size_t n = tokens.size();
    if (logits.size() != n * hp.vocab)
      throw std::invalid_argument("gguf_run::runner: logits has " + std::to_string(logits.size()) +
                                  " floats, expected " + std::to_string(n * hp.vocab));
    for (std::int32_t t : tokens)
      if (t < 0 || std::size_t(t) >= hp.vocab)
        throw std::out_of_range("gguf_run::runner: token id " + std::to_string(t) +
                                " is not below the vocabulary size " + std::to_string(hp.vocab));
    // Every global layer's dense store has the same room: refuse before any layer appends.
    for (std::size_t l = 0; l < hp.layers; ++l)
      if (!hp.sliding[l] && position + n > o.max_positions)
        throw ringkv::cache_full("gguf_run::runner: " + std::to_string(position + n) +
                                 " positions exceed max_positions " +
                                 std::to_string(o.max_positions));
    const std::size_t E = hp.embd, D = hp.head_dim;
    const std::size_t qw = hp.heads * D, kw = hp.kv_heads * D;
    const bool gemma = hp.arch == architecture::gemma3;
    x.resize(n * E);
    h.resize(n * E);
    for (std::size_t i = 0; i < n; ++i) {
      std::memcpy(&x[i * E], &m.embd.w[std::size_t(tokens[i]) * E], E * sizeof(float));
      const float s = gemma ? std::sqrt(float(E)) : hp.embedding_scale;
      if (s != 0.0f)
        for (std::size_t j = 0; j < E; ++j) x[i * E + j] *= s;
    }
    for (std::size_t l = 0; l < hp.layers; ++l) {
      const layer_weights& w = m.layers[l];
      rms_norm(x.data(), n, E, w.attn_norm, hp.rms_eps, h.data());
      matmul(w.wq, h, n, q);
      matmul(w.wk, h, n, k);
      matmul(w.wv, h, n, v);
      if (gemma) {
        rms_norm(q.data(), n * hp.heads, D, w.q_norm, hp.rms_eps, q.data());
        rms_norm(k.data(), n * hp.kv_heads, D, w.k_norm, hp.rms_eps, k.data());
      }
      // gemma3's sliding layers have their own base; granite's layers share one.
      const float rope_base = gemma && hp.sliding[l] ? hp.rope_base_swa : hp.rope_base;
      rope(q.data(), n, hp.heads, D, position, rope_base, gemma);
      rope(k.data(), n, hp.kv_heads, D, position, rope_base, gemma);
      if (gemma)
        for (float& e : q) e *= hp.attention_scale;
      att.resize(n * qw);
      const auto start = std::chrono::steady_clock::now();
      if (step)
        layers[l].step({q, k, v}, att);
      else
        layers[l].prefill(q, k, v, att);
      attention_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      matmul(w.wo, att, n, o_buf);
      if (gemma) {
        rms_norm(o_buf.data(), n, E, w.post_attn_norm, hp.rms_eps, o_buf.data());
      } else if (hp.residual_scale != 0.0f) {
        for (float& e : o_buf) e *= hp.residual_scale;
      }
      for (std::size_t i = 0; i < n * E; ++i) x[i] = o_buf[i] + x[i];
      rms_norm(x.data(), n, E, w.ffn_norm, hp.rms_eps, h.data());
      matmul(w.gate, h, n, gate);
      matmul(w.up, h, n, up);
      for (std::size_t i = 0; i < gate.size(); ++i)
        gate[i] =
            (gemma ? (o.gelu_f16_table ? gelu_f16_table(gate[i]) : gelu(gate[i])) : silu(gate[i])) *
            up[i];
      matmul(w.down, gate, n, o_buf);
      if (gemma) {
        rms_norm(o_buf.data(), n, E, w.post_ffn_norm, hp.rms_eps, o_buf.data());
      } else if (hp.residual_scale != 0.0f) {
        for (float& e : o_buf) e *= hp.residual_scale;
      }
      for (std::size_t i = 0; i < n * E; ++i) x[i] = o_buf[i] + x[i];
    }
    rms_norm(x.data(), n, E, m.output_norm, hp.rms_eps, h.data());
    std::vector<float>& out = o_buf;
    matmul(m.output, h, n, out);
    const float logit_mul = gemma ? 1.0f : 1.0f / hp.logit_scale;
    for (std::size_t i = 0; i < n * hp.vocab; ++i) {
      float e = out[i];
      if (!gemma) e *= logit_mul;
      if (gemma && hp.softcap != 0.0f) e = std::tanh(e * (1.0f / hp.softcap)) * hp.softcap;
      logits[i] = e;
    }
    position += n;
  }
};

runner::runner(const model& m, run_options options) : impl_(std::make_unique<impl>(m, options)) {}
runner::~runner() = default;

void runner::prefill(std::span<const std::int32_t> tokens, std::span<float> logits) {
  if (tokens.empty()) return;
  impl_->run(tokens, logits, false);
}

void runner::decode(std::int32_t token, std::span<float> logits) {
  impl_->run(std::span<const std::int32_t>(&token, 1), logits, true);
}

std::size_t runner::position() const noexcept { return impl_->position; }
double runner::attention_seconds() const noexcept { return impl_->attention_seconds; }
const model& runner::weights() const noexcept { return impl_->m; }

std::int32_t argmax(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace gguf_run
