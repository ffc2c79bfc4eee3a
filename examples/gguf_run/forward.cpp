// The forward passes of granite_swa and gemma3 over ringkv: rows of one or many sequences
// through every layer, each sequence's attention one entry of one ringkv::attend_batch a layer;
// runner (one sequence, its own stores) and batch_runner (many, in one kv_cache_pool).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "activation.hpp"
#include "matmul.hpp"
#include "model.hpp"

import ringkv;

namespace gguf_run {
namespace {

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

/// RoPE's cos/sin for n rows at positions pos0 …, as ggml's CPU backend forms them: the angle
/// of pair i is the position times base^(-2i/dim) by repeated multiplication in float.
/// cs[r * dim + 2i] = cos, [.. + 2i + 1] = sin.
void rope_angles(std::size_t n, std::size_t dim, std::size_t pos0, float base, float* cs) {
  const float theta_scale = std::pow(base, -2.0f / float(dim));
  for (std::size_t r = 0; r < n; ++r) {
    float theta = float(pos0 + r);
    for (std::size_t i = 0; i < dim; i += 2) {
      cs[r * dim + i] = std::cos(theta);
      cs[r * dim + i + 1] = std::sin(theta);
      theta *= theta_scale;
    }
  }
}

/// RoPE of `heads` heads of each of n rows by the angles of rope_angles. `neox`: pairs
/// (i, i + dim/2) (gemma3); else adjacent pairs (2i, 2i+1) (granite).
void rope(float* x, std::size_t n, std::size_t heads, std::size_t dim, const float* cs, bool neox) {
  for (std::size_t r = 0; r < n; ++r) {
    const float* c = cs + r * dim;
    for (std::size_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * dim;
      for (std::size_t i = 0; i < dim; i += 2) {
        const std::size_t a = neox ? i / 2 : i, b = neox ? i / 2 + dim / 2 : i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c[i] - x1 * c[i + 1];
        v[b] = x0 * c[i + 1] + x1 * c[i];
      }
    }
  }
}

/// The element type of a cache of element rows (f32 for the compressed ones' config).
ringkv::dtype element_type(cache_type c) noexcept {
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

/// One sequence's K/V as the forward pass sees it: a layer_attention a layer, its position.
struct sequence_kv {
  std::vector<ringkv::layer_attention> layers;
  std::size_t position = 0;
};

/// The rows of one sequence in a pass.
struct part_ref {
  sequence_kv* kv = nullptr;
  std::span<const std::int32_t> tokens;
  std::span<float> logits;
};

/// The weights, the thread pool and the activations: runs parts of any sequences together.
struct forward {
  const model& m;
  run_options o;
  ringkv::default_thread_pool pool;
  double attention_seconds = 0.0;
  std::vector<float> x, h, q, k, v, att, o_buf, gate, up;  // [rows, width] activations
  std::vector<float> angles[2];  // [rows, head_dim] RoPE cos/sin: the global base, gemma3's local
  std::vector<ringkv::batch_entry> entries;  // [parts] one layer's attention

  forward(const model& model, run_options options)
      : m(model), o(options), pool(std::max<std::size_t>(1, options.threads)) {}

  float scale() const {
    if (m.hp.arch == architecture::gemma3) return 1.0f;  // q was scaled already, as llama.cpp does
    return m.hp.attention_scale != 0.0f ? m.hp.attention_scale
                                        : 1.0f / std::sqrt(float(m.hp.head_dim));
  }
  std::size_t window(std::size_t l) const { return m.hp.sliding[l] ? m.hp.window : 0; }
  ringkv::layer_options layer_options(std::size_t l) {
    return {.window = window(l), .scale = scale(), .sinks = m.layers[l].sinks, .pool = &pool};
  }

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

  /// x += a block's output o_buf ([n, embd]): gemma3 normalises it first (its post norm),
  /// granite scales it by residual_scale when it has one.
  void add_residual(std::size_t n, const std::vector<float>& post_norm) {
    const hyper& hp = m.hp;
    const std::size_t E = hp.embd;
    if (hp.arch == architecture::gemma3) {
      rms_norm(o_buf.data(), n, E, post_norm, hp.rms_eps, o_buf.data());
    } else if (hp.residual_scale != 0.0f) {
      for (float& e : o_buf) e *= hp.residual_scale;
    }
    for (std::size_t i = 0; i < n * E; ++i) x[i] = o_buf[i] + x[i];
  }

  /// Refuses (before anything changes) a part with a bad logits size, token id or no room.
  void check(std::span<const part_ref> parts) const {
    const hyper& hp = m.hp;
    const bool dense = std::find(hp.sliding.begin(), hp.sliding.end(), false) != hp.sliding.end();
    for (const part_ref& p : parts) {
      const std::size_t n = p.tokens.size();
      if (p.logits.size() != n * hp.vocab)
        throw std::invalid_argument("gguf_run::runner: logits has " +
                                    std::to_string(p.logits.size()) + " floats, expected " +
                                    std::to_string(n * hp.vocab));
      for (std::int32_t t : p.tokens)
        if (t < 0 || std::size_t(t) >= hp.vocab)
          throw std::out_of_range("gguf_run::runner: token id " + std::to_string(t) +
                                  " is not below the vocabulary size " + std::to_string(hp.vocab));
      // Every global layer has the same room: refuse before any layer appends.
      if (dense && p.kv->position + n > o.max_positions)
        throw ringkv::cache_full("gguf_run::runner: " + std::to_string(p.kv->position + n) +
                                 " positions exceed max_positions " +
                                 std::to_string(o.max_positions));
    }
  }

  /// Runs every part's tokens at its sequence's next positions and writes their logits.
  void run(std::span<const part_ref> parts) {
    check(parts);
    const hyper& hp = m.hp;
    std::size_t n = 0;
    for (const part_ref& p : parts) n += p.tokens.size();
    if (n == 0) return;
    const std::size_t E = hp.embd, D = hp.head_dim;
    const std::size_t qw = hp.heads * D, kw = hp.kv_heads * D;
    const bool gemma = hp.arch == architecture::gemma3;
    x.resize(n * E);
    h.resize(n * E);
    std::size_t row = 0;
    for (const part_ref& p : parts)
      for (const std::int32_t t : p.tokens) {
        std::memcpy(&x[row * E], &m.embd.w[std::size_t(t) * E], E * sizeof(float));
        const float s = gemma ? std::sqrt(float(E)) : hp.embedding_scale;
        if (s != 0.0f)
          for (std::size_t j = 0; j < E; ++j) x[row * E + j] *= s;
        ++row;
      }
    // Each row's angles once a pass, not once a layer: the layers share one base (two on gemma3).
    for (std::size_t b = 0; b < (gemma ? 2 : 1); ++b) {
      angles[b].resize(n * D);
      row = 0;
      for (const part_ref& p : parts) {
        rope_angles(p.tokens.size(), D, p.kv->position, b == 0 ? hp.rope_base : hp.rope_base_swa,
                    &angles[b][row * D]);
        row += p.tokens.size();
      }
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
      const float* cs = angles[gemma && hp.sliding[l] ? 1 : 0].data();
      att.resize(n * qw);
      entries.clear();
      row = 0;
      for (const part_ref& p : parts) {
        const std::size_t c = p.tokens.size();
        rope(&q[row * qw], c, hp.heads, D, cs + row * D, gemma);
        rope(&k[row * kw], c, hp.kv_heads, D, cs + row * D, gemma);
        entries.push_back({&p.kv->layers[l], std::span(q).subspan(row * qw, c * qw),
                           std::span(k).subspan(row * kw, c * kw),
                           std::span(v).subspan(row * kw, c * kw),
                           std::span(att).subspan(row * qw, c * qw)});
        row += c;
      }
      if (gemma)
        for (float& e : q) e *= hp.attention_scale;
      const auto start = std::chrono::steady_clock::now();
      ringkv::attend_batch(entries, &pool);
      attention_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      matmul(w.wo, att, n, o_buf);
      add_residual(n, w.post_attn_norm);
      rms_norm(x.data(), n, E, w.ffn_norm, hp.rms_eps, h.data());
      matmul(w.gate, h, n, gate);
      matmul(w.up, h, n, up);
      if (!gemma)
        silu_times(gate.data(), up.data(), gate.size());
      else if (!o.gelu_f16_table)
        gelu_times(gate.data(), up.data(), gate.size());
      else
        for (std::size_t i = 0; i < gate.size(); ++i) gate[i] = gelu_f16_table(gate[i]) * up[i];
      matmul(w.down, gate, n, o_buf);
      add_residual(n, w.post_ffn_norm);
    }
    rms_norm(x.data(), n, E, m.output_norm, hp.rms_eps, h.data());
    matmul(m.output, h, n, o_buf);
    const float logit_mul = gemma ? 1.0f : 1.0f / hp.logit_scale;
    row = 0;
    for (const part_ref& p : parts) {
      for (std::size_t i = 0; i < p.logits.size(); ++i) {
        float e = o_buf[row * hp.vocab + i];
        if (!gemma) e *= logit_mul;
        if (gemma && hp.softcap != 0.0f) e = std::tanh(e * (1.0f / hp.softcap)) * hp.softcap;
        p.logits[i] = e;
      }
      row += p.tokens.size();
      p.kv->position += p.tokens.size();
    }
  }
};

}  // namespace

struct runner::impl {
  forward f;
  std::vector<std::unique_ptr<ringkv::kv_cache_store>> stores;
  sequence_kv kv;

