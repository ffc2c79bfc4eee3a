// ringkv.attention — attention over windowed K/V: the decode step iterates the window's runs
// as they are (pinned sinks, ring head, ring tail) with the online-softmax kernels of
// ringkv.kernels; nothing is copied or allocated per step. decode_step_gathered is the path for
// callers that want one contiguous run: it copies K and V into a scope, traced.
module;
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
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

/// One token's projections for one layer: q [q_heads * head_dim], k and v [kv_heads * head_dim].
struct token_qkv {
  std::span<const float> q, k, v;
};

/// Options of a layer's attention: layer_attention's prefill and steps share them, and they are
/// decode()'s and layer_decoder's decode_options and windowed_attention::prefill's
/// prefill_options.
struct layer_options {
  std::size_t window = 0;             // keys a query sees, counting itself and the sinks;
                                      // 0: the store's attention_window() (capacity - slack)
  float scale = 0.0f;                 // 0: 1 / sqrt(head_dim)
  std::span<const float> sinks = {};  // learned sink logit per query head, or empty
  bool gather = false;          // decode steps copy each window into one run first (traced), to
                                // compare
  thread_pool* pool = nullptr;  // split each step across it (same bits); null: this thread.
                                // windowed_attention::prefill uses the object's own pool
  scope* arena = nullptr;  // scratch for copies on the kernels' path (a narrower element type's
                           // rounded chunk rows, a copying store's windows); null: a local one
};

/// Options of windowed_attention::prefill (the layer's options; .pool and .gather do not apply).
using prefill_options = layer_options;

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
  /// [kv_heads, len, head_dim] of one dtype (any element type: always accumulated in f32) (GQA:
  /// query head q reads kv head q / (q_heads / kv_heads)); every position of the window is
  /// attended (the caller chooses the window). `scale` 0 means
  /// 1/sqrt(head_dim); `sinks` is empty or one learned sink logit per query head (it adds
  /// e^(sink − max) to the softmax denominator). The result depends only on the positions and
  /// their rows, never on how the window is split into runs or on the pool's size. Throws
  /// std::invalid_argument (see kernels::check_decode) with `out` untouched. Code windows
  /// (a compressed store's, windowed_kv::compressed()) are attended by compressed_kv_attention
  /// with this object's sink and pool.
  /// O(len · q_heads · head_dim) split across the pool; no allocation once the scratch fits.
  void decode_step(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
                   std::span<float> out, float scale = 0.0f,
                   std::span<const float> sinks = {}) const;

  /// A chunk of C tokens of one layer: queries [C, q_heads * head_dim], keys and values
  /// [C, kv_heads * head_dim], out like queries. Token i sits at position p = length(layer) + i
  /// and sees p - W + 1 … p (W = options.window; with keep S: 0 … S-1 and the W - S newest),
  /// never below 0 or above p: the store's zero-copy runs, then the chunk's rows (a store of a
  /// narrower element type's rounded once into the arena as append stores them: adapter_inserted
  /// {"round-chunk-rows"} for "keys" and "values", in bytes). Every output is computed before the
  /// chunk is appended, so a ring of capacity W takes a chunk of any length; the bits are those
  /// of C calls of append + decode_step however a prompt is cut. Checks all first
  /// (std::invalid_argument / std::out_of_range naming the argument, cache_full for a dense store
  /// without room), `out` and the store untouched. A store that exposes element rows
  /// (stored_window) gets kernels::prefill (tiles of queries loading each block of rows once;
  /// split across the pool by kv head and tile, same bits), the object's scratch grown once; any
  /// other store, the token-by-token loop (append, then attend: a compressed one from its codes).
  /// O(C · W · q_heads · head_dim); once warm, no allocation for f32 or with a fitting arena.
  void prefill(kv_cache_store& store, std::size_t layer, std::span<const float> queries,
               std::span<const float> keys, std::span<const float> values, std::span<float> out,
               const prefill_options& options = {}) const;

  /// As decode_step, after copying K and V into one contiguous run each in `arena` (two
  /// adapter_inserted events, "keys" and "values", priced in bytes; code windows decoded to f32
  /// rows); same bits as decode_step over element windows.
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

