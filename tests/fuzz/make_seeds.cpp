// Writes the load target's seed snapshots (tests/fuzz/seeds/snapshot_load/) into the folder
// given: small stores of each kind and shape the format has (dense, ring, wrapped, keep, slack
// after a truncate, f16/bf16, TurboQuant with and without QJL, int8). Run by hand when the format changes: scripts/fuzz --seeds.
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
  ringkv::turboquant_kv_cache_store turbo({1, 2, 4, 3}, {.key_bits = 3, .qjl = true},
                                          {.sliding_window = true});
  ringkv::int8_kv_cache_store int8({2, 1, 3, 4}, {.sliding_window = true, .keep = 1});
  std::vector<float> k(8), v(8);
  for (std::size_t t = 0; t < 7; ++t) {
    for (std::size_t i = 0; i < 8; ++i) k[i] = float(t + i) - 3.5f, v[i] = float(i) - float(t);
    turbo.append(0, k, v);
    for (std::size_t l = 0; l < 2; ++l)
      int8.append(l, std::span<const float>(k).first(3), std::span<const float>(v).first(3));
  }
  ringkv::save(turbo, dir / "turboquant-qjl-wrapped");
  ringkv::save(int8, dir / "int8-keep-wrapped");
  return 0;
}
