// The streaming-decode demo: a tiny synthetic transformer (seeded random weights) whose layers
// keep their K/V in ringkv rings and attend them through ringkv::layer_decoder, one per layer:
// layer l's q, k, v come from layer l - 1's output of the same token, so each layer takes one
// step a token (a pull stream per layer would need a mailbox token source; ringkv::decode is for
// a single stream).
// Layers alternate local sliding windows with a wider one on every 4th layer (Gemma 3 style);
// each ring's capacity is its window, so with the default 512 tokens every ring wraps many times.
// Each output is fed back as the next input. Run with --help for the options.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "parse_count.hpp"

import ringkv;

namespace {
constexpr std::size_t d_model = 256, q_heads = 8, kv_heads = 2, head_dim = 32;

struct settings {
  std::size_t tokens = 512, window = 64, layers = 4;
  std::string trace_file;
  bool gather = false;
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: stream_decode [--tokens N] [--window W] [--layers L] [--trace FILE] "
               "[--gather] [--help]\n"
               "  --tokens N    tokens to stream (default 512)\n"
               "  --window W    sliding window of the local layers (default 64); every 4th layer\n"
               "                uses 4*W; each layer's ring holds exactly its window\n"
               "  --layers L    layers (default 4)\n"
               "  --trace FILE  write a Chrome trace JSON of the run (open it in Perfetto UI)\n"
               "  --gather      copy every window into one run first (the traced adapter path)\n");
}

// Returns false on a bad command line (the caller prints usage and exits 2).
bool parse(int argc, char** argv, settings& s, bool& help) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h")
      help = true;
    else if (a == "--gather")
      s.gather = true;
    else if (a == "--tokens" && has_value) {
      if (!parse_count(argv[++i], s.tokens, 1, 1ull << 24)) return false;
    } else if (a == "--window" && has_value) {
      if (!parse_count(argv[++i], s.window, 1, 1ull << 24)) return false;
    } else if (a == "--layers" && has_value) {
      if (!parse_count(argv[++i], s.layers, 1, 1ull << 24)) return false;
    } else if (a == "--trace" && has_value)
      s.trace_file = argv[++i];
    else
      return false;
  }
  return true;
}

// Row-major [rows, cols] weights drawn from N(0, 1/cols), so activations keep their scale.
struct matrix {
  std::size_t rows, cols;
  std::vector<float> w;
  matrix(std::size_t r, std::size_t c, std::mt19937& rng) : rows(r), cols(c), w(r * c) {
    std::normal_distribution<float> n(0.0f, 1.0f / std::sqrt(float(c)));
    for (float& x : w) x = n(rng);
  }
  void apply(std::span<const float> in, std::span<float> out) const {
    for (std::size_t r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (std::size_t c = 0; c < cols; ++c) acc += w[r * cols + c] * in[c];
      out[r] = acc;
    }
  }
};

void rms_norm(std::span<const float> in, std::span<float> out) {
  float ss = 0.0f;
  for (float x : in) ss += x * x;
  const float inv = 1.0f / std::sqrt(ss / float(in.size()) + 1e-6f);
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] * inv;
}

// RoPE at an absolute position: keys are stored already rotated, which is why ringkv keeps
// positions absolute even after the ring has wrapped many times.
void rope(std::span<float> x, std::size_t position) {
  constexpr std::size_t half = head_dim / 2;
  for (std::size_t h = 0; h < x.size() / head_dim; ++h) {
    float* v = x.data() + h * head_dim;
    for (std::size_t i = 0; i < half; ++i) {
      const double theta = double(position) * std::pow(10000.0, -2.0 * double(i) / head_dim);
      const float c = float(std::cos(theta)), s = float(std::sin(theta));
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = a * s + b * c;
    }
  }
}

struct layer {
  std::size_t window;
  matrix wq, wk, wv, wo;
  std::unique_ptr<ringkv::default_kv_cache_store> store;
  std::vector<float> q, k, v, row;  // [q_heads*head_dim], [kv_heads*head_dim] x2, like q
  ringkv::layer_decoder decoder;

  layer(std::size_t w, std::mt19937& rng, ringkv::trace::sink& sink, bool gather)
      : window(w), wq(q_heads * head_dim, d_model, rng), wk(kv_heads * head_dim, d_model, rng),
        wv(kv_heads * head_dim, d_model, rng), wo(d_model, q_heads * head_dim, rng),
        store(std::make_unique<ringkv::default_kv_cache_store>(
            ringkv::kv_cache_config{
                .layers = 1, .kv_heads = kv_heads, .head_dim = head_dim, .capacity = w},
            ringkv::store_options{.sliding_window = true}, sink)),
        q(q_heads * head_dim), k(kv_heads * head_dim), v(kv_heads * head_dim),
        row(q_heads * head_dim), decoder(*store, 0, {.window = w, .gather = gather}, sink) {}

