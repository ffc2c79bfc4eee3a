// The forward passes of granite_swa and gemma3 over ringkv: every layer keeps its K/V in a
// ringkv store (a ring of capacity = the window for sliding-window layers, a dense store for
// global ones) attended by one ringkv::layer_attention: a prompt through its prefill,
// generation through its steps. The arithmetic follows llama.cpp's CPU backend where that is cheap to
// do (RMSNorm's double sum, RoPE's angle recurrence, the order of scales), so the logits can be
// compared with llama.cpp's at f32 tolerance. No ringkv types here (the runner is a pimpl), so
// the header can be included anywhere.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf.hpp"

namespace gguf_run {

enum class architecture { granite_swa, gemma3 };
/// The K/V cache kinds the runner can put behind every layer.
enum class cache_type { f32, f16, bf16, fp8, turboquant, int8 };

/// The cache type named `s` ("f32", "f16", "bf16", "fp8", "turboquant", "int8"), or none.
std::optional<cache_type> parse_cache_type(std::string_view s);
/// Its name, as parse_cache_type takes it.
const char* name_of(cache_type t) noexcept;
const char* name_of(architecture a) noexcept;

/// What a model's metadata says (llama.cpp's reading of the same keys).
struct hyper {
  architecture arch = architecture::granite_swa;
  std::size_t vocab = 0, embd = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ff = 0;
  std::size_t window = 0;     // n_swa: keys a sliding-window query sees, counting itself
  std::vector<bool> sliding;  // per layer: a sliding-window layer (else global)
  float rms_eps = 1e-6f, rope_base = 10000.0f, rope_base_swa = 10000.0f;
  float attention_scale = 0.0f;  // granite: 0 → 1/sqrt(head_dim); gemma3: applied to q
  float logit_scale = 1.0f;      // granite: logits are divided by it
  float embedding_scale = 0.0f, residual_scale = 0.0f;  // granite; 0: not applied
  float softcap = 0.0f;                                 // gemma3: final logit soft-capping; 0: none
};

/// Row-major [rows, cols] f32 weights (a GGUF tensor of dims {cols, rows}).
struct matrix {
  std::size_t rows = 0, cols = 0;
  std::vector<float> w;
};

struct layer_weights {
  std::vector<float> attn_norm, ffn_norm;
  matrix wq, wk, wv, wo, gate, up, down;
  std::vector<float> sinks;                                          // granite_swa
  std::vector<float> q_norm, k_norm, post_attn_norm, post_ffn_norm;  // gemma3
};

/// A model's hyperparameters and weights (F16/BF16 tensors widened to f32 exactly).
struct model {
  hyper hp;
  matrix embd, output;  // [vocab, embd] each (output is embd when the file has none)
  std::vector<float> output_norm;
  std::vector<layer_weights> layers;

  /// Reads a parsed GGUF file: architecture, keys and every tensor's shape are checked
  /// (gguf::format_error naming the key or tensor). O(weights).
  static model from(const gguf::file& f);
};

struct run_options {
  std::size_t threads = 1;             // matrix products and attention split over this many
  cache_type cache = cache_type::f32;  // every layer's K/V store
  std::size_t max_positions = 4096;    // capacity of the global (dense) layers' stores
  bool gelu_f16_table = false;         // gemma3: GELU through an f16 table, as llama.cpp's CPU
};

/// Runs a model token after token, keeping every layer's K/V in ringkv stores.
class runner {
 public:
  /// Builds one store per layer; O(stores' capacity). Throws std::invalid_argument for
  /// options the stores refuse (e.g. a head_dim a compressed store cannot take).
  runner(const model& m, run_options options);
  ~runner();
  runner(const runner&) = delete;
  runner& operator=(const runner&) = delete;

  /// The next tokens.size() tokens as one chunk: each layer's attention is one
  /// ringkv::layer_attention::prefill call. Writes the logits of every token to `logits`
  /// ([tokens.size(), vocab]). Throws std::out_of_range for a token id ≥ vocab and
  /// ringkv::cache_full past max_positions, before any store changes.
  void prefill(std::span<const std::int32_t> tokens, std::span<float> logits);
  /// One token through every layer with ringkv::layer_attention::step; logits [vocab].
  void decode(std::int32_t token, std::span<float> logits);

  /// Tokens run so far.
  std::size_t position() const noexcept;
  /// Seconds spent inside ringkv attention calls (prefill and steps) so far.
  double attention_seconds() const noexcept;
  const model& weights() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Runs many sequences of one model at once (continuous batching): a call takes rows of any
/// live sequences — a prompt chunk of one, a decode token of another — runs them together
/// through every weight product (each weight matrix read once for all of them) and attends each
/// sequence's rows as one entry of one ringkv::attend_batch a layer. Every row's arithmetic is
/// its own (the products sum each row in one order whatever rows share the call), so each
/// sequence's logits are bit-identical to a runner fed the same tokens alone. The K/V of all
/// sequences live in one ringkv::kv_cache_pool (rings for sliding layers, dense layers in blocks).
class batch_runner {
 public:
  /// Rows of one sequence in a call: its next tokens and where their logits go
  /// ([tokens.size(), vocab]).
  struct part {
    std::size_t sequence = 0;
    std::span<const std::int32_t> tokens;
    std::span<float> logits;
  };

  /// A pool for up to `max_sequences` sequences of max_positions each. Throws
  /// std::invalid_argument for a compressed cache (the pool's dense layers hold element rows).
  batch_runner(const model& m, run_options options, std::size_t max_sequences);
  ~batch_runner();
  batch_runner(const batch_runner&) = delete;
  batch_runner& operator=(const batch_runner&) = delete;

  /// A new empty sequence's id; throws ringkv::pool_budget_exceeded past max_sequences.
  std::size_t add();
  /// Forgets a sequence, its K/V returned to the pool (std::out_of_range for an unknown id).
  void remove(std::size_t sequence);
  /// Runs every part's tokens at its sequence's next positions. Checks every part first
  /// (unknown or repeated sequence, token ids, logits sizes, room): a refusal changes nothing.
  void run(std::span<const part> parts);
  /// Tokens a sequence has run.
  std::size_t position(std::size_t sequence) const;
  /// Seconds spent inside ringkv attention calls so far.
  double attention_seconds() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Index of the largest logit (the first on ties).
std::int32_t argmax(std::span<const float> logits);

}  // namespace gguf_run