  impl(const model& model, run_options options) : f(model, options) {
    const hyper& hp = f.m.hp;
    const run_options& o = f.o;
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
      kv.layers.emplace_back(*stores.back(), 0, f.layer_options(l));
    }
  }
  void run(std::span<const std::int32_t> tokens, std::span<float> logits) {
    const part_ref part{&kv, tokens, logits};
    f.run(std::span(&part, 1));
  }
};

runner::runner(const model& m, run_options options) : impl_(std::make_unique<impl>(m, options)) {}
runner::~runner() = default;

void runner::prefill(std::span<const std::int32_t> tokens, std::span<float> logits) {
  impl_->run(tokens, logits);
}

void runner::decode(std::int32_t token, std::span<float> logits) {
  impl_->run(std::span<const std::int32_t>(&token, 1), logits);
}

std::size_t runner::position() const noexcept { return impl_->kv.position; }
double runner::attention_seconds() const noexcept { return impl_->f.attention_seconds; }
const model& runner::weights() const noexcept { return impl_->f.m; }

struct batch_runner::impl {
  forward f;
  std::vector<std::pair<std::size_t, std::size_t>> place;  // [layers] (pool group, its layer)
  std::unique_ptr<ringkv::kv_cache_pool> pool;
  struct sequence {
    ringkv::sequence_id id = 0;
    sequence_kv kv;
  };
  std::map<std::size_t, sequence> live;
  std::vector<part_ref> parts;

