// The runner's gated activations over whole rows (Highway, dynamic dispatch: activation.cpp).
#pragma once
#include <cstddef>

namespace gguf_run {

/// gate[i] = silu(gate[i]) · up[i] = gate[i] / (1 + e^-gate[i]) · up[i] (granite's FFN), with
/// Highway's vector exp (a few ulp, as ggml's own vector exp); O(n).
void silu_times(float* gate, const float* up, std::size_t n);

/// gate[i] = gelu(gate[i]) · up[i] with ggml's tanh form (gemma3's FFN), Highway's vector tanh;
/// O(n).
void gelu_times(float* gate, const float* up, std::size_t n);

}  // namespace gguf_run
