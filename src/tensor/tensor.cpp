module;
#include <cstddef>
#include <algorithm>
#include <cmath>
#include <string_view>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "kernels/simd.h"
module ringkv.tensor;

namespace ringkv {
namespace {
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// A window streams megabytes: with 4 KiB pages every 4 KiB is a TLB miss, and the hardware
// prefetchers stop at each page. Re-measure: scripts/bench-targets --shapes '^128/4096/8'
std::size_t alignment_for(std::size_t bytes) {
  return bytes >= storage::huge_page ? storage::huge_page : storage::alignment;
}

void advise_huge_pages([[maybe_unused]] std::byte* data, [[maybe_unused]] std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where the kernel has no huge pages the buffer works the same.
  constexpr std::size_t huge = storage::huge_page;
  if (bytes >= huge) ::madvise(data, bytes / huge * huge, MADV_HUGEPAGE);
#endif
}

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument("ringkv::" + what);
}
}  // namespace

bool all_finite(std::span<const float> values) noexcept {
  // Highway's widest target: the compiler's own vectorization of this test stays at SSE2 (the
  // library's baseline), a visible part of a short-window step.
  // Re-measure: RINGKV_BENCH_WINDOWS=16 build/release/bench/attention_bench
  return simd::all_finite(values.data(), values.size());
}

bool overlaps(std::span<const float> a, std::span<const float> b) noexcept {
  // std::less: a total order on pointers into different arrays too.
  const std::less<const float*> before;
  return !a.empty() && !b.empty() && before(a.data(), b.data() + b.size()) &&
         before(b.data(), a.data() + a.size());
}

void require_finite(std::string_view who, std::string_view what, std::span<const float> values) {
  if (all_finite(values)) return;  // the index is searched only on failure
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      refuse(std::string(who) + ": " + std::string(what) + " has a non-finite element (" +
             std::to_string(values[i]) + ") at index " + std::to_string(i) +
             "; NaN and Inf are refused");
}

bool all_storable(std::span<const float> values, dtype type) noexcept {
  const float limit = traits_of(type).unstorable;
  if (limit == std::numeric_limits<float>::infinity()) return true;
  // Highway, as all_finite: the scalar max chain was a visible part of an f16 step.
  // Re-measure: build/release/bench/batch_bench --benchmark_filter='^batch/f16/W:256/kv:2/'
  return simd::all_below(values.data(), values.size(), limit);
}

void require_storable(std::string_view who, std::string_view what, std::span<const float> values,
                      dtype type) {
  if (all_storable(values, type)) return;  // the index is searched only on failure
  const format_traits t = traits_of(type);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (std::fabs(values[i]) >= t.unstorable)
      refuse(std::string(who) + ": " + std::string(what) + "[" + std::to_string(i) +
             "] = " + std::to_string(values[i]) + " is too large for " + std::string(t.name) +
             " (largest finite " + std::string(t.largest) + "; it would round past it)");
}

storage::storage(std::size_t bytes, std::string_view site, trace::sink& sink)
    : site_(site), sink_(&sink) {
  if (bytes == 0) refuse("storage: bytes must be > 0");
  data_ = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{alignment_for(bytes)}));
  bytes_ = bytes;
  advise_huge_pages(data_, bytes);
  std::memset(data_, 0, bytes);
  if (sink.enabled()) sink.emit(trace::allocation{site_, bytes_});
}

storage::~storage() {
  if (data_ == nullptr) return;
  if (sink_->enabled()) sink_->emit(trace::release{site_, bytes_});
  ::operator delete(data_, std::align_val_t{alignment_for(bytes_)});
}

