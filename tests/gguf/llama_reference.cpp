#include "llama_reference.hpp"

#include <memory>
#include <stdexcept>

#include "ggml-backend.h"
#include "llama.h"

namespace llama_reference {

void init(const std::string& bins_dir) {
  static const bool once = [&] {
    llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    // The CPU backend is a plugin: without this llama.cpp has no device to run on.
    ggml_backend_load_all_from_path(bins_dir.c_str());
    llama_backend_init();
    return true;
  }();
  (void)once;
}

std::vector<float> logits(const std::string& path, std::span<const std::int32_t> tokens,
                          std::size_t ubatch, std::size_t* vocab_out) {
  llama_model_params mp = llama_model_default_params();
  std::unique_ptr<llama_model, decltype(&llama_model_free)> model(
      llama_model_load_from_file(path.c_str(), mp), &llama_model_free);
  if (!model) throw std::runtime_error("llama.cpp could not load " + path);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>((tokens.size() + 255) / 256 * 256);
  cp.n_batch = cp.n_ubatch = static_cast<std::uint32_t>(ubatch);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = 1;
  // f32 K/V and no flash attention: llama.cpp's f16 cache and f16 accumulation would add
  // their own rounding (~4e-4) to what is compared.
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = false;
  cp.no_perf = true;
  std::unique_ptr<llama_context, decltype(&llama_free)> ctx(llama_init_from_model(model.get(), cp),
                                                            &llama_free);
  if (!ctx) throw std::runtime_error("llama.cpp could not make a context for " + path);
  const std::size_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
  if (vocab_out) *vocab_out = vocab;
  std::vector<float> out(tokens.size() * vocab);
  llama_batch batch = llama_batch_init(static_cast<std::int32_t>(ubatch), 0, 1);
  for (std::size_t p = 0; p < tokens.size(); p += ubatch) {
    const std::size_t n = std::min(ubatch, tokens.size() - p);
    batch.n_tokens = static_cast<std::int32_t>(n);
    for (std::size_t i = 0; i < n; ++i) {
      batch.token[i] = tokens[p + i];
      batch.pos[i] = static_cast<llama_pos>(p + i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    if (llama_decode(ctx.get(), batch) != 0) {
      llama_batch_free(batch);
      throw std::runtime_error("llama_decode failed at position " + std::to_string(p));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const float* l = llama_get_logits_ith(ctx.get(), static_cast<std::int32_t>(i));
      std::copy(l, l + vocab, out.begin() + (p + i) * vocab);
    }
  }
  llama_batch_free(batch);
  return out;
}

}  // namespace llama_reference
