// Arbitrary bytes to the GGUF reader of examples/gguf_run: every input is refused with
// gguf::format_error (its offset inside the input) or parses to a file whose tensors lie inside
// the input; a parsed file's metadata getters refuse or answer, never crash.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = std::byte(data[i]);
  try {
    const gguf::file f(std::move(bytes));
    for (const gguf::tensor_info& t : f.tensors()) {
      if (t.data.size() != t.elements() * gguf::element_size(t.type)) std::abort();
      if (!t.data.empty()) (void)gguf::to_floats(t);
    }
    for (const auto& [key, value] : f.metadata()) {
      try {
        (void)f.get_u32(key);
      } catch (const gguf::format_error&) {}
      try {
        (void)f.get_uint_array(key);
      } catch (const gguf::format_error&) {}
    }
  } catch (const gguf::format_error& e) {
    if (e.offset() > size) {
      std::fprintf(stderr, "a refusal's offset %llu lies past the input (%zu bytes)\n",
                   (unsigned long long)e.offset(), size);
      std::abort();
    }
  }
  return 0;
}
