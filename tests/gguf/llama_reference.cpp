#include "llama_reference.hpp"

#include <algorithm>
#include <cstddef>
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

namespace {

using model_ptr = std::unique_ptr<llama_model, decltype(&llama_model_free)>;
using context_ptr = std::unique_ptr<llama_context, decltype(&llama_free)>;

model_ptr load(const std::string& path) {
  model_ptr model(llama_model_load_from_file(path.c_str(), llama_model_default_params()),
                  &llama_model_free);
  if (!model) throw std::runtime_error("llama.cpp could not load " + path);
  return model;
}

/// A context of `cells` K/V cells for `sequences` sequences, batches of `batch` tokens.
context_ptr context(llama_model* model, std::size_t cells, std::size_t batch, std::size_t sequences,
                    bool unified, const std::string& path) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(cells);
  cp.n_batch = cp.n_ubatch = static_cast<std::uint32_t>(batch);
  cp.n_seq_max = static_cast<std::uint32_t>(sequences);
  cp.kv_unified = unified;
  cp.n_threads = cp.n_threads_batch = 1;
  // f32 K/V and no flash attention: llama.cpp's f16 cache and f16 accumulation would add
  // their own rounding (~4e-4) to what is compared.
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = false;
  cp.no_perf = true;
  context_ptr ctx(llama_init_from_model(model, cp), &llama_free);
  if (!ctx) throw std::runtime_error("llama.cpp could not make a context for " + path);
  return ctx;
}

}  // namespace

std::vector<float> logits(const std::string& path, std::span<const std::int32_t> tokens,
                          std::size_t ubatch, std::size_t* vocab_out) {
  const model_ptr model = load(path);
  const context_ptr ctx =
      context(model.get(), (tokens.size() + 255) / 256 * 256, ubatch, 1, true, path);
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

std::vector<float> logits_together(const std::string& path, std::span<const sequence_feed> seqs,
                                   std::size_t chunk, bool unified) {
  const model_ptr model = load(path);
  std::size_t longest = 0, total = 0;
  std::vector<std::size_t> first;  // [seqs] its first row of the output
  for (const sequence_feed& s : seqs) {
    longest = std::max(longest, s.tokens.size());
    first.push_back(total);
    total += s.tokens.size();
  }
  const std::size_t batch_tokens = seqs.size() * chunk;
  const context_ptr ctx = context(model.get(), seqs.size() * ((longest + 255) / 256 * 256),
                                  batch_tokens, seqs.size(), unified, path);
  const std::size_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
  std::vector<float> out(total * vocab);
  std::vector<std::size_t> fed(seqs.size(), 0), row_of(batch_tokens);
  llama_batch batch = llama_batch_init(static_cast<std::int32_t>(batch_tokens), 0, 1);
  for (bool more = true; more;) {
    more = false;
    std::int32_t n = 0;
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      const sequence_feed& q = seqs[s];
      const std::size_t take = fed[s] < q.prompt
                                   ? std::min(chunk, q.prompt - fed[s])
                                   : std::min<std::size_t>(1, q.tokens.size() - fed[s]);
      for (std::size_t i = 0; i < take; ++i, ++n) {
        batch.token[n] = q.tokens[fed[s] + i];
        batch.pos[n] = static_cast<llama_pos>(fed[s] + i);
        batch.n_seq_id[n] = 1;
        batch.seq_id[n][0] = static_cast<llama_seq_id>(s);
        batch.logits[n] = 1;
        row_of[std::size_t(n)] = first[s] + fed[s] + i;
      }
      fed[s] += take;
    }
    if (n == 0) break;
    more = true;
    batch.n_tokens = n;
    if (llama_decode(ctx.get(), batch) != 0) {
      llama_batch_free(batch);
      throw std::runtime_error("llama_decode of a multi-sequence batch failed");
    }
    for (std::int32_t i = 0; i < n; ++i) {
      const float* l = llama_get_logits_ith(ctx.get(), i);
      std::copy(l, l + vocab, out.begin() + std::ptrdiff_t(row_of[std::size_t(i)] * vocab));
    }
  }
  llama_batch_free(batch);
  return out;
}

}  // namespace llama_reference
