// ringkv.quant — compressed KV stores with the same slot/ring semantics as the default store:
// TurboQuant (Zandieh et al., 2025: random rotation, the norm kept apart, Lloyd–Max codebooks
// for one coordinate of a random unit vector, optional 1-bit QJL on the residual for unbiased
// inner products) and plain int8 with a per-row scale. Their windows are compressed_window:
// the same up-to-three runs with absolute positions as windowed_kv, over the codes.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>
export module ringkv.quant;
export import ringkv.store;

export namespace ringkv {

/// A Lloyd–Max (MSE-optimal scalar) quantizer for one coordinate of a uniformly random unit
/// vector in R^dim, density ∝ (1 − x²)^((dim − 3)/2) on [−1, 1] (≈ N(0, 1/dim) for large dim).
struct codebook {
  std::size_t dim = 0;
  unsigned bits = 0;
  std::vector<float> centroids;   // 2^bits, increasing, symmetric about 0
  std::vector<float> boundaries;  // 2^bits − 1 midpoints between neighbouring centroids
  double coordinate_mse = 0;      // E[(x − Q(x))²] for one coordinate (×dim: per unit vector)
  /// Index of the centroid nearest to x (the cell x falls in); O(bits).
  std::uint8_t encode(float x) const noexcept;
};

/// The codebook for (dim, bits), bits in 1..4, computed once by Lloyd's algorithm on the density
/// (Gauss–Legendre integration) and cached for the program's life (thread-safe); the first call
/// for a pair costs a few ms, later ones O(log pairs). dim 1 (a coordinate is ±1) gets 2^bits
/// evenly spaced levels from −1 to 1. Throws std::invalid_argument for dim 0 or bits outside 1..4.
const codebook& lloyd_max_codebook(std::size_t dim, unsigned bits);

/// Floats of a rotation state of R^dim: dim for a power of two (Hadamard signs), else dim²; O(1).
std::size_t rotation_floats(std::size_t dim) noexcept;
/// Writes the state of the seeded rotation of R^dim (see random_rotation) to `state`
/// (rotation_floats(dim) floats); O(dim) or O(dim³).
void fill_rotation(std::size_t dim, std::uint64_t seed, std::span<float> state);

/// A fixed random orthogonal map of R^dim from a seed: for a power-of-two dim a randomized
/// Hadamard transform (random signs, then the fast Walsh–Hadamard transform scaled by
/// 1/sqrt(dim)); otherwise a Haar-random orthogonal matrix (QR of a Gaussian matrix in double,
/// R's diagonal made positive), stored as floats. Every coordinate is rotated.
class random_rotation {
 public:
  random_rotation() = default;
  /// O(dim log dim) for Hadamard, O(dim³) otherwise; its state is one traced allocation
  /// ("rotation").
  random_rotation(std::size_t dim, std::uint64_t seed, trace::sink& sink = trace::null_sink());
  std::size_t dim() const noexcept { return dim_; }
  bool hadamard() const noexcept { return hadamard_; }
  /// out = Π·in (out may alias in only for Hadamard); O(dim log dim) or O(dim²). Throws
  /// std::invalid_argument, out untouched, unless in and out have dim() floats and (dense) do
  /// not overlap.
  void apply(std::span<const float> in, std::span<float> out) const;
  /// out = Πᵀ·in, the exact inverse; same checks, aliasing rule and cost as apply.
  void apply_inverse(std::span<const float> in, std::span<float> out) const;
  /// The state: dim signs (±1/sqrt(dim)) for Hadamard, else the dim × dim matrix, row-major.
  std::span<const float> state() const noexcept { return state_.as<float>(); }
  /// Bytes of the state.
  std::size_t bytes() const noexcept { return state_.bytes(); }

 private:
  void check(const char* who, std::span<const float> in, std::span<const float> out) const;

  std::size_t dim_ = 0;
  bool hadamard_ = false;
  storage state_;
};

/// Fills `out` with independent N(0, 1) entries from a seed (QJL's S, row-major); O(size).
void fill_gaussian(std::span<float> out, std::uint64_t seed) noexcept;

/// The QJL constant: ⟨y, r⟩ ≈ ‖r‖ · qjl_scale(dim) · ⟨S·y, sign(S·r)⟩, unbiased for S with
/// N(0, 1) entries, since E[sign(⟨s, r⟩)⟨s, y⟩] = sqrt(2/π)⟨r, y⟩/‖r‖: sqrt(π/2)/dim.
double qjl_scale(std::size_t dim) noexcept;

/// TurboQuant settings. bits in 2..4; with qjl, keys get key_bits − 1 codebook bits plus one
/// QJL sign bit per coordinate.
struct turboquant_options {
  unsigned key_bits = 4;
  unsigned value_bits = 4;
  bool qjl = false;
  std::uint64_t seed = 0x5eed'7b0c'1a2b'3c4dULL;
};

/// The window type of compressed rows: windowed_kv, whose code windows (windowed_kv::compressed())
/// hold compressed_view runs; the name the compressed stores' windows have always had.
using compressed_window = windowed_kv;

/// A slot store whose rows are compressed: reads decode through the same row codec the kernels
/// use, windows are compressed_window over the store's buffers, and the defaulted scope windows
/// announce their copy as adapter_inserted{"dequantize-kv-window"}. Derived stores encode rows
/// and say where a side's buffers are (window_of).
class compressed_kv_cache_store : public slotted_kv_cache_store {
 public:
  /// Dequantized rows, positions in order across the wrap; O(rows · row decode).
  void read_keys(std::size_t layer, std::size_t from, std::size_t to,
                 std::span<float> out) const final;
  void read_values(std::size_t layer, std::size_t from, std::size_t to,
                   std::span<float> out) const final;
  /// The window [from, to) plus its sinks over the store's own buffers (one run, two across the
  /// ring's end, plus the pinned run): O(1), no allocation, nothing emitted. Refuses positions
  /// not held (std::out_of_range).
  compressed_window compressed_key_window(std::size_t layer, std::size_t from,
                                          std::size_t to) const;
  compressed_window compressed_value_window(std::size_t layer, std::size_t from,
                                            std::size_t to) const;
  /// The code window of `side` (compressed_key_window / compressed_value_window), through the
  /// interface.
  std::optional<windowed_kv> stored_window(kv_side side, std::size_t layer, std::size_t from,
                                           std::size_t to) const final;

