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

/// One sequence of a multi-sequence run: its tokens, the first `prompt` of them its prompt.
struct sequence_feed {
  std::span<const std::int32_t> tokens;
  std::size_t prompt = 0;
};

/// Logits of every position of every sequence ([Σ tokens, vocab], sequence after sequence), the
/// sequences fed to llama_decode together as one multi-sequence batch a step: `chunk` tokens of
/// every sequence whose prompt remains, the next given token of every other (teacher forcing).
/// `unified`: one K/V buffer for all sequences (kv_unified), else a stream a sequence. f32 K/V,
/// flash attention off. Throws std::runtime_error when llama.cpp refuses.
std::vector<float> logits_together(const std::string& path, std::span<const sequence_feed> seqs,
                                   std::size_t chunk, bool unified);

}  // namespace llama_reference