  // One token through this layer: x += W_o · attention(rope(W_q h), rope(W_k h), W_v h).
  void forward(std::span<float> x, std::span<float> h, std::span<float> o, std::size_t pos) {
    rms_norm(x, h);
    wq.apply(h, q);
    wk.apply(h, k);
    wv.apply(h, v);
    rope(q, pos);
    rope(k, pos);
    decoder.step({q, k, v}, row);  // appends k, v and attends q over the window
    wo.apply(row, o);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  }
};

/// Passes every event on to the recorder and counts allocations and copies as they come: the
/// recorder keeps only its newest events, so counting what it still holds could miss some.
class counting_sink final : public ringkv::trace::sink {
 public:
  explicit counting_sink(ringkv::trace::recorder& rec) noexcept : rec_(&rec) {}
  bool enabled() const noexcept override { return true; }
  bool wants_kernel_runs() const noexcept override { return rec_->wants_kernel_runs(); }
  void emit(const ringkv::trace::event& e) override {
    allocations += std::holds_alternative<ringkv::trace::allocation>(e);
    adapters += std::holds_alternative<ringkv::trace::adapter_inserted>(e);
    rec_->emit(e);
  }
  std::uint64_t allocations = 0, adapters = 0;

 private:
  ringkv::trace::recorder* rec_;
};
}  // namespace

int main(int argc, char** argv) {
  settings s;
  bool help = false;
  if (!parse(argc, argv, s, help)) {
    usage(stderr);
    return 2;
  }
  if (help) {
    usage(stdout);
    return 0;
  }
  // Kernel-run events only when a trace file is asked for; allocations and copies always.
  ringkv::trace::recorder rec(1u << 16, !s.trace_file.empty());
  counting_sink sink(rec);
  std::mt19937 rng(20261129);
  std::vector<std::unique_ptr<layer>> layers;
  for (std::size_t l = 0; l < s.layers; ++l)
    layers.push_back(
        std::make_unique<layer>(l % 4 == 3 ? 4 * s.window : s.window, rng, sink, s.gather));
  std::vector<float> x(d_model), h(d_model), o(d_model);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& e : x) e = n(rng);

  std::printf(
      "ringkv stream_decode: %zu layers, d_model %zu, %zu q heads / %zu kv heads, "
      "head_dim %zu, windows %zu (x4 on every 4th layer), %zu tokens%s\n",
      s.layers, d_model, q_heads, kv_heads, head_dim, s.window, s.tokens,
      s.gather ? ", gather path" : "");
  std::uint64_t allocations_before = 0, adapters_before = 0;
  const auto start = std::chrono::steady_clock::now();
  auto warm = start;
  // Not a multiple of the window, so the lines catch the rings at different phases.
  const std::size_t report_every = std::max<std::size_t>(1, s.tokens / 10);
  for (std::size_t t = 0; t < s.tokens; ++t) {
    for (auto& L : layers) L->forward(x, h, o, t);
    rms_norm(x, h);  // the output, normalised, is the next input
    x.assign(h.begin(), h.end());
    if (t == 0) {  // warm-up: every stream has made its first step
      warm = std::chrono::steady_clock::now();
      allocations_before = sink.allocations;
      adapters_before = sink.adapters;
    }
    if ((t + 1) % report_every == 0 || t + 1 == s.tokens) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const auto& st = *layers[0]->store;
      const auto window = st.key_window(0, st.window_start(0), st.length(0));
      std::printf(
          "  token %5zu  %8.0f tok/s  layer 0 holds [%zu, %zu) as %zu run%s  "
          "ring phase %zu/%zu\n",
          t + 1, double(t + 1) / secs, st.window_start(0), st.length(0), window.runs().size(),
          window.runs().size() == 1 ? "" : "s", st.length(0) % st.config().capacity,
          st.config().capacity);
    }
  }
  const auto end = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(end - start).count();
  const double steady = std::chrono::duration<double>(end - warm).count();
  std::size_t held = 0;
  for (auto& L : layers) held += L->store->memory().physical_bytes;
  const auto& last = layers.back()->row;
  std::printf("summary: %zu tokens in %.3f s (%.0f tok/s after warm-up)\n", s.tokens, secs,
              s.tokens > 1 ? double(s.tokens - 1) / steady : 0.0);
  std::printf("summary: allocations after warm-up: %llu, adapters after warm-up: %llu\n",
              (unsigned long long)(sink.allocations - allocations_before),
              (unsigned long long)(sink.adapters - adapters_before));
  std::printf("summary: KV bytes held: %zu\n", held);
  std::printf("summary: last row of the last layer starts %.6f %.6f %.6f %.6f\n", last[0], last[1],
              last[2], last[3]);
  if (!s.trace_file.empty()) {
    std::ofstream out(s.trace_file);
    ringkv::trace::write_chrome_trace(out, rec);
    if (!out) {
      std::fprintf(stderr, "stream_decode: cannot write %s\n", s.trace_file.c_str());
      return 1;
    }
    std::printf("trace: %llu events written to %s (open in Perfetto UI)\n",
                (unsigned long long)rec.size(), s.trace_file.c_str());
  }
  return 0;
}
