// The module table of docs/design.md, for ringkv.store: this file imports that module alone, so
// it compiles only while ringkv.store itself exports what the table lists there — the config, the
// store interface, the default store (dense or ring), its memory report, and snapshot save/load.
#define BOOST_TEST_MODULE store_module
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

import ringkv.store;

namespace {
std::vector<float> held(const ringkv::kv_cache_store& s, bool keys) {
  const std::size_t from = s.window_start(0), to = s.length(0);
  std::vector<float> out((to - from) * s.config().kv_heads * s.config().head_dim);
  if (keys)
    s.read_keys(0, from, to, out);
  else
    s.read_values(0, from, to, out);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(ringkv_store_alone_saves_and_loads_a_wrapped_ring) {
  const ringkv::kv_cache_config c{.layers = 1, .kv_heads = 1, .head_dim = 2, .capacity = 3};
  ringkv::default_kv_cache_store store(c, {.sliding_window = true});
  for (int t = 0; t < 5; ++t) {
    const std::vector<float> k{float(t), 0.5f}, v{-float(t), 0.25f};
    store.append(0, k, v);
  }
  BOOST_TEST(store.window_start(0) == 2u);  // wrapped: positions 2, 3, 4 held
  std::stringstream bytes;
  ringkv::save(store, bytes);
  const std::unique_ptr<ringkv::kv_cache_store> back = ringkv::load(bytes);
  BOOST_TEST(back->length(0) == 5u);
  BOOST_TEST(back->window_start(0) == 2u);
  BOOST_TEST(held(*back, true) == (std::vector<float>{2, 0.5f, 3, 0.5f, 4, 0.5f}),
             boost::test_tools::per_element());
  BOOST_TEST(held(*back, false) == (std::vector<float>{-2, 0.25f, -3, 0.25f, -4, 0.25f}),
             boost::test_tools::per_element());
  BOOST_TEST(back->memory().physical_bytes == store.memory().physical_bytes);
  std::istringstream junk(std::string("not a snapshot"));
  BOOST_CHECK_EXCEPTION(
      ringkv::load(junk), ringkv::snapshot_error, [](const ringkv::snapshot_error& e) {
        return std::string(e.what()).find("wrong magic") != std::string::npos && e.offset() == 0;
      });
}
