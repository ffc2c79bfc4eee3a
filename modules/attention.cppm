// ringkv.attention — attention over windowed K/V: the decode step iterates the window's runs
// as they are (pinned sinks, ring head, ring tail) with the online-softmax kernels of
// ringkv.kernels; nothing is copied or allocated per step. decode_step_gathered is the path for
// callers that want one contiguous run: it copies K and V into a scope, traced.
module;
#include <array>
#include <atomic>
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
  /// Decode steps are split across it (kernels::decode with a pool: same bits as without);
  /// null: every step on the calling thread. Not owned; it must outlive the attention object.
  /// compressed_kv_attention splits its steps by query heads across it (same bits as without).
  thread_pool* pool = nullptr;
};

/// Options of windowed_attention::prefill.
struct prefill_options {
  std::size_t window = 0;             // keys a query sees, counting itself and the sinks;
                                      // 0: the store's attention_window() (capacity - slack)
  float scale = 0.0f;                 // 0: 1 / sqrt(head_dim)
  std::span<const float> sinks = {};  // learned sink logit per query head, or empty
  scope* arena = nullptr;  // scratch for an f16/bf16 store's rounded chunk rows (and a copying
                           // store's windows, resetting it); null: a local one per call
};

/// Decode and prefill attention over windows. It owns one scratch: the split decode's partial
/// states (with a pool) and the tiled prefill's tiles, grown by the first step that needs more
/// (one traced allocation, "split-decode-scratch" or "prefill-scratch", to the sink; reserve()
/// does the decode's up front) and reused, so warm steps allocate nothing. Concurrent steps on
/// one object stay correct: a step that finds the scratch in use by another thread's step runs
/// without it on its own thread (decode unsplit, prefill one decode a query; same bits), so for
/// speed give each calling thread its own object (they may share the pool).
class windowed_attention {
 public:
  /// No sink, no pool; O(1).
  windowed_attention() noexcept;
  /// With the given options; O(1).
  explicit windowed_attention(attention_options options) noexcept;
  /// The same options; the scratch is not copied (the copy grows its own); O(1).
  windowed_attention(const windowed_attention& other) noexcept;
  windowed_attention& operator=(const windowed_attention& other) noexcept;

  /// With a pool, sizes the scratch for windows of up to `positions` positions and q_heads ×
  /// head_dim queries (kernels::split_scratch_floats), so no later such step allocates; without
  /// one, nothing. Not to be called while another thread runs a step on this object.
  /// O(scratch) when it grows (one traced allocation), else O(1).
  void reserve(std::size_t q_heads, std::size_t head_dim, std::size_t positions);

  /// One decode step: query/out are [q_heads * head_dim] f32; keys and values the same window
  /// [kv_heads, len, head_dim] of one dtype, f32, f16 or bf16 (always accumulated in f32) (GQA:
  /// query head q reads kv head q / (q_heads / kv_heads)); every position of the window is
  /// attended (the caller chooses the window). `scale` 0 means
  /// 1/sqrt(head_dim); `sinks` is empty or one learned sink logit per query head (it adds
  /// e^(sink − max) to the softmax denominator). The result depends only on the positions and
  /// their rows, never on how the window is split into runs or on the pool's size. Throws
  /// std::invalid_argument (see kernels::check_decode) with `out` untouched.
  /// O(len · q_heads · head_dim) split across the pool; no allocation once the scratch fits.
  void decode_step(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
                   std::span<float> out, float scale = 0.0f,
                   std::span<const float> sinks = {}) const;

  /// A chunk of C tokens of one layer: queries [C, q_heads * head_dim], keys and values
  /// [C, kv_heads * head_dim], out like queries. Token i sits at position p = length(layer) + i
  /// and sees p - W + 1 … p (W = options.window; with keep S: 0 … S-1 and the W - S newest),
  /// never below 0 or above p: the store's zero-copy runs, then the chunk's rows (an f16/bf16
  /// store's rounded once into the arena as append stores them: adapter_inserted
  /// {"round-chunk-rows"} for "keys" and "values", in bytes). Every output is computed before the
  /// chunk is appended, so a ring of capacity W takes a chunk of any length; the bits are those
  /// of C calls of append + decode_step however a prompt is cut, and a store other than
  /// default_kv_cache_store gets that very loop (detail::append_and_attend; a compressed one from
  /// its codes). Checks all first (std::invalid_argument / std::out_of_range naming the argument,
  /// cache_full for a dense store without room), `out` and the store untouched. The default
  /// store's chunks go through kernels::prefill (tiles of queries loading each block of rows once;
  /// split across the pool by kv head and tile, same bits), the object's scratch grown once.
  /// O(C · W · q_heads · head_dim); once warm, no allocation for f32 or with a fitting arena.
  void prefill(kv_cache_store& store, std::size_t layer, std::span<const float> queries,
               std::span<const float> keys, std::span<const float> values, std::span<float> out,
               const prefill_options& options = {}) const;

  /// As decode_step, after copying K and V into one contiguous run each in `arena` (two
  /// adapter_inserted events, "keys" and "values", priced in bytes); same bits as decode_step.
  /// Checks everything before copying. O(len · kv_heads · head_dim) more; allocates only if the
  /// arena must grow (traced by the arena).
  void decode_step_gathered(std::span<const float> query, const windowed_kv& keys,
                            const windowed_kv& values, std::span<float> out, scope& arena,
                            float scale = 0.0f, std::span<const float> sinks = {}) const;

 private:
  /// kernels::decode, across the pool when there is one and the scratch is free.
  void attend(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
              std::span<float> out, float scale, std::span<const float> sinks) const;