/// One layer of a model over one store: prefill(chunk) and step(token) with one set of options
/// (window, scale, sinks, pool, arena), the decode stream's and windowed_attention::prefill's
/// arithmetic, so a model loop holds one object a layer. It reads whatever the store exposes
/// (stored_window): element rows through the decode and tiled prefill kernels, codes through the
/// compressed kernels, nothing copied; a store that exposes no rows through its copying windows.
/// Holds the attention's scratch and an arena; the store is referenced and must outlive it.
class layer_attention {
 public:
  /// Checks store, layer and options (std::out_of_range: a layer >= layers;
  /// std::invalid_argument: head_dim past kernels::max_head_dim, keys and values of different
  /// dtypes, a window past capacity - slack or not past keep, a bad scale) and allocates the
  /// arena's small slab (traced); O(1).
  layer_attention(kv_cache_store& store, std::size_t layer, layer_options options = {},
                  trace::sink& sink = trace::null_sink());
  /// Moves the references, scratch and arena (a model keeps one a layer in a vector); O(1).
  layer_attention(layer_attention&&) = default;

  /// Throws what step() would for `t` (sizes against the store, non-finite q, k or v, sinks
  /// against q_heads), before anything is appended; O(row).
  void check(const token_qkv& t) const;
  /// Appends t.k, t.v at the layer's next position (overwriting the oldest of a full ring) and
  /// writes the attention of t.q over its window to `out` ([q_heads * head_dim], not overlapping
  /// t.q). Checks t and out first (then the store and `out` are untouched).
  /// O(window * q_heads * head_dim); no heap allocation once warm (the first step sizes a pool's
  /// scratch; a store whose windows copy, or .gather, sizes the arena for the full window then).
  void step(const token_qkv& t, std::span<float> out);
  /// A chunk of C tokens: windowed_attention::prefill with this object's options, scratch and
  /// arena (same checks, same bits as C steps).
  void prefill(std::span<const float> queries, std::span<const float> keys,
               std::span<const float> values, std::span<float> out);
  /// Throws what prefill() would for this chunk, changing nothing; O(chunk).
  void check_chunk(std::span<const float> queries, std::span<const float> keys,
                   std::span<const float> values, std::span<const float> out) const;

  /// The store it appends to; O(1).
  kv_cache_store& store() const noexcept { return *store_; }
  /// The layer of the store it appends to; O(1).
  std::size_t layer() const noexcept { return layer_; }
  /// The effective window (options.window, or capacity - slack); O(1).
  std::size_t window() const noexcept { return window_; }
  /// The options it was made with; O(1).
  const layer_options& options() const noexcept { return options_; }
  /// Where its events go; O(1).
  trace::sink& sink() const noexcept { return *sink_; }

 protected:
  /// As the public constructor; refusals of the checks start with `checks` and a refused step's
  /// `out` with `step` (the names a derived form such as layer_decoder answers to).
  layer_attention(kv_cache_store& store, std::size_t layer, layer_options options,
                  trace::sink& sink, std::string_view checks, std::string_view step);

 private:
  std::string_view checks_, step_;  // static strings, for messages
  kv_cache_store* store_;
  std::size_t layer_;
  layer_options options_;
  std::size_t window_;
  trace::sink* sink_;
  windowed_attention attention_;  // its scratch: a pooled step's partial states, prefill tiles
  scope arena_;                   // grows only for stores whose windows copy (or .gather)
  std::size_t reserved_q_ = 0;    // query width the pool's scratch was sized for
};

/// One member of a batched call (attend_batch): a layer of one sequence — its layer_attention
/// over its own store, with its own window, scale, sinks and row format — and its new tokens:
/// one for a decode step, C for a prefill chunk.
struct batch_entry {
  layer_attention* layer = nullptr;
  std::span<const float> queries;  // [C, q_heads * head_dim]
  std::span<const float> keys;     // [C, kv_heads * head_dim]
  std::span<const float> values;   // [C, kv_heads * head_dim]
  std::span<float> out;            // like queries
};

