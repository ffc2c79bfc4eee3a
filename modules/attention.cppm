// ringkv.attention — attention over windowed K/V: the decode step iterates the window's runs
// as they are (pinned sinks, ring head, ring tail) with the online-softmax kernels of
// ringkv.kernels; nothing is copied or allocated per step. decode_step_gathered is the path for
// callers that want one contiguous run: it copies K and V into a scope, traced.
module;
#include <span>
export module ringkv.attention;
export import ringkv.kernels;

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
  /// [kv_heads, len, head_dim] (GQA: query head q reads kv head q / (q_heads / kv_heads)); every
  /// position of the window is attended (the caller chooses the window). `scale` 0 means
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

}  // namespace ringkv
