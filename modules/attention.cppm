// ringkv.attention — attention over windowed K/V: the decode step iterates the window's runs
// as they are (pinned sinks, ring head, ring tail) with the online-softmax kernels of
// ringkv.kernels; nothing is copied or allocated per step. decode_step_gathered is the path for
// callers that want one contiguous run: it copies K and V into a scope, traced.
module;
#include <chrono>
#include <cstddef>
#include <span>
#include <string_view>
export module ringkv.attention;
export import ringkv.kernels;
export import ringkv.quant;

export namespace ringkv {

/// Construction options of windowed_attention.
struct attention_options {
  /// Receives a kernel_run per call when it wants_kernel_runs(), and the gather path's adapters;
  /// null: no trace.
  trace::sink* sink = nullptr;
};

/// Decode (and later prefill) attention over windows. Stateless apart from its options, so one
/// object may serve any number of threads at once.
class windowed_attention {
 public:
  /// No sink; O(1).
  windowed_attention() noexcept;
  /// With the given options; O(1).
  explicit windowed_attention(attention_options options) noexcept;

  /// One decode step: query/out are [q_heads * head_dim] f32; keys and values the same window
  /// [kv_heads, len, head_dim] of one dtype, f32, f16 or bf16 (always accumulated in f32) (GQA:
  /// query head q reads kv head q / (q_heads / kv_heads)); every position of the window is
  /// attended (the caller chooses the window). `scale` 0 means
  /// 1/sqrt(head_dim); `sinks` is empty or one learned sink logit per query head (it adds
  /// e^(sink − max) to the softmax denominator). The result depends only on the positions and
  /// their rows, never on how the window is split into runs. Throws std::invalid_argument
  /// (see kernels::check_decode) with `out` untouched. O(len · q_heads · head_dim), no allocation.
  void decode_step(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
                   std::span<float> out, float scale = 0.0f,
                   std::span<const float> sinks = {}) const;

  /// As decode_step, after copying K and V into one contiguous run each in `arena` (two
  /// adapter_inserted events, "keys" and "values", priced in bytes); same bits as decode_step.
  /// Checks everything before copying. O(len · kv_heads · head_dim) more; allocates only if the
  /// arena must grow (traced by the arena).
  void decode_step_gathered(std::span<const float> query, const windowed_kv& keys,
                            const windowed_kv& values, std::span<float> out, scope& arena,
                            float scale = 0.0f, std::span<const float> sinks = {}) const;

 private:
  trace::sink* sink_;  // never null: null_sink() when the options gave none
};

/// Decode attention straight from compressed windows (ringkv.quant): no dequantized copy. The
/// query is scaled and rotated once per step into each kv head's frame; per block of absolute
/// positions the K and V codes of one kv head are expanded once for its whole query-head group
/// through the codebook held in SIMD lanes (TableLookupLanes), times the row norm, into an L1
/// tile that the f32 kernel's online softmax scores and folds (f32 accumulation); QJL keys add
/// their unbiased residual term; V is accumulated in the rotated frame and rotated back once per
/// output row. Blocks and segments sit on absolute positions as in windowed_attention, so the
/// result is bit-identical whatever the ring's phase. Stateless apart from its options.
class compressed_kv_attention {
 public:
  /// Largest head_dim it takes (its expansion tiles live on the stack).
  static constexpr std::size_t max_head_dim = 256;

  compressed_kv_attention() noexcept;
  explicit compressed_kv_attention(attention_options options) noexcept;

  /// One decode step over compressed K and V windows of the same positions (as
  /// windowed_attention::decode_step: query/out [q_heads * head_dim], GQA, scale 0 →
  /// 1/sqrt(head_dim), optional sinks). Throws std::invalid_argument naming the argument with
  /// `out` untouched. O(len · (q_heads + codes) · head_dim), no allocation.
  void decode_step(std::span<const float> query, const compressed_window& keys,
                   const compressed_window& values, std::span<float> out, float scale = 0.0f,
                   std::span<const float> sinks = {}) const;

 private:
  trace::sink* sink_;
};

}  // namespace ringkv

namespace ringkv::detail {

/// Times `work` and emits one kernel_run when the sink wants it; otherwise just runs it.
template <class Work>
void traced(trace::sink& sink, std::string_view kernel, std::size_t bytes_read,
            std::size_t bytes_written, Work&& work) {
  if (!sink.enabled() || !sink.wants_kernel_runs()) {
    work();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  work();
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count();
  sink.emit(trace::kernel_run{kernel, bytes_read, bytes_written, nanos});
}

}  // namespace ringkv::detail