/// Attends a batch in one call, the shape a continuous-batching scheduler emits: each entry
/// appends its tokens to its layer's store and attends them (one token: layer_attention::step;
/// more: its prefill), the entries spread over `pool` (null: this thread; an entry's own pool
/// then runs inline). Every output row is bit-identical to that entry's own step or prefill,
/// whatever the batch's size and order, the other members, their formats and windows, and the
/// thread count: an entry's arithmetic is fixed by its own window, never by the batch. Checks
/// every entry first (as step / prefill do, and that no two entries share a layer of a store),
/// then reserves each entry's rows (kv_cache_store::reserve: a pool's budget refuses there): a
/// refusal leaves every store's positions and rows and every out untouched. A batch one of whose layers has an
/// enabled sink runs on the calling thread, entry after entry, so events arrive in order on a
/// sink that takes them from one thread (trace::recorder). No allocation once each entry's layer
/// is warm. O(Σ entry work / threads).
void attend_batch(std::span<const batch_entry> entries, thread_pool* pool = nullptr);

}  // namespace ringkv

// Module-internal: what the attention implementation units share.
namespace ringkv::detail {

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
/// The store's own windows [from, to) (stored_window, keys and values), when it exposes rows the
/// attention reads as they are: element rows, or codes of head_dim up to
/// compressed_kv_attention::max_head_dim; O(1).
std::optional<std::array<windowed_kv, 2>> stored_windows(const kv_cache_store& store,
                                                         std::size_t layer, std::size_t from,
                                                         std::size_t to);
/// A chunk's geometry after every check (C = tokens; rows in floats).
struct chunk_shape {
  std::size_t tokens = 0, q_row = 0, kv_row = 0, window = 0;
  float scale = 0.0f;
};
/// Checks everything windowed_attention::prefill needs of a chunk on `layer` of `store` before
/// it changes anything (std::invalid_argument / std::out_of_range naming the argument, cache_full
/// for a dense store without room) and returns its shape; O(chunk).
chunk_shape check_chunk(const kv_cache_store& store, std::size_t layer,
                        std::span<const float> queries, std::span<const float> keys,
                        std::span<const float> values, std::span<const float> out,
                        const prefill_options& o);
/// Checks a step over code windows as compressed_kv_attention::decode_step does (both windows
/// codes of the same positions and geometry; query, out, scale and sinks) and returns the
/// resolved scale; throws std::invalid_argument naming `caller`. O(q_heads + runs).
float check_codes(std::string_view caller, std::span<const float> query, const windowed_kv& keys,
                  const windowed_kv& values, std::span<const float> out, float scale,
                  std::span<const float> sinks);
/// Bytes of arena one token's copied windows of `window` positions take at most: the K and V
/// copies of a store whose windows copy (two runs each) and their gathered copies; O(1).
std::size_t window_copy_bytes(const kv_cache_config& c, std::size_t window) noexcept;

/// One token of a stream or prefill: its rows, its output row and the step's options.
struct token_step {
  std::span<const float> q, k, v;  // [q_heads * head_dim], [kv_heads * head_dim] × 2
  std::span<float> out;            // [q_heads * head_dim]
  float scale = 0.0f;
  std::span<const float> sinks;
  bool gather = false;
};

/// What the decode stream, and prefill over a store without element windows, do per token:
/// appends t.k and t.v to `layer`, then attends t.q over the `window` positions the token sees
/// into t.out — through the store's own windows (stored_windows) unless t.gather, else through
/// its copying windows in `arena` (reset first if it holds anything; held at the full window's
/// size after; null only where stored_windows exposes the rows and t.gather is false). Every
/// check is the caller's, made before: a refusal here would come after the append.
/// O(window · q_heads · head_dim), plus the copies.
void append_and_attend(kv_cache_store& store, std::size_t layer, std::size_t window,
                       const token_step& t, const windowed_attention& attention, scope* arena);

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
