// gguf_run: runs a granite_swa or gemma3 GGUF model on ringkv (see model.hpp): the prompt in
// chunks, then greedy generation, each layer through one ringkv::layer_attention; prints the
// generated ids and prefill/decode tokens per second. --parallel serves many (serve.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../parse_count.hpp"
#include "matmul.hpp"
#include "model.hpp"
#include "serve.hpp"

namespace {
void usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: gguf_run --model FILE (--prompt ID,ID,... | --random-prompt N [--seed S] |\n"
      "                --prompts FILE) [--generate N] [--chunk N] [--threads N] [--cache TYPE]\n"
      "                [--parallel N] [--logits FILE] [--decode-prompt] [--gelu-f16]\n"
      "  --prompt         token ids, comma-separated\n"
      "  --random-prompt  N token ids drawn from the vocabulary (seeded by --seed; with\n"
      "                   --parallel P, P prompts of N ids, seeds S, S+1, ...)\n"
      "  --prompts FILE   one prompt a line (ids, comma-separated), served as --parallel\n"
      "  --parallel N     serve the prompts N at a time in one batch (continuous batching:\n"
      "                   each sequence's ids and logits as it would get alone)\n"
      "  --decode-prompt  run the prompt through the decode path, one step a token\n"
      "  --generate N     tokens to generate greedily after the prompt (default 8)\n"
      "  --chunk N        prompt tokens a prefill call (default 64)\n"
      "  --threads N      threads for matrix products and attention (default 1)\n"
      "  --cache TYPE     K/V cache: f32 (default), f16, bf16, fp8 (E4M3), turboquant, int8\n"
      "  --logits FILE    write the logits of every position, f32 little-endian (one sequence)\n"
      "                   [positions, vocab], prompt then generated tokens\n"
      "  --gelu-f16       gemma3: GELU through an f16 table, as llama.cpp's CPU backend\n");
}

/// Token ids separated by single commas into `out`; false (out partly filled) on anything else.
bool parse_ids(const std::string& s, std::vector<std::int32_t>& out) {
  for (std::size_t p = 0; p <= s.size();) {
    const std::size_t q = std::min(s.find(',', p), s.size());
    std::size_t id = 0;
    if (!parse_count(s.substr(p, q - p).c_str(), id) || id >= (1u << 31)) return false;
    out.push_back(static_cast<std::int32_t>(id));
    p = q + 1;
  }
  return true;
}

/// N ids drawn from the vocabulary, from `seed`; O(n).
std::vector<std::int32_t> random_ids(std::size_t n, std::size_t seed, std::size_t vocab) {
  std::vector<std::int32_t> ids;
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    ids.push_back(static_cast<std::int32_t>((s >> 33) % vocab));
  }
  return ids;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

