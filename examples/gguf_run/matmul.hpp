// The runner's matrix products (Highway, dynamic dispatch: matmul.cpp). No Highway here.
#pragma once
#include <cstddef>

namespace gguf_run {

/// y[t * y_stride + r] = Σ_c w[r * cols + c] · x[t * cols + c] for rows [row_begin, row_end)
/// and tokens t < n. Rows and tokens are tiled (four rows × up to four tokens) so a weight vector
/// serves several tokens and a token vector several rows, but each product is summed in the
/// same order whatever n is: a token's result does not depend on which tokens or rows it was
/// computed with. O((row_end - row_begin) · n · cols).
void matmul_rows(const float* w, std::size_t row_begin, std::size_t row_end, std::size_t cols,
                 const float* x, std::size_t n, float* y, std::size_t y_stride);

/// Name of the Highway target the dispatch picked (e.g. "AVX2").
const char* matmul_target();

}  // namespace gguf_run