  impl(const model& model, run_options options, std::size_t max_sequences) : f(model, options) {
    if (options.cache == cache_type::turboquant || options.cache == cache_type::int8)
      throw std::invalid_argument(std::string("gguf_run::batch_runner: a ") +
                                  name_of(options.cache) +
                                  " cache cannot serve many sequences (the pool's dense layers "
                                  "hold element rows: f32, f16, bf16, fp8)");
    const hyper& hp = f.m.hp;
    const ringkv::dtype t = element_type(options.cache);
    std::size_t counts[2] = {0, 0};  // sliding, global layers
    for (std::size_t l = 0; l < hp.layers; ++l) place.push_back({hp.sliding[l] ? 0 : 1, 0});
    for (auto& [g, i] : place) i = counts[g]++;
    std::vector<ringkv::kv_pool_group> groups;
    std::size_t index[2] = {0, 0}, bytes = 0;
    const std::size_t row = hp.kv_heads * hp.head_dim * ringkv::size_of(t);
    constexpr std::size_t block = 256;
    for (std::size_t g = 0; g < 2; ++g) {
      if (counts[g] == 0) continue;
      index[g] = groups.size();
      const bool ring = g == 0;
      groups.push_back({.config = {.layers = counts[g],
                                   .kv_heads = hp.kv_heads,
                                   .head_dim = hp.head_dim,
                                   .capacity = ring ? hp.window : options.max_positions,
                                   .key_type = t,
                                   .value_type = t},
                        .options = {.sliding_window = ring}});
      // A sequence's share: its rings, or its dense layers full (blocks rounded up).
      bytes += 2 * counts[g] * row * (ring ? hp.window : options.max_positions + 2 * block);
    }
    for (auto& [g, i] : place) g = index[g];
    pool = std::make_unique<ringkv::kv_cache_pool>(
        max_sequences * (bytes + (1 << 16)), std::move(groups),
        ringkv::kv_pool_options{.block_positions = block});
  }

  const sequence& find(std::size_t id) const {
    const auto it = live.find(id);
    if (it == live.end())
      throw std::out_of_range("gguf_run::batch_runner: no sequence " + std::to_string(id));
    return it->second;
  }
  sequence& find(std::size_t id) { return const_cast<sequence&>(std::as_const(*this).find(id)); }
};

batch_runner::batch_runner(const model& m, run_options options, std::size_t max_sequences)
    : impl_(std::make_unique<impl>(m, options, max_sequences)) {}
batch_runner::~batch_runner() = default;

std::size_t batch_runner::add() {
  impl& s = *impl_;
  const ringkv::sequence_id id = s.pool->add();
  impl::sequence q{id, {}};
  for (std::size_t l = 0; l < s.place.size(); ++l)
    q.kv.layers.emplace_back(s.pool->store(id, s.place[l].first), s.place[l].second,
                             s.f.layer_options(l));
  s.live.emplace(std::size_t(id), std::move(q));
  return std::size_t(id);
}

void batch_runner::remove(std::size_t sequence) {
  impl& s = *impl_;
  s.find(sequence);
  s.live.erase(sequence);
  s.pool->remove(sequence);
}

void batch_runner::run(std::span<const part> parts) {
  impl& s = *impl_;
  s.parts.clear();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j)
      if (parts[j].sequence == parts[i].sequence)
        throw std::invalid_argument("gguf_run::batch_runner: sequence " +
                                    std::to_string(parts[i].sequence) + " is in parts " +
                                    std::to_string(j) + " and " + std::to_string(i));
    s.parts.push_back({&s.find(parts[i].sequence).kv, parts[i].tokens, parts[i].logits});
  }
  s.f.run(s.parts);
}

std::size_t batch_runner::position(std::size_t sequence) const {
  return impl_->find(sequence).kv.position;
}

double batch_runner::attention_seconds() const noexcept { return impl_->f.attention_seconds; }

}  // namespace gguf_run