int main(int argc, char** argv) {
  std::string model_path, logits_path;
  std::vector<std::int32_t> prompt;
  std::vector<std::vector<std::int32_t>> prompts;
  std::size_t random_prompt = 0, seed = 1, generate = 8, chunk = 64, threads = 1, parallel = 1;
  bool decode_prompt = false;
  gguf_run::run_options opts;
  // A bad option names itself, its value and what it takes, then the usage.
  const auto bad = [](const std::string& option, const char* value, const std::string& takes) {
    std::fprintf(stderr, "gguf_run: %s%s%s: %s\n", option.c_str(), value ? " " : "",
                 value ? value : "", takes.c_str());
    usage(stderr);
    return 2;
  };
  const std::string count = "takes a whole number";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--gelu-f16") {
      opts.gelu_f16_table = true;
      continue;
    }
    if (a == "--decode-prompt") {
      decode_prompt = true;
      continue;
    }
    const bool known = a == "--model" || a == "--logits" || a == "--random-prompt" ||
                       a == "--seed" || a == "--generate" || a == "--chunk" || a == "--threads" ||
                       a == "--cache" || a == "--prompt" || a == "--parallel" || a == "--prompts";
    if (!known) return bad(a, nullptr, "is not an option");
    const char* v = i + 1 < argc ? argv[++i] : nullptr;
    if (v == nullptr) return bad(a, nullptr, "needs a value");
    if (a == "--model") {
      model_path = v;
    } else if (a == "--logits") {
      logits_path = v;
    } else if (a == "--random-prompt") {
      if (!parse_count(v, random_prompt, 1)) return bad(a, v, count + " >= 1");
    } else if (a == "--seed") {
      if (!parse_count(v, seed)) return bad(a, v, count);
    } else if (a == "--generate") {
      if (!parse_count(v, generate)) return bad(a, v, count);
    } else if (a == "--chunk") {
      if (!parse_count(v, chunk, 1)) return bad(a, v, count + " >= 1");
    } else if (a == "--threads") {
      if (!parse_count(v, threads, 1)) return bad(a, v, count + " >= 1");
    } else if (a == "--cache") {
      const auto t = gguf_run::parse_cache_type(v);
      if (!t) return bad(a, v, "takes f32, f16, bf16, fp8, turboquant or int8");
      opts.cache = *t;
    } else if (a == "--parallel") {
      if (!parse_count(v, parallel, 1, 4096)) return bad(a, v, count + " in [1, 4096]");
    } else if (a == "--prompts") {
      std::ifstream in(v);
      if (!in) return bad(a, v, "cannot be opened");
      std::size_t line_number = 0;
      for (std::string line; std::getline(in, line);) {
        ++line_number;
        if (line.empty()) continue;
        prompts.emplace_back();
        if (!parse_ids(line, prompts.back()))
          return bad(a, v,
                     "line " + std::to_string(line_number) +
                         ": takes token ids separated by single commas");
      }
      if (prompts.empty()) return bad(a, v, "holds no prompt");
    } else {  // --prompt
      if (!parse_ids(v, prompt)) return bad(a, v, "takes token ids separated by single commas");
    }
  }
  if (model_path.empty()) return bad("--model", nullptr, "is required");
  if (int(!prompt.empty()) + int(random_prompt > 0) + int(!prompts.empty()) != 1)
    return bad("--prompt / --random-prompt / --prompts", nullptr,
               "exactly one of them is required");
  const bool serving = parallel > 1 || !prompts.empty();
  if (serving && !logits_path.empty())
    return bad("--logits", logits_path.c_str(), "writes one sequence's logits, not --parallel's");
  if (serving && decode_prompt)
    return bad("--decode-prompt", nullptr, "is for one sequence, not --parallel");
  try {
    const auto load_start = std::chrono::steady_clock::now();
    const gguf_run::model m = gguf_run::model::from(gguf::file::read(model_path));
    const auto& hp = m.hp;
    if (opts.gelu_f16_table && hp.arch != gguf_run::architecture::gemma3)
      throw std::invalid_argument(std::string("--gelu-f16 is for gemma3 models; this one is ") +
                                  gguf_run::name_of(hp.arch));
    if (random_prompt > 0) prompt = random_ids(random_prompt, seed, hp.vocab);
    opts.threads = threads;
    opts.max_positions = prompt.size() + generate;
    if (serving) {
      if (prompts.empty())
        for (std::size_t i = 0; i < parallel; ++i)
          prompts.push_back(random_prompt > 0 ? random_ids(random_prompt, seed + i, hp.vocab)
                                              : prompt);
      std::size_t longest = 0;
      for (const auto& p : prompts) longest = std::max(longest, p.size());
      opts.max_positions = longest + generate;
      std::printf("gguf_run: %s, %zu prompts, %zu at once, %zu thread%s, chunks of %zu\n",
                  gguf_run::name_of(hp.arch), prompts.size(), parallel, threads,
                  threads == 1 ? "" : "s", chunk);
      gguf_run::serve(m, opts, prompts,
                      {.parallel = parallel, .chunk = chunk, .generate = generate});
      return 0;
    }
    std::size_t sliding = 0;
    for (bool b : hp.sliding) sliding += b;
    std::printf(
        "gguf_run: %s, %zu layers (%zu sliding, window %zu), embd %zu, %zu/%zu heads of "
        "%zu, ff %zu, vocab %zu; loaded in %.3f s\n",
        gguf_run::name_of(hp.arch), hp.layers, sliding, hp.window, hp.embd, hp.heads, hp.kv_heads,
        hp.head_dim, hp.ff, hp.vocab, seconds_since(load_start));
    std::printf("gguf_run: %s K/V cache, %zu thread%s, chunks of %zu, matmul target %s\n",
                gguf_run::name_of(opts.cache), threads, threads == 1 ? "" : "s", chunk,
                gguf_run::matmul_target());
    gguf_run::runner r(m, opts);
    std::vector<float> logits((prompt.size() + generate) * hp.vocab);
    const auto prefill_start = std::chrono::steady_clock::now();
    // --decode-prompt: the prompt through the decode path, one step a token (teacher forcing).
    const std::size_t step = decode_prompt ? 1 : chunk;
    for (std::size_t p = 0; p < prompt.size(); p += step) {
      const std::size_t n = std::min(step, prompt.size() - p);
      if (decode_prompt) {
        r.decode(prompt[p], std::span(logits).subspan(p * hp.vocab, hp.vocab));
        continue;
      }
      r.prefill(std::span(prompt).subspan(p, n),
                std::span(logits).subspan(p * hp.vocab, n * hp.vocab));
    }
    const double prefill_s = seconds_since(prefill_start);
    const double prefill_attention = r.attention_seconds();
    std::vector<std::int32_t> generated;
    const auto decode_start = std::chrono::steady_clock::now();
    for (std::size_t g = 0; g < generate; ++g) {
      const std::size_t p = prompt.size() + g;
      const auto prev = std::span(logits).subspan((p - 1) * hp.vocab, hp.vocab);
      const std::int32_t next = gguf_run::argmax(prev);
      generated.push_back(next);
      r.decode(next, std::span(logits).subspan(p * hp.vocab, hp.vocab));
    }
    const double decode_s = seconds_since(decode_start);
    const double decode_attention = r.attention_seconds() - prefill_attention;
    std::printf("generated:");
    for (auto t : generated) std::printf(" %d", t);
    std::printf("\n");
    std::printf("prefill: %zu tokens in %.3f s, %.1f tok/s (attention %.1f%%)\n", prompt.size(),
                prefill_s, double(prompt.size()) / prefill_s,
                100.0 * prefill_attention / prefill_s);
    if (generate > 0)
      std::printf("decode: %zu tokens in %.3f s, %.1f tok/s (attention %.1f%%)\n", generate,
                  decode_s, double(generate) / decode_s, 100.0 * decode_attention / decode_s);
    if (!logits_path.empty()) {
      std::ofstream out(logits_path, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(logits.data()),
                static_cast<std::streamsize>(logits.size() * sizeof(float)));
      out.close();
      if (!out) throw std::runtime_error("cannot write " + logits_path);
      std::printf("logits: %zu positions x %zu written to %s\n", prompt.size() + generate, hp.vocab,
                  logits_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_run: %s\n", e.what());
    return 1;
  }
  return 0;
}
