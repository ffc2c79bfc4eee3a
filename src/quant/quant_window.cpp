// compressed_window (the window over codes, as runs with absolute positions) and the row codec
// every reader of compressed rows shares: bit packing and decoding one row.
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
    for (const compressed_view& v : w.runs()) {
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

compressed_window::compressed_window(const compressed_format& format,
                                     std::span<const compressed_run> runs)
    : format_(format) {
  for (const compressed_run& r : runs) {
    if (r.view.positions == 0) continue;
    if (count_ == max_runs)
      throw std::invalid_argument("ringkv::compressed_window: more than " +
                                  std::to_string(max_runs) + " runs");
    if (count_ > 0 && r.first_position < end_position())
      throw std::invalid_argument("ringkv::compressed_window: run " + std::to_string(count_) +
                                  " starts at position " + std::to_string(r.first_position) +
                                  ", before the previous run ends (" +
                                  std::to_string(end_position()) + ")");
    views_[count_] = r.view;
    starts_[count_++] = r.first_position;
    length_ += r.view.positions;
  }
}

std::size_t compressed_window::run_first_position(std::size_t i) const {
  if (i >= count_)
    throw std::out_of_range("ringkv::compressed_window::run_first_position: run " +
                            std::to_string(i) + " of " + std::to_string(count_));
  return starts_[i];
}

const compressed_view& compressed_window::head() const {
  if (count_ == 0) throw std::out_of_range("ringkv::compressed_window::head: the window is empty");
  return views_[0];
}

bool compressed_window::wrapped() const noexcept {
  for (std::size_t i = 1; i < count_; ++i)
    if (starts_[i] == starts_[i - 1] + views_[i - 1].positions) return true;
  return false;
}

void compressed_window::decode(std::size_t i, std::size_t h, std::size_t p,
                               std::span<float> out) const {
  if (i >= count_ || h >= format_.heads || p >= views_[i].positions ||
      out.size() != format_.head_dim)
    throw std::out_of_range("ringkv::compressed_window::decode: run " + std::to_string(i) + " of " +
                            std::to_string(count_) + ", head " + std::to_string(h) + " of " +
                            std::to_string(format_.heads) + ", position " + std::to_string(p) +
                            ", out of " + std::to_string(out.size()) + " floats (head_dim " +
                            std::to_string(format_.head_dim) + ")");
  codec::decode_row(codec::format_of(format_), h, codec::run_of(views_[i], starts_[i]), p,
                    out.data());
}

}  // namespace ringkv