 protected:
  using slotted_kv_cache_store::slotted_kv_cache_store;
  std::string_view copy_kind() const noexcept final { return "dequantize-kv-window"; }
  /// The compressed window of `side` of `layer` over `slots`; O(1).
  virtual compressed_window window_of(kv_side side, std::size_t layer,
                                      const slot_runs& slots) const = 0;

 private:
  compressed_window window(kv_side side, std::size_t layer, std::size_t from, std::size_t to) const;
  void read(kv_side side, const char* who, std::size_t layer, std::size_t from, std::size_t to,
            std::span<float> out) const;
};

/// A TurboQuant store: per layer and side traced buffers of bit-packed codes and f32 norms (with
/// qjl, keys also sign bits and f32 residual norms), [kv_heads][capacity rounded up to 32 slots],
/// the keys' codes and signs in slot groups (compressed_format::grouped), the values' in rows;
/// plus per layer the rotation states (one per kv head, shared by K and V) and QJL projections. Norms are f32: they scale
/// every coordinate of a row, so their error would be a bias, and f16 overflows at 65504; at
/// head_dim 128 and 4 bits they cost 4 of 68 bytes a row. Same slots, ring, keep, slack,
/// truncate and refusals as default_kv_cache_store. Nothing is allocated after construction.
class turboquant_kv_cache_store final : public compressed_kv_cache_store {
 public:
  /// Validates config, options (bits in 2..4, std::invalid_argument naming the field) and
  /// store options, computes the codebooks (cached) and the per-head rotations/projections and
  /// allocates every buffer; O(layers · kv_heads · head_dim²) (dense rotation, QJL) to set up.
  turboquant_kv_cache_store(kv_cache_config config, turboquant_options options = {},
                            store_options store = {}, trace::sink& sink = trace::null_sink());

  /// Rotates each head's unit direction and writes its codes and norm (and QJL sketch) at the
  /// next position's slot; O(kv_heads · (head_dim log head_dim + head_dim·2^bits)), + head_dim²
  /// with qjl or a dense rotation; no allocation.
  std::size_t append(std::size_t layer, std::span<const float> key,
                     std::span<const float> value) override;
  /// Physical: codes, norms, QJL signs and residual norms, rotations, projections, codebooks.
  memory_report memory() const override;

  turboquant_options quant_options() const noexcept { return quant_; }

 protected:
  compressed_window window_of(kv_side side, std::size_t layer,
                              const slot_runs& slots) const override;

 private:
  friend struct detail::snapshot_access<turboquant_kv_cache_store>;  // ringkv.snapshot's load

  struct side_buffers {
    storage codes, scales, signs, residual_norms;
  };
  struct layer_state {
    side_buffers keys, values;
    storage rotations;    // [kv_heads][rotation_floats(head_dim)]
    storage projections;  // [kv_heads][d][d] when qjl
  };

  compressed_format format(kv_side side, std::size_t layer) const noexcept;
  void encode(kv_side side, std::size_t layer, std::size_t slot, std::span<const float> row);

  turboquant_options quant_;
  const codebook* key_book_;
  const codebook* value_book_;
  std::vector<layer_state> layers_;
  storage scratch_;  // [3, head_dim] floats: append's working rows
};

/// An int8 store: per layer and side int8 codes [kv_heads][capacity][head_dim] and one f32 scale
/// (absmax/127) per row; x ≈ scale · code, rounding to nearest. Same slot semantics as
/// default_kv_cache_store; nothing is allocated after construction.
class int8_kv_cache_store final : public compressed_kv_cache_store {
 public:
  /// Validates config and store options and allocates 4 traced buffers per layer.
  explicit int8_kv_cache_store(kv_cache_config config, store_options store = {},
                               trace::sink& sink = trace::null_sink());

  /// O(kv_heads · head_dim), no allocation.
  std::size_t append(std::size_t layer, std::span<const float> key,
                     std::span<const float> value) override;
  /// Physical: codes and scales.
  memory_report memory() const override;

 protected:
  compressed_window window_of(kv_side side, std::size_t layer,
                              const slot_runs& slots) const override;

 private:
  friend struct detail::snapshot_access<int8_kv_cache_store>;  // ringkv.snapshot's load

  struct side_buffers {
    storage codes, scales;
  };
  struct layer_state {
    side_buffers keys, values;
  };
  compressed_format format() const noexcept;

  std::vector<layer_state> layers_;
};

}  // namespace ringkv

namespace ringkv::detail {
// Decodes every row of `w` into out [heads, w.length(), head_dim] (sized by the caller).
void decode_window(const compressed_window& w, std::span<float> out) noexcept;
// Builds compressed runs from slot runs over side buffers laid out [heads][head_stride].
compressed_window window_over(const compressed_format& format,
                              std::span<const slotted_kv_cache_store::slot_run> slots,
                              std::size_t head_stride, const std::byte* codes, const float* scales,
                              const std::byte* signs, const float* residual_norms);
}  // namespace ringkv::detail
