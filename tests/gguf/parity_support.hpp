// Shared by the GGUF suites: the models they make, prompts, the ways a prompt is fed to the
// runner, and the distance of two logit sets (log-softmax, per position range).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "maker.hpp"
#include "model.hpp"

namespace parity {

using gguf_run::architecture;

/// A model the suites make, written once to a temporary folder.
struct test_model {
  std::string name;
  gguf_run::model_spec spec;
  std::string path;
};

/// Per architecture: windows 4 to 32, GQA and MHA, 2 to 4 layers, global layers among them.
inline std::vector<test_model>& models(architecture a) {
  static std::map<architecture, std::vector<test_model>> all;
  auto& list = all[a];
  if (!list.empty()) return list;
  const bool g = a == architecture::granite_swa;
  auto spec = [&](std::size_t layers, std::size_t heads, std::size_t kv, std::size_t dim,
                  std::size_t window, std::vector<bool> sliding, std::size_t period,
                  std::uint64_t seed) {
    gguf_run::model_spec s;
    s.arch = a;
    s.layers = layers;
    s.heads = heads;
    s.kv_heads = kv;
    s.head_dim = dim;
    s.window = window;
    if (g) s.sliding = std::move(sliding);
    s.period = period;
    s.seed = seed;
    return s;
  };
  // granite: per-layer pattern; gemma3: every period-th layer global.
  list.push_back({"2 layers, GQA 4:1, window 4", spec(2, 4, 1, 16, 4, {true, false}, 2, 11), ""});
  list.push_back(
      {"3 layers, MHA 4, window 13", spec(3, 4, 4, 16, 13, {true, true, false}, 3, 12), ""});
  list.push_back(
      {"4 layers, GQA 8:2, window 32", spec(4, 8, 2, 8, 32, {true, false, true, true}, 2, 13), ""});
  // The output is token_embd with entries in ±5: logits of 100-200, a tied-embedding model's size.
  gguf_run::model_spec tied = spec(3, 4, 2, 16, 8, {true, true, false}, 3, 14);
  tied.tied = true;
  tied.embedding_range = 5.0f;
  list.push_back({"3 layers, tied, large logits", tied, ""});
  const auto dir =
      std::filesystem::temp_directory_path() / ("ringkv_gguf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (std::size_t i = 0; i < list.size(); ++i) {
    list[i].path =
        (dir / (std::string(gguf_run::name_of(a)) + "_" + std::to_string(i) + ".gguf")).string();
    gguf_run::make_model(list[i].spec).write(list[i].path);
  }
  return list;
}

/// n token ids below `vocab`, the same for the same seed.
inline std::vector<std::int32_t> prompt(std::size_t n, std::size_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> t(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 7;
  for (auto& x : t) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<std::int32_t>((s >> 33) % vocab);
  }
  return t;
}

/// How a prompt reaches the runner.
enum class feed { one_chunk, uneven_chunks, token_by_token, prefill_then_decode };

inline const char* name_of(feed f) {
  switch (f) {
    case feed::one_chunk:
      return "one chunk";
    case feed::uneven_chunks:
      return "uneven chunks";
    case feed::token_by_token:
      return "token by token";
    case feed::prefill_then_decode:
      return "prefill then decode";
  }
  return "?";
}

/// The runner's logits of every position of `tokens`, fed as `f` says.
inline std::vector<float> run(const gguf_run::model& m, std::span<const std::int32_t> tokens,
                              feed f, gguf_run::run_options o = {}) {
  o.max_positions = std::max<std::size_t>(o.max_positions, tokens.size());
  gguf_run::runner r(m, o);
  const std::size_t V = m.hp.vocab, n = tokens.size();
  std::vector<float> out(n * V);
  auto logits = [&](std::size_t p, std::size_t count) {
    return std::span(out).subspan(p * V, count * V);
  };
  if (f == feed::one_chunk) {
    r.prefill(tokens, logits(0, n));
  } else if (f == feed::uneven_chunks) {
    static constexpr std::size_t sizes[] = {1, 7, 3, 19, 2, 33, 5, 64};
    for (std::size_t p = 0, i = 0; p < n; ++i) {
      const std::size_t c = std::min(sizes[i % std::size(sizes)], n - p);
      r.prefill(tokens.subspan(p, c), logits(p, c));
      p += c;
    }
  } else {
    const std::size_t first = f == feed::token_by_token ? 0 : n / 2;
    r.prefill(tokens.first(first), logits(0, first));
    for (std::size_t p = first; p < n; ++p) r.decode(tokens[p], logits(p, 1));
  }
  return out;
}

inline void log_softmax(std::span<const float> l, std::vector<double>& out) {
  const double m = *std::max_element(l.begin(), l.end());
  double s = 0.0;
  for (float x : l) s += std::exp(double(x) - m);
  const double lse = m + std::log(s);
  out.resize(l.size());
  for (std::size_t i = 0; i < l.size(); ++i) out[i] = double(l[i]) - lse;
}

/// Largest |log_softmax(a) - log_softmax(b)| over the positions [from, to), each position's
/// divided by max(1, its largest |a|): rounding errors grow with the logits' size (NaN if any is).
inline double distance(std::span<const float> a, std::span<const float> b, std::size_t vocab,
                       std::size_t from, std::size_t to) {
  double worst = 0.0;
  std::vector<double> la, lb;
  for (std::size_t p = from; p < to; ++p) {
    const std::span<const float> row = a.subspan(p * vocab, vocab);
    log_softmax(row, la);
    log_softmax(b.subspan(p * vocab, vocab), lb);
    double size = 1.0;
    for (const float x : row) size = std::max(size, double(std::abs(x)));
    for (std::size_t i = 0; i < vocab; ++i) {
      const double d = std::abs(la[i] - lb[i]) / size;
      if (!(d <= worst)) worst = d;  // NaN sticks
    }
  }
  return worst;
}

/// Largest |logit| of `a` over the positions [from, to).
inline double largest_logit(std::span<const float> a, std::size_t vocab, std::size_t from,
                            std::size_t to) {
  double largest = 0.0;
  for (const float x : a.subspan(from * vocab, (to - from) * vocab))
    largest = std::max(largest, double(std::abs(x)));
  return largest;
}

}  // namespace parity