  trace::sink* sink_;  // never null: null_sink() when the options gave none
  thread_pool* pool_;
  mutable storage scratch_;                // partial states of a split decode
  mutable std::atomic_flag scratch_busy_;  // set while a step uses scratch_
};

/// Decode attention straight from compressed windows (ringkv.quant): no dequantized copy. The
/// query is scaled and rotated once per step into each kv head's frame; TurboQuant keys are
/// scored from their codes through 7-bit tables of the query's products with the codebook (byte
/// shuffles, summed exactly: 0.5-4 % more output error than the exact codebook at 4 bits),
/// QJL keys add their unbiased residual term the same way, int8 keys in exact integers against
/// the query rounded to 16 bits; V codes are expanded in registers through the codebook held in
/// SIMD lanes into f32 sums, accumulated in the rotated frame and rotated back once per output
/// row. Blocks and segments sit on absolute positions as in windowed_attention, so the result is
/// bit-identical whatever the ring's phase. With a pool, a step's query heads are split across
/// its threads (whole kv heads where they divide evenly): each head's arithmetic is the same in
/// any split, so the bits are those of one thread, and nothing is allocated. Stateless apart
/// from its options, so one object may serve any number of threads at once.
class compressed_kv_attention {
 public:
  /// Largest head_dim it takes (its expansion tiles live on the stack).
  static constexpr std::size_t max_head_dim = 256;

  compressed_kv_attention() noexcept;
  explicit compressed_kv_attention(attention_options options) noexcept;

  /// One decode step over compressed K and V windows of the same positions (as
  /// windowed_attention::decode_step: query/out [q_heads * head_dim], GQA, scale 0 →
  /// 1/sqrt(head_dim), optional sinks). Throws std::invalid_argument naming the argument with
  /// `out` untouched. O(len · (q_heads + codes) · head_dim) split across the pool, no allocation.
  void decode_step(std::span<const float> query, const compressed_window& keys,
                   const compressed_window& values, std::span<float> out, float scale = 0.0f,
                   std::span<const float> sinks = {}) const;

 private:
  trace::sink* sink_;
  thread_pool* pool_;
};

}  // namespace ringkv

export namespace ringkv::detail {

/// Checks what a decode or prefill on `layer` of `store` needs of the store before anything is
/// appended and returns the effective window (`requested` 0: capacity - slack). Throws, naming
/// `caller`: std::out_of_range for a layer >= layers; std::invalid_argument for head_dim >
/// kernels::max_head_dim, keys and values of different dtypes, or a window that exceeds
/// capacity - slack or does not exceed keep. O(1).
std::size_t check_store(const kv_cache_store& store, std::size_t layer, std::size_t requested,
                        std::string_view caller);
/// First position of the rolling part of the window of the token at p (window W, keep S pinned
/// sinks: the token sees 0 … S-1 and p-(W-S)+1 … p once p + 1 > W; before, 0 … p); O(1).
std::size_t window_from(std::size_t p, std::size_t window, std::size_t keep) noexcept;
/// Appends one token's k and v rows to `layer` and returns {keys, values}: the window of
/// `window` positions that token sees, as views valid until `arena` is next reset (reset here
/// first if it holds anything; a store that cannot hand out its rows copies into it). What the
/// decode stream and prefill over a store other than the default one do per token; O(row +
/// runs), plus the copy for such stores.
std::array<windowed_kv, 2> append_and_window(kv_cache_store& store, std::size_t layer,
                                             std::span<const float> k, std::span<const float> v,
                                             std::size_t window, scope& arena);
/// Bytes of arena one token's copied windows of `window` positions take at most: the K and V
/// copies of a store whose windows copy (two runs each) and their gathered copies; O(1).
std::size_t window_copy_bytes(const kv_cache_config& c, std::size_t window) noexcept;
/// When `arena` holds a token's copied windows and could not hold them at the full `window`:
/// resets it to window_copy_bytes, so the copies of a window still filling up do not grow it
/// token after token. At most one traced allocation; O(1).
void hold_window_copies(scope& arena, const kv_cache_config& c, std::size_t window);

/// The compressed store whose codes a stream or prefill over `store` attends directly
/// (compressed_kv_attention: no dequantized copy), or null: not a compressed store, gathering
/// asked for, or head_dim past that kernel's max_head_dim. O(1).
compressed_kv_cache_store* codes_of(kv_cache_store& store, bool gather) noexcept;

/// One token of a stream or prefill: its rows, its output row and the step's options.
struct token_step {
  std::span<const float> q, k, v;  // [q_heads * head_dim], [kv_heads * head_dim] × 2
  std::span<float> out;            // [q_heads * head_dim]
  float scale = 0.0f;
  std::span<const float> sinks;
  bool gather = false;
};

/// What the decode stream and prefill over a store other than default_kv_cache_store do per
/// token: appends t.k and t.v to `layer`, then attends t.q over the `window` positions the token
/// sees into t.out — from the codes when `codes` (codes_of(store, t.gather), which the caller
/// finds once for all its tokens) is not null, else through the windows `store` hands out (a
/// store whose windows copy, or t.gather, copies into `arena`, held at the full window's size by
/// hold_window_copies; null only with `codes`). Every check is the caller's, made before: a
/// refusal here would come after the append. O(window · q_heads · head_dim), plus the copies.
void append_and_attend(kv_cache_store& store, compressed_kv_cache_store* codes, std::size_t layer,
                       std::size_t window, const token_step& t, const windowed_attention& attention,
                       trace::sink& sink, scope* arena);

}  // namespace ringkv::detail

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
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  sink.emit(trace::kernel_run{kernel, bytes_read, bytes_written, nanos});
}

}  // namespace ringkv::detail
