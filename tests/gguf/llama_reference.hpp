// llama.cpp as the reference (test-only; links the prebuilt libllama of .tools/llama). No
// llama.cpp header here, so the suites that include this need none.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace llama_reference {

/// Loads the CPU backend plugins from `bins_dir` and silences llama.cpp's log; once a process.
void init(const std::string& bins_dir);

/// Logits of every position ([tokens.size(), vocab]) of the GGUF model at `path`, fed to
/// llama_decode `ubatch` tokens at a time, with an f32 K/V cache, flash attention off and
/// llama.cpp's own sliding-window cache (not swa_full: 256-cell padded, so it wraps on prompts
/// longer than that). Throws std::runtime_error when llama.cpp refuses the model or a batch.
std::vector<float> logits(const std::string& path, std::span<const std::int32_t> tokens,
                          std::size_t ubatch, std::size_t* vocab = nullptr);

}  // namespace llama_reference
