// Seeded random rotations (randomized Hadamard or a Haar-random orthogonal matrix) and the
// Gaussian projection of QJL.
module;
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>
#include "quant_codec.h"
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

std::size_t rotation_floats(std::size_t dim) noexcept {
  return std::has_single_bit(dim) ? dim : dim * dim;
}

void fill_rotation(std::size_t dim, std::uint64_t seed, std::span<float> state) {
  if (state.size() != rotation_floats(dim))
    throw std::invalid_argument("ringkv::fill_rotation: state has " + std::to_string(state.size()) +
                                " floats, expected " + std::to_string(rotation_floats(dim)));
  splitmix rng{seed};
  if (std::has_single_bit(dim)) {
    const float s = float(1.0 / std::sqrt(double(dim)));
    for (float& x : state) x = (rng.next() >> 63) ? -s : s;
  } else {
    haar_orthogonal(dim, rng, state);
  }
}

random_rotation::random_rotation(std::size_t dim, std::uint64_t seed, trace::sink& sink)
    : dim_(dim), hadamard_(std::has_single_bit(dim)),
      state_(rotation_floats(dim) * sizeof(float), "rotation", sink) {
  fill_rotation(dim, seed, state_.as<float>());
}

void random_rotation::check(const char* who, std::span<const float> in,
                            std::span<const float> out) const {
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(std::string("ringkv::random_rotation::") + who + ": " + what);
  };
  if (in.size() != dim_ || out.size() != dim_)
    refuse("in has " + std::to_string(in.size()) + " floats and out " + std::to_string(out.size()) +
           "; both must have dim = " + std::to_string(dim_));
  // The dense product reads all of in for every output: it cannot work in place.
  if (!hadamard_ && dim_ > 0 && in.data() < out.data() + dim_ && out.data() < in.data() + dim_)
    refuse("out overlaps in (only a Hadamard rotation, dim a power of two, works in place)");
}

void random_rotation::apply(std::span<const float> in, std::span<float> out) const {
  check("apply", in, out);
  codec::rotate(state_.as<float>().data(), hadamard_, dim_, in.data(), out.data());
}

void random_rotation::apply_inverse(std::span<const float> in, std::span<float> out) const {
  check("apply_inverse", in, out);
  codec::rotate_back(state_.as<float>().data(), hadamard_, dim_, in.data(), out.data());
}

void fill_gaussian(std::span<float> out, std::uint64_t seed) noexcept {
  splitmix rng{seed};
  for (float& x : out) x = float(rng.normal());
}

}  // namespace ringkv