tensor_view::tensor_view(std::byte* data, dtype type, std::size_t heads, std::size_t positions,
                         std::size_t head_dim, std::size_t head_stride, std::size_t position_stride)
    : data_(data), type_(type), heads_(heads), positions_(positions), head_dim_(head_dim),
      head_stride_(head_stride), position_stride_(position_stride) {
  if (heads == 0) refuse("tensor_view: heads must be > 0");
  if (head_dim == 0) refuse("tensor_view: head_dim must be > 0");
  if (positions > 1 && position_stride < head_dim)
    refuse("tensor_view: position_stride " + std::to_string(position_stride) +
           " is smaller than head_dim " + std::to_string(head_dim) + " (rows would overlap)");
  // Heads apart: either each head's rows lie past the previous head's last row ([heads,
  // positions, dim]), or heads interleave within a position ([positions, heads, dim], e.g. a
  // prefill chunk as the caller laid it out).
  const bool head_major = head_stride >= (positions - 1) * position_stride + head_dim;
  const bool position_major =
      head_stride >= head_dim &&
      (positions < 2 || position_stride >= (heads - 1) * head_stride + head_dim);
  if (heads > 1 && positions > 0 && !head_major && !position_major)
    refuse("tensor_view: head_stride " + std::to_string(head_stride) +
           " is smaller than one head's extent (heads would overlap)");
  if (data == nullptr && positions > 0) refuse("tensor_view: data is null for a non-empty view");
}

void tensor_view::check_row(std::size_t h, std::size_t p) const {
  if (h >= heads_ || p >= positions_)
    throw std::out_of_range("ringkv::tensor_view: row (head " + std::to_string(h) + ", position " +
                            std::to_string(p) + ") outside [" + std::to_string(heads_) + ", " +
                            std::to_string(positions_) + ")");
}

tensor_view tensor_view::slice(std::size_t from, std::size_t count) const {
  if (from > positions_ || count > positions_ - from)
    throw std::out_of_range("ringkv::tensor_view::slice: [" + std::to_string(from) + ", " +
                            std::to_string(from + count) + ") outside " +
                            std::to_string(positions_) + " positions");
  tensor_view v = *this;
  v.data_ = data_ + from * position_stride_ * size_of(type_);
  v.positions_ = count;
  return v;
}

scope::scope(std::size_t slab_bytes, trace::sink& sink) : sink_(&sink) {
  if (slab_bytes == 0) refuse("scope: slab_bytes must be > 0");
  slabs_[0] = storage(round_up(slab_bytes, storage::alignment), "scope-slab", sink);
}

std::size_t scope::capacity() const noexcept {
  std::size_t total = 0;
  for (const auto& s : slabs_) total += s.bytes();
  return total;
}

std::span<std::byte> scope::allocate_bytes(std::size_t bytes) {
  if (bytes == 0) refuse("scope::allocate: bytes must be > 0");
  const std::size_t need = round_up(bytes, storage::alignment);
  if (offset_ + need > slabs_[current_].bytes()) {
    std::size_t next = current_ + 1;
    while (next < max_slabs && !slabs_[next].empty() && slabs_[next].bytes() < need) ++next;
    if (next == max_slabs)
      throw std::length_error("ringkv::scope::allocate: more than " + std::to_string(max_slabs) +
                              " slabs; reset() the scope between forwards");
    if (slabs_[next].empty())
      slabs_[next] = storage(std::max(need, 2 * capacity()), "scope-slab", *sink_);
    current_ = next;
    offset_ = 0;
  }
  std::byte* p = slabs_[current_].data() + offset_;
  offset_ += need;
  live_ += need;
  high_water_ = std::max(high_water_, live_);
  return {p, bytes};
}

tensor_view scope::allocate_view(dtype type, std::size_t heads, std::size_t positions,
                                 std::size_t head_dim) {
  if (heads == 0 || positions == 0 || head_dim == 0)
    refuse("scope::allocate_view: heads, positions and head_dim must be > 0 (got " +
           std::to_string(heads) + ", " + std::to_string(positions) + ", " +
           std::to_string(head_dim) + ")");
  auto bytes = allocate(heads * positions * head_dim, type);
  return tensor_view::contiguous(bytes.data(), type, heads, positions, head_dim);
}

void scope::reset(std::size_t at_least) {
  const std::size_t before = live_;
  const bool grown = !slabs_[1].empty();
  if (grown || slabs_[0].bytes() < at_least) {
    // Grown: replace all slabs by one that holds the high-water mark, so the next round of the
    // same work fits without growing. Allocated before the old slabs go: if it throws, the scope
    // is as it was.
    storage slab(round_up(std::max(grown ? high_water_ : 0, at_least), storage::alignment),
                 "scope-slab", *sink_);
    for (auto& s : slabs_) s = storage();
    slabs_[0] = std::move(slab);
  }
  current_ = 0;
  offset_ = 0;
  live_ = 0;
  if (sink_->enabled()) sink_->emit(trace::scope_reset{before, 0});
}

}  // namespace ringkv
