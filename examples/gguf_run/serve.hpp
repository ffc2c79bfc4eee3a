// gguf_run --parallel: many prompts served by one batch_runner, continuous batching.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model.hpp"

namespace gguf_run {

struct serve_options {
  std::size_t parallel = 1;  // sequences running at once
  std::size_t chunk = 64;    // prompt tokens a sequence runs in one step
  std::size_t generate = 8;  // tokens each sequence generates greedily
};

/// Runs every prompt through one batch_runner, at most `parallel` at a time: sequence i joins
/// at step i (or when a running one leaves), runs its prompt in chunks and then generates, one
/// part a sequence in every step; prints each sequence's generated ids and the aggregate tokens
/// per second. O(steps · model).
void serve(const model& m, const run_options& options,
           const std::vector<std::vector<std::int32_t>>& prompts, const serve_options& s);

}  // namespace gguf_run
