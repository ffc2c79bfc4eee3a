// The compressed stores' code windows over their slot runs, and a code window decoded whole.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include "quant_codec.h"
module ringkv.quant;

namespace ringkv {
namespace detail {

void decode_window(const compressed_window& w, std::span<float> out) noexcept {
  const std::size_t d = w.head_dim();
  const codec::rows_format f = codec::format_of(w.format());
  float* dst = out.data();
  for (std::size_t h = 0; h < w.heads(); ++h)
    for (const compressed_view& v : w.code_runs()) {
      const codec::rows_run run = codec::run_of(v, 0);
      for (std::size_t p = 0; p < v.positions; ++p, dst += d) codec::decode_row(f, h, run, p, dst);
    }
}

compressed_window window_over(const compressed_format& f,
                              std::span<const slotted_kv_cache_store::slot_run> slots,
                              std::size_t head_stride, const std::byte* codes, const float* scales,
                              const std::byte* signs, const float* residual_norms) {
  std::array<compressed_run, compressed_window::max_runs> runs{};
  for (std::size_t i = 0; i < slots.size(); ++i)
    runs[i] = {compressed_view{codes, scales, signs, residual_norms, slots[i].count, head_stride,
                               slots[i].slot},
               slots[i].first_position};
  return compressed_window(f, std::span<const compressed_run>(runs.data(), slots.size()));
}

}  // namespace detail

}  // namespace ringkv
