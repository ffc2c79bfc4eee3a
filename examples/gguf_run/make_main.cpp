// gguf_make: writes a random-weight granite_swa or gemma3 GGUF model (see maker.hpp).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "../parse_count.hpp"
#include "maker.hpp"

namespace {
void usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: gguf_make --arch granite_swa|gemma3 --out FILE [--seed N] [--vocab N]\n"
      "                 [--embd N] [--layers N] [--heads N] [--kv-heads N] [--head-dim N]\n"
      "                 [--ff N] [--window N] [--sliding 1,1,0,...] [--period N]\n"
      "                 [--weights f32|f16|bf16]\n"
      "  --sliding  granite_swa: per layer 1 (sliding window) or 0 (global);\n"
      "             default every 4th layer global\n"
      "  --period   gemma3: every N-th layer global (default 2)\n");
}

}  // namespace

int main(int argc, char** argv) {
  gguf_run::model_spec spec;
  std::string out, arch;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    bool ok = v != nullptr;
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (!ok) {
      usage(stderr);
      return 2;
    }
    ++i;
    std::size_t seed = 0;
    if (a == "--arch")
      arch = v;
    else if (a == "--out")
      out = v;
    else if (a == "--seed") {
      ok = parse_count(v, seed);
      spec.seed = seed;
    } else if (a == "--vocab")
      ok = parse_count(v, spec.vocab);
    else if (a == "--embd")
      ok = parse_count(v, spec.embd);
    else if (a == "--layers")
      ok = parse_count(v, spec.layers);
    else if (a == "--heads")
      ok = parse_count(v, spec.heads);
    else if (a == "--kv-heads")
      ok = parse_count(v, spec.kv_heads);
    else if (a == "--head-dim")
      ok = parse_count(v, spec.head_dim);
    else if (a == "--ff")
      ok = parse_count(v, spec.ff);
    else if (a == "--window")
      ok = parse_count(v, spec.window);
    else if (a == "--period")
      ok = parse_count(v, spec.period);
    else if (a == "--sliding") {
      spec.sliding.clear();
      for (const char* p = v; *p; ++p) {
        if (*p == '0' || *p == '1')
          spec.sliding.push_back(*p == '1');
        else if (*p != ',')
          ok = false;
      }
    } else if (a == "--weights") {
      const std::string w = v;
      if (w == "f32")
        spec.weights = gguf::tensor_type::f32;
      else if (w == "f16")
        spec.weights = gguf::tensor_type::f16;
      else if (w == "bf16")
        spec.weights = gguf::tensor_type::bf16;
      else
        ok = false;
    } else
      ok = false;
    if (!ok) {
      usage(stderr);
      return 2;
    }
  }
  if (arch == "granite_swa")
    spec.arch = gguf_run::architecture::granite_swa;
  else if (arch == "gemma3")
    spec.arch = gguf_run::architecture::gemma3;
  else {
    usage(stderr);
    return 2;
  }
  if (out.empty()) {
    usage(stderr);
    return 2;
  }
  try {
    gguf_run::make_model(spec).write(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_make: %s\n", e.what());
    return 1;
  }
  std::printf(
      "gguf_make: wrote %s (%s, %zu layers, embd %zu, %zu/%zu heads of %zu, window %zu, "
      "seed %llu)\n",
      out.c_str(), arch.c_str(), spec.layers, spec.embd, spec.heads, spec.kv_heads, spec.head_dim,
      spec.window, (unsigned long long)spec.seed);
  return 0;
}
