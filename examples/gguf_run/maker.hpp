// The model maker: random-weight GGUF models of granite_swa and gemma3, deterministic from a
// seed, of any small size and window, that llama.cpp and the runner both load.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gguf.hpp"
#include "model.hpp"

namespace gguf_run {

struct model_spec {
  architecture arch = architecture::granite_swa;
  std::size_t vocab = 96, embd = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, ff = 128;
  std::size_t window = 8;  // keys a sliding-window query sees, counting itself
  /// granite_swa: per layer, sliding (true) or global; empty: every 4th layer (3, 7, …) global.
  std::vector<bool> sliding;
  /// gemma3: every period-th layer is global (llama.cpp's sliding_window_pattern).
  std::size_t period = 2;
  std::uint64_t seed = 1;
  gguf::tensor_type weights = gguf::tensor_type::f32;
  /// No output.weight: the logits come from token_embd, as llama.cpp reads such a file.
  bool tied = false;
  /// token_embd's entries are uniform in ±embedding_range (tied and large: large logits).
  float embedding_range = 1.0f;
};

/// The GGUF file of a random model of `spec`: the same bytes for the same spec. Weights are
/// uniform with variance 1 / fan-in, norms 1 ± 0.1 (the granite one's sinks in ±2, its logit,
/// embedding, residual and attention scales fixed non-trivial values, so each path counts).
/// Throws std::invalid_argument for sizes the architectures cannot have.
gguf::writer make_model(const model_spec& spec);

}  // namespace gguf_run
