module;
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
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
    if (first_position < end_position())
      throw std::invalid_argument("ringkv::windowed_kv: run " + std::to_string(count_) +
                                  " starts at position " + std::to_string(first_position) +
                                  ", before the previous run ends (" +
                                  std::to_string(end_position()) + ")");
  }
  if (count_ == max_runs)
    throw std::invalid_argument("ringkv::windowed_kv: more than " + std::to_string(max_runs) +
                                " runs");
  views_[count_] = v;
  starts_[count_] = first_position;
  ++count_;
  length_ += v.positions();
}

const tensor_view& windowed_kv::head() const {
  if (count_ == 0) throw std::out_of_range("ringkv::windowed_kv::head: the window is empty");
  return views_[0];
}

std::optional<tensor_view> windowed_kv::tail() const {
  if (count_ < 2) return std::nullopt;
  return views_[count_ - 1];
}

void windowed_kv::refuse_run(std::size_t i) const {
  throw std::out_of_range("ringkv::windowed_kv::run_first_position: run " + std::to_string(i) +
                          " of " + std::to_string(count_));
}

bool windowed_kv::wrapped() const noexcept {
  for (std::size_t i = 1; i < count_; ++i)
    if (starts_[i] == starts_[i - 1] + views_[i - 1].positions()) return true;
  return false;
}

tensor_view windowed_kv::gather(scope& arena, trace::sink& sink, std::string_view target) const {
  if (count_ == 0) throw std::invalid_argument("ringkv::windowed_kv::gather: the window is empty");
  tensor_view out = arena.allocate_view(type(), heads(), length_, head_dim());
  const std::size_t row_bytes = head_dim() * size_of(type());
  for (std::size_t h = 0; h < heads(); ++h) {
    std::size_t p_out = 0;
    for (const tensor_view& run : runs())
      for (std::size_t p = 0; p < run.positions(); ++p, ++p_out)
        std::memcpy(out.row_bytes(h, p_out), run.row_bytes(h, p), row_bytes);
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
    const bool continues = i > 0 && starts_[i] == starts_[i - 1] + views_[i - 1].positions();
    if (continues) {
      runs[n - 1].view = all.slice(offset - runs[n - 1].view.positions(),
                                   runs[n - 1].view.positions() + views_[i].positions());
    } else {
      runs[n++] = kv_run{all.slice(offset, views_[i].positions()), starts_[i]};
    }
    offset += views_[i].positions();
  }
  return windowed_kv(std::span<const kv_run>(runs.data(), n));
}

}  // namespace ringkv
