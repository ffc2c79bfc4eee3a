// Times llama.cpp on a GGUF model the way gguf_run times the runner (for the comparison in the
// runner's measurements; not a test): a random prompt of N tokens in batches of 512, then G
// greedy-free decode steps; f32 K/V cache (its sliding-window layers' cache window-sized, as the
// runner's rings), flash attention off unless FLASH is 1, T threads. With SEQUENCES S > 1
// (gguf_run --parallel S): S sequences, each prompt prefilled in turn, then G steps that decode
// one token of every sequence in one multi-sequence batch: the aggregate decode tokens per
// second, with a K/V stream a sequence or (UNIFIED 1) one buffer for all.
//   llama_speed MODEL PROMPT_TOKENS GENERATE THREADS [SEQUENCES [UNIFIED [FLASH]]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 5 || argc > 8) {
    std::fprintf(
        stderr,
        "usage: llama_speed MODEL PROMPT_TOKENS GENERATE THREADS [SEQUENCES [UNIFIED [FLASH]]]\n");
    return 2;
  }
  const int n = std::atoi(argv[2]), gen = std::atoi(argv[3]), threads = std::atoi(argv[4]);
  const int seqs = argc > 5 ? std::max(1, std::atoi(argv[5])) : 1;
  const bool unified = argc > 6 && std::atoi(argv[6]) != 0;
  const bool flash = argc > 7 && std::atoi(argv[7]) != 0;
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  ggml_backend_load_all_from_path(RINGKV_LLAMA_BINS);
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(seqs * ((n + gen + 255) / 256 * 256));
  cp.n_batch = cp.n_ubatch = 512;
  cp.n_seq_max = static_cast<std::uint32_t>(seqs);
  cp.kv_unified = unified;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = false;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  llama_batch batch = llama_batch_init(512, 0, 1);
  std::uint64_t s = 12345;
  const auto start = std::chrono::steady_clock::now();
  for (int q = 0; q < seqs; ++q)
    for (int p = 0; p < n; p += 512) {
      const int m = std::min(512, n - p);
      batch.n_tokens = m;
      for (int i = 0; i < m; ++i) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        batch.token[i] = static_cast<llama_token>((s >> 33) % vocab);
        batch.pos[i] = p + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = q;
        batch.logits[i] = i == m - 1;
      }
      if (llama_decode(ctx, batch) != 0) return 1;
    }
  const double prefill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto dstart = std::chrono::steady_clock::now();
  for (int g = 0; g < gen; ++g) {
    batch.n_tokens = seqs;
    for (int q = 0; q < seqs; ++q) {
      batch.token[q] = (g + q) % vocab;
      batch.pos[q] = n + g;
      batch.n_seq_id[q] = 1;
      batch.seq_id[q][0] = q;
      batch.logits[q] = 1;
    }
    if (llama_decode(ctx, batch) != 0) return 1;
  }
  const double decode =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - dstart).count();
  std::printf(
      "llama.cpp: prefill %d tokens %.1f tok/s, decode %d tokens %.1f tok/s, %d threads, flash "
      "attention %s",
      seqs * n, seqs * n / prefill, seqs * gen, seqs * gen / decode, threads, flash ? "on" : "off");
  if (seqs > 1) std::printf(", %d sequences (%s)", seqs, unified ? "unified" : "streams");
  std::printf("\n");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
