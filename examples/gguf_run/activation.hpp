// The runner's gated activations over whole rows (Highway, dynamic dispatch: activation.cpp).
#pragma once
#include <cstddef>

namespace gguf_run {

// ggml's GELU constants (tanh approximation): the vector path and the f16 table's entries.
inline constexpr float gelu_coef_a = 0.044715f;
inline constexpr float sqrt_2_over_pi = 0.79788456080286535587989211986876f;

/// gate[i] = silu(gate[i]) · up[i] = gate[i] / (1 + e^-gate[i]) · up[i] (granite's FFN), with
/// Highway's vector exp (a few ulp, as ggml's own vector exp); O(n).
void silu_times(float* gate, const float* up, std::size_t n);

/// gate[i] = gelu(gate[i]) · up[i] with ggml's tanh form (gemma3's FFN), Highway's vector tanh;
/// O(n).
void gelu_times(float* gate, const float* up, std::size_t n);

}  // namespace gguf_run
