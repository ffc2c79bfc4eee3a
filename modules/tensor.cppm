// ringkv.tensor — element types, traced owning storage, strided rank-3 views, and a bump arena.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
export module ringkv.tensor;
export import ringkv.trace;
export import ringkv.format;

export namespace ringkv {

/// Throws std::invalid_argument ("ringkv::<who>: <what> has a non-finite element (nan) at
/// index i") at the first NaN or ±Inf of `values`; O(n). Keys, values and queries are refused
/// this way: the kernels' exponentials would otherwise turn a NaN score into a silent weight.
void require_finite(std::string_view who, std::string_view what, std::span<const float> values);
/// Whether every element of `values` is finite (no NaN, no ±Inf); O(n), no allocation.
bool all_finite(std::span<const float> values) noexcept;
/// Whether `type` holds every element of finite `values` without rounding one to ±Inf (see
/// require_storable); O(n), no allocation.
bool all_storable(std::span<const float> values, dtype type) noexcept;
/// Throws std::invalid_argument ("ringkv::<who>: <what>[i] = x is too large for f16 ...") at the
/// first element of `values` (finite: require_finite first) that `type` cannot hold, one that
/// rounds past its largest finite value (format_traits::unstorable): |x| >= 65520 for f16,
/// >= 0x1.ffp127 for bf16, > 464 for fp8_e4m3, none for f32. O(n). A store refuses such keys
/// and values as it refuses NaN: stored as ±Inf they would turn attention's output into NaN.
void require_storable(std::string_view who, std::string_view what, std::span<const float> values,
                      dtype type);
/// Whether a and b share an element (empty spans share none); O(1).
bool overlaps(std::span<const float> a, std::span<const float> b) noexcept;

/// Move-only owning buffer, 64-byte aligned and zero-filled, that reports its life to a sink.
/// Buffers of at least `huge_page` bytes start on a huge-page boundary and, on Linux, ask for
/// transparent huge pages (madvise), so streaming a window is not a TLB miss every 4 KiB.
class storage {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t huge_page = std::size_t(2) << 20;

  storage() noexcept = default;
  /// Allocates `bytes` (> 0) and emits allocation{site, bytes}; O(bytes) to zero-fill.
  /// `site` must outlive the sink's use of it (a string literal).
  storage(std::size_t bytes, std::string_view site, trace::sink& sink = trace::null_sink());
  storage(storage&& other) noexcept { swap(other); }
  storage& operator=(storage&& other) noexcept {
    storage(std::move(other)).swap(*this);
    return *this;
  }
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  /// Frees the buffer and emits release{site, bytes}.
  ~storage();

  // The accessors are `inline` for importers to inline them (see tensor_view's).
  inline std::byte* data() noexcept { return data_; }
  inline const std::byte* data() const noexcept { return data_; }
  inline std::size_t bytes() const noexcept { return bytes_; }
  inline bool empty() const noexcept { return data_ == nullptr; }
  /// The buffer as elements of T (bytes / sizeof(T) of them); O(1).
  template <class T>
  inline std::span<T> as() noexcept {
    return {reinterpret_cast<T*>(data_), bytes_ / sizeof(T)};
  }
  template <class T>
  inline std::span<const T> as() const noexcept {
    return {reinterpret_cast<const T*>(data_), bytes_ / sizeof(T)};
  }
  /// Whether `p` points into this buffer; O(1).
  inline bool contains(const void* p) const noexcept {
    auto b = static_cast<const std::byte*>(p);
    return data_ != nullptr && b >= data_ && b < data_ + bytes_;
  }

 private:
  void swap(storage& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(site_, o.site_);
    std::swap(sink_, o.sink_);
  }
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::string_view site_;
  trace::sink* sink_ = nullptr;
};

/// Non-owning view [heads, positions, head_dim] with strides in elements; innermost stride 1,
/// so every row (one head, one position) is contiguous for SIMD.
class tensor_view {
 public:
  tensor_view() noexcept = default;
  /// Checks the shape (heads, head_dim > 0; strides that keep rows apart) and throws
  /// std::invalid_argument naming the argument otherwise; O(1).
  tensor_view(std::byte* data, dtype type, std::size_t heads, std::size_t positions,
              std::size_t head_dim, std::size_t head_stride, std::size_t position_stride);
  /// A densely packed view (position stride head_dim, head stride positions * head_dim); O(1).
  static tensor_view contiguous(std::byte* data, dtype type, std::size_t heads,
                                std::size_t positions, std::size_t head_dim) {
    return {data, type, heads, positions, head_dim, positions * head_dim, head_dim};
  }

