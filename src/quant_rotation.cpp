// Seeded random rotations (randomized Hadamard or a Haar-random orthogonal matrix) and the
// Gaussian projection of QJL.
module;
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>
module ringkv.quant;

namespace ringkv {
namespace {

// splitmix64: a small, portable generator, so a seed gives the same rotation everywhere.
struct splitmix {
  std::uint64_t state;
  std::uint64_t next() noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() noexcept { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() noexcept {  // Box–Muller, one of the pair
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::acos(-1.0) * v);
  }
};

// In place, unnormalised: x ← H·x, H the Sylvester Hadamard matrix of size x.size() (2^k).
void walsh_hadamard(std::span<float> x) noexcept {
  const std::size_t n = x.size();
  for (std::size_t h = 1; h < n; h *= 2)
    for (std::size_t i = 0; i < n; i += 2 * h)
      for (std::size_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

// Haar-random orthogonal matrix: Gram–Schmidt (twice, for orthogonality to rounding) on the
// columns of a Gaussian matrix, which is QR with R's diagonal positive.
void haar_orthogonal(std::size_t d, splitmix& rng, std::span<float> out) {
  std::vector<double> q(d * d);  // column j at q[j*d ...]
  for (double& x : q) x = rng.normal();
  for (std::size_t j = 0; j < d; ++j) {
    double* col = &q[j * d];
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t k = 0; k < j; ++k) {
        const double* prev = &q[k * d];
        double dot = 0;
        for (std::size_t i = 0; i < d; ++i) dot += prev[i] * col[i];
        for (std::size_t i = 0; i < d; ++i) col[i] -= dot * prev[i];
      }
    double norm = 0;
    for (std::size_t i = 0; i < d; ++i) norm += col[i] * col[i];
    norm = std::sqrt(norm);
    for (std::size_t i = 0; i < d; ++i) col[i] /= norm;
  }
  // Row-major matrix whose rows are the orthonormal columns: Π·x = Qᵀ·x, also Haar.
  for (std::size_t i = 0; i < d * d; ++i) out[i] = float(q[i]);
}

}  // namespace

random_rotation::random_rotation(std::size_t dim, std::uint64_t seed, trace::sink& sink)
    : dim_(dim), hadamard_(std::has_single_bit(dim)),
      state_((hadamard_ ? dim : dim * dim) * sizeof(float), "rotation", sink) {
  splitmix rng{seed};
  const std::span<float> state = state_.as<float>();
  if (hadamard_) {
    const float s = float(1.0 / std::sqrt(double(dim)));
    for (float& x : state) x = (rng.next() >> 63) ? -s : s;
  } else {
    haar_orthogonal(dim, rng, state);
  }
}

void random_rotation::apply(std::span<const float> in, std::span<float> out) const noexcept {
  const std::size_t d = dim_;
  const float* state = state_.as<float>().data();
  if (hadamard_) {  // (1/√d)·H·D·in, with the signs stored as ±1/√d
    for (std::size_t i = 0; i < d; ++i) out[i] = in[i] * state[i];
    walsh_hadamard(out.first(d));
    return;
  }
  for (std::size_t r = 0; r < d; ++r) {
    const float* row = &state[r * d];
    const float* x = in.data();
    float acc = 0;
    for (std::size_t i = 0; i < d; ++i) acc += row[i] * x[i];
    out[r] = acc;
  }
}

void random_rotation::apply_inverse(std::span<const float> in, std::span<float> out) const noexcept {
  const std::size_t d = dim_;
  const float* state = state_.as<float>().data();
  if (hadamard_) {  // D·(1/√d)·H·in: H is symmetric and H·H = d·I
    for (std::size_t i = 0; i < d; ++i) out[i] = in[i];
    walsh_hadamard(out.first(d));
    for (std::size_t i = 0; i < d; ++i) out[i] *= state[i];
    return;
  }
  float* y = out.data();
  for (std::size_t i = 0; i < d; ++i) y[i] = 0;
  for (std::size_t r = 0; r < d; ++r) {
    const float* row = &state[r * d];
    const float a = in[r];
    for (std::size_t i = 0; i < d; ++i) y[i] += a * row[i];
  }
}

void fill_gaussian(std::span<float> out, std::uint64_t seed) noexcept {
  splitmix rng{seed};
  for (float& x : out) x = float(rng.normal());
}

}  // namespace ringkv
