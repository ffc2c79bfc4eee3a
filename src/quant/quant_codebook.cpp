// Lloyd–Max codebooks for one coordinate of a uniformly random unit vector in R^dim, computed
// once per (dim, bits) from the density by Lloyd's algorithm and cached.
module;
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include "quant_codec.h"
module ringkv.quant;

namespace ringkv {
namespace {

// The unnormalised density (1 − x²)^((dim − 3)/2) on (−1, 1).
double density(double x, double alpha) { return std::exp(alpha * std::log1p(-x * x)); }

// ∫ x^k f(x) dx over [a, b] for k = 0, 1, 2 by composite 5-point Gauss–Legendre: the density is
// smooth inside (−1, 1), so 64 panels per cell give ~1e-13 relative accuracy at dim ≥ 3.
struct moments {
  double m0 = 0, m1 = 0, m2 = 0;
};
moments integrate(double a, double b, double alpha) {
  static constexpr double node[5] = {-0.9061798459386640, -0.5384693101056831, 0.0,
                                     0.5384693101056831, 0.9061798459386640};
  static constexpr double weight[5] = {0.2369268850561891, 0.4786286704993665, 0.5688888888888889,
                                       0.4786286704993665, 0.2369268850561891};
  constexpr int panels = 64;
  const double h = (b - a) / panels;
  moments m;
  for (int i = 0; i < panels; ++i) {
    const double mid = a + (i + 0.5) * h;
    for (int j = 0; j < 5; ++j) {
      const double x = mid + 0.5 * h * node[j], w = 0.5 * h * weight[j] * density(x, alpha);
      m.m0 += w;
      m.m1 += w * x;
      m.m2 += w * x * x;
    }
  }
  return m;
}

std::vector<double> cell_edges(const std::vector<double>& c) {
  std::vector<double> edges{-1.0};
  for (std::size_t i = 0; i + 1 < c.size(); ++i) edges.push_back(0.5 * (c[i] + c[i + 1]));
  edges.push_back(1.0);
  return edges;
}

codebook lloyd(std::size_t dim, unsigned bits) {
  const std::size_t levels = std::size_t{1} << bits;
  codebook book{dim, bits, {}, {}, 0.0};
  std::vector<double> c(levels);
  if (dim == 1) {  // a coordinate of a unit vector in R^1 is ±1: levels spanning [−1, 1]
    for (std::size_t i = 0; i < levels; ++i) c[i] = -1.0 + 2.0 * double(i) / double(levels - 1);
  } else {
    const double alpha = (double(dim) - 3.0) / 2.0;
    const double spread = std::min(0.9, 2.5 / std::sqrt(double(dim)));
    for (std::size_t i = 0; i < levels; ++i)
      c[i] = spread * (2.0 * (double(i) + 0.5) / double(levels) - 1.0);
    for (int iteration = 0; iteration < 20000; ++iteration) {
      const std::vector<double> edges = cell_edges(c);
      double moved = 0;
      for (std::size_t i = 0; i < levels; ++i) {
        const moments m = integrate(edges[i], edges[i + 1], alpha);
        const double next = m.m1 / m.m0;
        moved = std::max(moved, std::fabs(next - c[i]));
        c[i] = next;
      }
      if (moved < 1e-13) break;
    }
    // Symmetric by construction of the density; make it exact against rounding.
    for (std::size_t i = 0; i < levels / 2; ++i) {
      const double a = 0.5 * (c[levels - 1 - i] - c[i]);
      c[i] = -a;
      c[levels - 1 - i] = a;
    }
    const std::vector<double> edges = cell_edges(c);
    double total = 0, error = 0;
    for (std::size_t i = 0; i < levels; ++i) {
      const moments m = integrate(edges[i], edges[i + 1], alpha);
      total += m.m0;
      error += m.m2 - 2 * c[i] * m.m1 + c[i] * c[i] * m.m0;
    }
    book.coordinate_mse = error / total;
  }
  for (double x : c) book.centroids.push_back(float(x));
  for (std::size_t i = 0; i + 1 < levels; ++i)
    book.boundaries.push_back(book.centroids[i] +
                              0.5f * (book.centroids[i + 1] - book.centroids[i]));
  return book;
}

}  // namespace

std::uint8_t codebook::encode(float x) const noexcept {
  // The cell of x: how many boundaries lie below it (boundaries increase).
  return std::uint8_t(std::upper_bound(boundaries.begin(), boundaries.end(), x) -
                      boundaries.begin());
}

const codebook& lloyd_max_codebook(std::size_t dim, unsigned bits) {
  if (dim == 0) throw std::invalid_argument("ringkv::lloyd_max_codebook: dim must be > 0");
  if (bits < 1 || bits > 4)
    throw std::invalid_argument("ringkv::lloyd_max_codebook: bits " + std::to_string(bits) +
                                " outside 1..4");
  static std::mutex guard;
  static std::map<std::pair<std::size_t, unsigned>, std::unique_ptr<const codebook>> cache;
  const std::lock_guard lock(guard);
  auto& slot = cache[{dim, bits}];
  if (!slot) slot = std::make_unique<const codebook>(lloyd(dim, bits));
  return *slot;
}

double qjl_scale(std::size_t dim) noexcept { return codec::qjl_scale(dim); }

}  // namespace ringkv
