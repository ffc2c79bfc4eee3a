#include "serve.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>

namespace gguf_run {

void serve(const model& m, const run_options& options,
           const std::vector<std::vector<std::int32_t>>& prompts, const serve_options& s) {
  struct sequence {
    std::size_t id = 0, fed = 0;
    std::vector<std::int32_t> tokens;  // the prompt, then what it generates
    std::vector<float> logits;         // [chunk, vocab] of its last part
    bool running = false, done = false;
    std::chrono::steady_clock::time_point joined;
    double first_token_seconds = -1.0;  // from joining to its prompt's logits
  };
  const std::size_t vocab = m.hp.vocab;
  std::vector<sequence> seqs(prompts.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens = prompts[i];
  batch_runner batch(m, options, s.parallel);
  std::size_t running = 0, finished = 0, steps = 0, prompt_tokens = 0, generated = 0;
  std::size_t decode_tokens = 0;
  double decode_seconds = 0.0;
  std::vector<batch_runner::part> parts;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t step = 0; finished < seqs.size(); ++step) {
    parts.clear();
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      sequence& q = seqs[i];
      if (!q.running && !q.done && i <= step && running < s.parallel) {
        q.id = batch.add();
        q.joined = std::chrono::steady_clock::now();
        q.running = true;
        ++running;
      }
      if (!q.running) continue;
      const std::size_t prompt = prompts[i].size();
      std::size_t n = 1;
      if (q.fed < prompt) {
        n = std::min(s.chunk, prompt - q.fed);
        prompt_tokens += n;
      } else {  // its last logits pick the next token, which it runs
        q.tokens.push_back(argmax(std::span(q.logits).last(vocab)));
        ++generated;
      }
      q.logits.resize(n * vocab);
      parts.push_back({q.id, std::span(q.tokens).subspan(q.fed, n), std::span(q.logits)});
      q.fed += n;
    }
    // Steps where `parallel` sequences each decode one token: the aggregate decode speed.
    const bool decoding = parts.size() == s.parallel &&
                          std::all_of(parts.begin(), parts.end(), [](const batch_runner::part& p) {
                            return p.tokens.size() == 1;
                          });
    const auto began = std::chrono::steady_clock::now();
    batch.run(parts);
    if (decoding) {
      decode_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      decode_tokens += parts.size();
    }
    ++steps;
    const auto ran = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      sequence& q = seqs[i];
      if (q.running && q.first_token_seconds < 0.0 && q.fed == prompts[i].size())
        q.first_token_seconds = std::chrono::duration<double>(ran - q.joined).count();
      if (q.running && q.fed == prompts[i].size() + s.generate) {
        batch.remove(q.id);
        q.running = false;
        q.done = true;
        --running;
        ++finished;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    std::printf("sequence %zu generated:", i);
    for (std::size_t t = prompts[i].size(); t < seqs[i].tokens.size(); ++t)
      std::printf(" %d", seqs[i].tokens[t]);
    std::printf("\n");
  }
  std::printf(
      "parallel: %zu sequences, %zu at once, %zu steps: %zu prompt and %zu generated tokens in "
      "%.3f s, %.1f tok/s (attention %.1f%%)\n",
      seqs.size(), s.parallel, steps, prompt_tokens, generated, seconds,
      double(prompt_tokens + generated) / seconds, 100.0 * batch.attention_seconds() / seconds);
  // Time to first token of the longest prompt (the last such to join): what a long prompt
  // arriving among decoding sequences waits.
  std::size_t longest = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i)
    if (prompts[i].size() >= prompts[longest].size()) longest = i;
  std::printf("first token: sequence %zu (%zu prompt tokens) %.1f ms after it joined\n", longest,
              prompts[longest].size(), 1e3 * seqs[longest].first_token_seconds);
  if (decode_tokens > 0)
    std::printf("decode: %zu tokens in steps where %zu sequences decode, %.1f tok/s\n",
                decode_tokens, s.parallel, double(decode_tokens) / decode_seconds);
}

}  // namespace gguf_run
