// Arbitrary bytes to ringkv::load: every input is refused with snapshot_error or loads a store
// whose snapshot is exactly those bytes again (the format has one encoding per store state).
// Stores are limited to 64 MiB of buffers so a forged header cannot exhaust memory.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

import ringkv;

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::istringstream in(bytes, std::ios::binary);
  std::unique_ptr<ringkv::kv_cache_store> store;
  try {
    store = ringkv::load(in, ringkv::trace::null_sink(), std::size_t(64) << 20);
  } catch (const ringkv::snapshot_error& e) {
    fuzz::require(e.offset() <= size, "a refusal's offset lies past the input");
    return 0;
  }
  std::ostringstream out(std::ios::binary);
  ringkv::save(*store, out);
  const std::string again = out.str();
  fuzz::require(bytes.compare(0, again.size(), again) == 0,
                "a loaded snapshot saves to other bytes");
  // The stream overload stops at the checksum; whatever follows belongs to the caller.
  return 0;
}
