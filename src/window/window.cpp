module;
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "quant/quant_codec.h"
module ringkv.window;

namespace ringkv {

windowed_kv::windowed_kv(tensor_view head, std::size_t first_position) {
  add(head, first_position);
}

windowed_kv::windowed_kv(tensor_view head, std::optional<tensor_view> tail,
                         std::size_t first_position) {
  add(head, first_position);
  if (tail) add(*tail, first_position + head.positions());
}

windowed_kv::windowed_kv(std::span<const kv_run> runs) {
  // Empty runs are dropped, so only add() can tell whether there are too many.
  for (const kv_run& r : runs) add(r.view, r.first_position);
}

windowed_kv::windowed_kv(const compressed_format& format, std::span<const compressed_run> runs)
    : format_(format), compressed_(true) {
  for (const compressed_run& r : runs) {
    if (r.view.positions == 0) continue;
    add_start(r.first_position, r.view.positions);
    codes_[count_++] = r.view;
  }
}

void windowed_kv::add_start(std::size_t first_position, std::size_t positions) {
  if (count_ > 0 && first_position < end_position())
    throw std::invalid_argument("ringkv::windowed_kv: run " + std::to_string(count_) +
                                " starts at position " + std::to_string(first_position) +
                                ", before the previous run ends (" +
                                std::to_string(end_position()) + ")");
  if (count_ == max_runs)
    throw std::invalid_argument("ringkv::windowed_kv: more than " + std::to_string(max_runs) +
                                " runs");
  starts_[count_] = first_position;
  counts_[count_] = positions;
  length_ += positions;
}

kv_encoding windowed_kv::encoding() const noexcept {
  if (!compressed_) return encoding_of(type());
  switch (format_.kind) {
    case compression::int8:
      return kv_encoding::int8;
    case compression::turboquant:
      return kv_encoding::turboquant;
  }
  return kv_encoding::turboquant;  // unreachable: every compression has its case
}

void windowed_kv::decode(std::size_t i, std::size_t h, std::size_t p, std::span<float> out) const {
  if (i >= count_ || h >= heads() || p >= counts_[i] || out.size() != head_dim())
    throw std::out_of_range("ringkv::windowed_kv::decode: run " + std::to_string(i) + " of " +
                            std::to_string(count_) + ", head " + std::to_string(h) + " of " +
                            std::to_string(heads()) + ", position " + std::to_string(p) +
                            ", out of " + std::to_string(out.size()) + " floats (head_dim " +
                            std::to_string(head_dim()) + ")");
  if (compressed_) {
    codec::decode_row(codec::format_of(format_), h, codec::run_of(codes_[i], starts_[i]), p,
                      out.data());
    return;
  }
  traits_of(type()).decode(out.data(), views_[i].row_bytes(h, p), head_dim());
}

void windowed_kv::add(const tensor_view& v, std::size_t first_position) {
  if (v.positions() == 0) return;
  if (count_ > 0) {
    const tensor_view& first = views_[0];
    if (v.heads() != first.heads() || v.head_dim() != first.head_dim() || v.type() != first.type())
      throw std::invalid_argument(
          "ringkv::windowed_kv: run " + std::to_string(count_) + " is [" +
          std::to_string(v.heads()) + " heads, head_dim " + std::to_string(v.head_dim()) + ", " +
          std::string(name_of(v.type())) + "] but the first run is [" +
          std::to_string(first.heads()) + " heads, head_dim " + std::to_string(first.head_dim()) +
          ", " + std::string(name_of(first.type())) + "]");
  }
  add_start(first_position, v.positions());
  views_[count_++] = v;
}

const tensor_view& windowed_kv::head() const {
  if (count_ == 0 || compressed_)
    throw std::out_of_range("ringkv::windowed_kv::head: the window has no element runs");
  return views_[0];
}

std::optional<tensor_view> windowed_kv::tail() const {
  if (count_ < 2 || compressed_) return std::nullopt;
  return views_[count_ - 1];
}

void windowed_kv::refuse_run(std::size_t i) const {
  throw std::out_of_range("ringkv::windowed_kv::run_first_position: run " + std::to_string(i) +
                          " of " + std::to_string(count_));
}

bool windowed_kv::wrapped() const noexcept {
  for (std::size_t i = 1; i < count_; ++i)
    if (starts_[i] == starts_[i - 1] + counts_[i - 1]) return true;
  return false;
}

std::size_t windowed_kv::bytes() const noexcept {
  if (compressed_) {
    const compressed_format& f = format_;
    const std::size_t per_row =
        f.code_bytes + sizeof(float) + (f.qjl ? f.sign_bytes + sizeof(float) : 0);
    return length_ * f.heads * per_row;
  }
  std::size_t bytes = 0;
  for (const tensor_view& run : runs()) bytes += run.bytes();
  return bytes;
}

tensor_view windowed_kv::gather(scope& arena, trace::sink& sink, std::string_view target) const {
  if (count_ == 0) throw std::invalid_argument("ringkv::windowed_kv::gather: the window is empty");
  tensor_view out = arena.allocate_view(type(), heads(), length_, head_dim());
  const std::size_t row_bytes = head_dim() * size_of(type());
  for (std::size_t h = 0; h < heads(); ++h) {
    std::size_t p_out = 0;
    for (std::size_t i = 0; i < count_; ++i)
      for (std::size_t p = 0; p < counts_[i]; ++p, ++p_out) {
        if (compressed_)  // decoded to f32, the type() of a code window
          decode(i, h, p, out.row<float>(h, p_out));
        else
          std::memcpy(out.row_bytes(h, p_out), views_[i].row_bytes(h, p), row_bytes);
      }
  }
  if (sink.enabled()) sink.emit(trace::adapter_inserted{"gather-kv-window", target, out.bytes()});
  return out;
}

windowed_kv windowed_kv::gathered(scope& arena, trace::sink& sink, std::string_view target) const {
  // A gathered window with a sink gap keeps its two position ranges as two runs of one buffer.
  const tensor_view all = gather(arena, sink, target);
  std::array<kv_run, max_runs> runs{};
  std::size_t n = 0, offset = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    const bool continues = i > 0 && starts_[i] == starts_[i - 1] + counts_[i - 1];
    if (continues) {
      runs[n - 1].view = all.slice(offset - runs[n - 1].view.positions(),
                                   runs[n - 1].view.positions() + counts_[i]);
    } else {
      runs[n++] = kv_run{all.slice(offset, counts_[i]), starts_[i]};
    }
    offset += counts_[i];
  }
  return windowed_kv(std::span<const kv_run>(runs.data(), n));
}

}  // namespace ringkv
