// Writes the load target's seed snapshots (tests/fuzz/seeds/snapshot_load/) into the folder
// given: small stores of each shape the format has (dense, ring, wrapped, keep, slack after a
// truncate, f16/bf16). Run by hand when the format changes: scripts/fuzz --seeds.
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

import ringkv;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds FOLDER\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  struct seed {
    const char* name;
    ringkv::kv_cache_config config;
    ringkv::store_options options;
    std::size_t tokens;
  };
  const seed seeds[] = {
      {"dense-empty", {1, 1, 2, 3}, {}, 0},
      {"dense-partial", {2, 1, 2, 4}, {}, 3},
      {"ring-wrapped", {1, 2, 2, 4}, {.sliding_window = true}, 11},
      {"ring-keep", {2, 1, 3, 5}, {.sliding_window = true, .keep = 2}, 13},
      {"ring-slack-f16-bf16",
       {1, 1, 2, 6, ringkv::dtype::f16, ringkv::dtype::bf16},
       {.sliding_window = true, .keep = 1, .slack = 2},
       17},
  };
  for (const seed& s : seeds) {
    ringkv::default_kv_cache_store store(s.config, s.options);
    std::vector<float> k(s.config.row_floats()), v(k.size());
    for (std::size_t t = 0; t < s.tokens; ++t)
      for (std::size_t l = 0; l < s.config.layers; ++l) {
        for (std::size_t i = 0; i < k.size(); ++i) k[i] = float(t * 8 + i) / 4, v[i] = -k[i];
        store.append(l, k, v);
      }
    if (s.options.slack > 0) store.truncate(0, store.length(0) - 2);
    ringkv::save(store, dir / s.name);
  }
  return 0;
}