  // `inline` on purpose: in a named module a member defined in its class is not implicitly
  // inline, and clang calls these across the module boundary, a visible part of a short-window
  // step. Re-measure: RINGKV_BENCH_WINDOWS=16 build/release/bench/attention_bench
  inline std::byte* data() const noexcept { return data_; }
  inline dtype type() const noexcept { return type_; }
  inline std::size_t heads() const noexcept { return heads_; }
  inline std::size_t positions() const noexcept { return positions_; }
  inline std::size_t head_dim() const noexcept { return head_dim_; }
  inline std::size_t head_stride() const noexcept { return head_stride_; }
  inline std::size_t position_stride() const noexcept { return position_stride_; }
  inline std::size_t element_bytes() const noexcept { return size_of(type_); }
  /// Bytes of the elements the view covers (not counting gaps between rows); O(1).
  inline std::size_t bytes() const noexcept {
    return heads_ * positions_ * head_dim_ * size_of(type_);
  }

  /// Start of row (head h, position p) as raw bytes; bounds-checked in debug builds; O(1).
  std::byte* row_bytes(std::size_t h, std::size_t p) const {
#ifndef NDEBUG
    check_row(h, p);
#endif
    return data_ + (h * head_stride_ + p * position_stride_) * size_of(type_);
  }
  /// Row (h, p) as elements of T (sizeof(T) must match the dtype; checked in debug); O(1).
  template <class T>
  std::span<T> row(std::size_t h, std::size_t p) const {
#ifndef NDEBUG
    if (sizeof(T) != size_of(type_))
      throw std::invalid_argument(
          "ringkv::tensor_view::row: element type size does not match dtype " +
          std::string(name_of(type_)));
#endif
    return {reinterpret_cast<T*>(row_bytes(h, p)), head_dim_};
  }
  /// Positions [from, from + count) of every head, as a view over the same memory; O(1).
  tensor_view slice(std::size_t from, std::size_t count) const;

 private:
  void check_row(std::size_t h, std::size_t p) const;

  std::byte* data_ = nullptr;
  dtype type_ = dtype::f32;
  std::size_t heads_ = 0, positions_ = 0, head_dim_ = 0;
  std::size_t head_stride_ = 0, position_stride_ = 0;
};

/// A bump arena over one slab for per-forward temporaries (gather targets, partial states).
/// Allocation is a pointer bump; growing past the slab takes another slab (traced), and the next
/// reset() replaces all slabs by one large enough for the high-water mark, so a steady workload
/// stops allocating after its first round.
class scope {
 public:
  /// Allocates the slab (`slab_bytes` > 0) once, traced as allocation{"scope-slab"}.
  explicit scope(std::size_t slab_bytes, trace::sink& sink = trace::null_sink());

  /// `bytes` (> 0) of 64-byte aligned, uninitialised memory valid until reset(); O(1) unless it
  /// must grow (then one traced allocation).
  std::span<std::byte> allocate_bytes(std::size_t bytes);
  /// `count` elements of `type`; as allocate_bytes.
  std::span<std::byte> allocate(std::size_t count, dtype type) {
    return allocate_bytes(count * size_of(type));
  }
  /// A contiguous [heads, positions, head_dim] view of `type` in the arena; as allocate_bytes.
  tensor_view allocate_view(dtype type, std::size_t heads, std::size_t positions,
                            std::size_t head_dim);
  /// Frees everything at once and emits scope_reset{live_before, 0}; O(1) unless it consolidates
  /// grown slabs into one or `at_least` exceeds the slab (then one traced allocation: a slab of
  /// the high-water mark or `at_least` bytes, whichever is more — for work that will grow to a
  /// size known in advance).
  void reset(std::size_t at_least = 0);

  /// Bytes handed out since the last reset (with alignment padding).
  inline std::size_t live() const noexcept { return live_; }
  /// Bytes the arena can hand out without growing.
  std::size_t capacity() const noexcept;

 private:
  static constexpr std::size_t max_slabs =
      16;  // geometric growth: slab k is >= 2^k times the first
  std::array<storage, max_slabs> slabs_;
  std::size_t current_ = 0;  // slab being bumped
  std::size_t offset_ = 0;   // bump offset inside slabs_[current_]
  std::size_t live_ = 0;
  std::size_t high_water_ = 0;
  trace::sink* sink_;
};

}  // namespace ringkv
