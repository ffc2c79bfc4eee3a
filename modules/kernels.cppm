// ringkv.kernels — the SIMD attention kernels (Highway, dynamic dispatch: the best instruction
// set of the CPU, chosen once per call), as checked functions over windows. Highway itself stays
// private: its code lives in src/kernels/ behind a Highway-free header (docs/design.md).
//
// Arithmetic contract (what makes results independent of where a ring wrapped and of threads):
// scores are dot(query · scale, key row) with the same arithmetic for every row; the online
// softmax advances by blocks of absolute positions [16k, 16k + 16) — scores, one max and rescale
// per block, a vector exp over the block, its V rows summed and folded in; a decode computes one
// partial state per segment of absolute positions [1024k, 1024k + 1024) that holds window
// positions and merges them left to right (log-sum-exp, natural log). A caller that computes the
// segments with attend() (in any order, on any threads) and merges them left to right with
// merge() gets decode()'s bits.
module;
#include <cstddef>
#include <span>
#include <string_view>
export module ringkv.kernels;
export import ringkv.window;
export import ringkv.parallel;

export namespace ringkv::kernels {

/// The online softmax's largest block. A step's blocks are absolute positions [Bk, Bk + B): B is
/// 32 when one kv head's K and V rows take at most 1 MiB (4 MiB when query heads share them),
/// else 16; on a machine whose L3 holds 128 MiB or more, or whose L2 holds more than 512 KiB, 64
/// wherever the window holds at least 256 positions (but 32 on the latter for a GQA step of more
/// than 16 MiB a kv head whose block of 64 would take more than 32 KiB; docs/design.md §3.4). So
/// it depends on the window, head_dim, element type and GQA group (and the machine), never on the
/// number of heads or threads; every B divides block_positions.
inline constexpr std::size_t block_positions = 64;
/// decode()'s unit of partial states: absolute positions [1024k, 1024k + 1024).
inline constexpr std::size_t segment_positions = 1024;
/// Largest head_dim the kernels take (their scratch is a fixed stack buffer).
inline constexpr std::size_t max_head_dim = 2048;

/// A partial online-softmax state of q_heads query heads over some window positions, natural
/// log: its log-sum-exp is max + log(sum). The caller owns the memory (e.g. one per segment).
struct softmax_state {
  std::span<float> max;  // [q_heads] largest scaled score seen; −inf: no position yet
  std::span<float> sum;  // [q_heads] Σ exp(score − max)
  std::span<float> acc;  // [q_heads, head_dim] Σ exp(score − max) · value row
};

/// Name of the instruction set the kernels dispatch to now ("AVX2", "SSE4", ...); O(1).
std::string_view target_name();

/// Σ a[i]·b[i] in f32 (SIMD); throws std::invalid_argument when the sizes differ; O(n).
float dot(std::span<const float> a, std::span<const float> b);

/// Checks a decode step's arguments and returns the scale to use (`scale` = 0 → 1/sqrt(head_dim)).
/// Throws std::invalid_argument, message starting with `caller` and naming the argument and the
/// limit: an empty window; keys and values that differ in positions, heads, head_dim or dtype;
/// head_dim > max_head_dim; query not [q_heads * head_dim] with q_heads
/// a multiple of kv_heads; out not the query's size or overlapping query/sinks; sinks neither
/// empty nor [q_heads] or NaN; scale negative or not finite. O(q_heads + runs), no allocation
/// unless it throws.
float check_decode(std::string_view caller, std::span<const float> query, const windowed_kv& keys,
                   const windowed_kv& values, std::span<const float> out, float scale,
                   std::span<const float> sinks);

/// The scale to use after checking it is finite and >= 0 (0 → 1/sqrt(head_dim)); throws
/// std::invalid_argument, message starting with `caller`, otherwise. O(1).
float check_scale(std::string_view caller, float scale, std::size_t head_dim);

/// Checks sinks is empty or [q_heads] logits none of which is NaN; throws std::invalid_argument,
/// message starting with `caller`, otherwise. O(q_heads).
void check_sinks(std::string_view caller, std::span<const float> sinks, std::size_t q_heads);

/// The query/out/sinks/scale part of check_decode, for a window of kv_heads × head_dim rows of
/// any encoding (compressed windows use it too); returns the resolved scale. O(q_heads).
float check_step(std::string_view caller, std::span<const float> query, std::size_t kv_heads,
                 std::size_t head_dim, std::span<const float> out, float scale,
                 std::span<const float> sinks);

/// One decode step: out [q_heads * head_dim] = softmax(query · K^T · scale (+ sink)) · V over all
/// the window's positions, query head q reading kv head q / (q_heads / kv_heads), each K and V
/// row loaded once per group. K/V rows may be of any element type (promoted to f32 in registers;
/// f32 accumulation). `out` is the accumulator; it is written only after every check
/// (as check_decode). O(window · q_heads · head_dim), no allocation.
void decode(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
            std::span<float> out, float scale = 0.0f, std::span<const float> sinks = {});

/// Floats of scratch the pooled decode() needs for a window of up to `positions` positions (in
/// any phase and runs) and q_heads × head_dim queries: (positions / segment_positions + 3)
/// segment states of q_heads · (head_dim + 2) floats; O(1).
std::size_t split_scratch_floats(std::size_t q_heads, std::size_t head_dim,
                                 std::size_t positions) noexcept;

/// Below this many multiply-adds (q_heads × window positions × head_dim) the pooled decode()
/// runs on the caller: handing a step to the pool costs about as much.
inline constexpr std::size_t min_split_work = std::size_t(1) << 15;

/// decode() split across `pool`, with decode()'s bits whatever pool.size() is. With kv_heads a
/// multiple of the pool's size (or a window within one segment, or one whose segments' states
/// would not fit `scratch`) each task decodes a range of kv heads straight into `out`;
/// otherwise each task computes one kv head's partial state over one segment into `scratch`,
/// and the caller's thread merges the segments left to right (log-sum-exp, natural log) and
/// normalises. One task (a size-1 pool, one kv head within one segment, less work than
/// min_split_work) runs inline. `scratch` holds at least split_scratch_floats(q_heads, head_dim,
/// keys.length()) floats and overlaps nothing else. Same checks as check_decode, plus the
/// scratch's size (std::invalid_argument, `out` untouched); if the pool throws, `out` may be
/// partly written. O(window · q_heads · head_dim / threads + segments · q_heads · head_dim),
/// no allocation (the pool's own aside).
void decode(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
            std::span<float> out, float scale, std::span<const float> sinks, thread_pool& pool,
            std::span<float> scratch);

/// Where a prefill chunk's queries sit and what each sees (see prefill()).
struct chunk_window {
  std::size_t first = 0;   // position of the chunk's first query
  std::size_t window = 0;  // W: keys a query sees, counting itself and the pinned ones
  std::size_t keep = 0;    // S < W pinned positions 0 … S − 1
};
/// Floats of scratch prefill() needs on `threads` threads for queries of q_heads over kv_heads
/// heads of head_dim: per thread, a tile's queries, a block's scores, its running and segment
/// states, and a block's K and V rows as f32; O(1).
std::size_t prefill_scratch_floats(std::size_t q_heads, std::size_t kv_heads, std::size_t head_dim,
                                   std::size_t threads) noexcept;
/// Attention for `tokens` queries [tokens, q_heads * head_dim] at positions p = at.first, … :
/// query p attends to the positions of keys/values in its window (W = at.window, S = at.keep:
/// 0 … p while p + 1 <= W, else 0 … S − 1 and p − (W − S) + 1 … p) with exactly the bits decode()
/// gives over that window alone (its block, segments, merge and finish). Queries are tiled (up to
/// 64 query heads of one kv head a tile) and each block of a kv head's rows is loaded once for
/// the whole tile (narrower rows promoted once). Split across `pool` (null: the calling thread)
/// by (kv head, tile), with the same bits. keys/values hold every position a query sees (others
/// are ignored); `scratch`, 64-byte aligned, at least prefill_scratch_floats(q_heads, kv_heads,
/// head_dim, pool ? pool->size() : 1). Throws std::invalid_argument as check_decode does, and
/// for a window that does not exceed keep, positions a query sees missing, or the scratch, with
/// `out` untouched. O(tokens · W · q_heads · head_dim / threads), no allocation.
void prefill(std::span<const float> queries, std::size_t tokens, const windowed_kv& keys,
             const windowed_kv& values, const chunk_window& at, std::span<float> out, float scale,
             std::span<const float> sinks, thread_pool* pool, std::span<float> scratch);
/// Makes `s` empty: max −inf, sum and acc 0. Throws std::invalid_argument on inconsistent
/// sizes; O(size).
void clear(const softmax_state& s);

/// The online-softmax step: continues `s` over the window positions in [from, to). Calls split
/// at multiples of block_positions give the same bits as one call. Same checks as check_decode
/// except that an empty window (or range) is allowed and changes nothing; `s` must be
/// [q_heads] / [q_heads * head_dim]. O(positions · q_heads · head_dim), no allocation.
void attend(std::span<const float> query, const windowed_kv& keys, const windowed_kv& values,
            float scale, std::size_t from, std::size_t to, const softmax_state& s);

/// `into` ← log-sum-exp merge of `into` (earlier positions) and `from` (later ones), per head:
/// m = max(m_a, m_b), sum = sum_a·e^(m_a − m) + sum_b·e^(m_b − m), likewise acc. An empty side
/// leaves the other unchanged, bit for bit. Throws std::invalid_argument unless both states
/// have the same sizes; O(q_heads · head_dim).
void merge(const softmax_state& into, const softmax_state& from);

/// out = acc / (sum + e^(sink − max)) per head (the learned sink, gpt-oss style, only adds to the
/// denominator; `sinks` empty = none); zeros for a head that saw no position, never NaN.
/// `out` may be `s.acc`. Throws std::invalid_argument on mismatched sizes; O(q_heads · head_dim).
void finish(const softmax_state& s, std::span<const float> sinks, std::span<float> out);

}  // namespace ringkv::kernels
