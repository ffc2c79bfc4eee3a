// The snapshot section of every slot store, saved from the rows a store exposes (stored_window)
// and loaded into the store of the snapshot's kind. A store's rows live in *planes*, buffers laid out
// [kv_heads][head stride] rows of a fixed byte size: the default store has keys and values (raw
// elements of the config's dtype: nothing is rounded twice); TurboQuant has key codes, key norms, (with
// QJL) key sign bits and residual norms, value codes and value norms, its key codes and sign
// bits held in slot groups (quant_codec.h) and written as the packed rows they encode; int8 has
// key codes, key scales, value codes, value scales. The section is the kind's parameters, per layer (length,
// window_start), then per layer, per plane, per head the held rows in position order. Rotations
// and QJL projections are not saved: the store rebuilds them from the saved seed. Loading puts
// every position back in the slot slot_of gives it, so a wrapped ring keeps its layout.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "quant/quant_codec.h"
module ringkv.snapshot;

namespace ringkv::detail {

/// The restricted access load needs (stores befriend these): counters and planes.
template <>
struct snapshot_access<slotted_kv_cache_store> {
  static void set(slotted_kv_cache_store& s, std::size_t layer, layer_counters c) {
    s.layers_[layer].length = c.length;
    s.layers_[layer].window_start = c.window_start;
  }
};
/// One plane of a store as the snapshot sees it: a buffer laid out [kv_heads][head_stride].
struct plane_ref {
  std::byte* data = nullptr;
  std::size_t bytes = 0;  // of the buffer (0: not known, a plane saved from a window)
  std::size_t head_stride = 0;
};

/// The plane of a store's buffer.
plane_ref plane_of(storage& buffer, std::size_t head_stride) {
  return {buffer.data(), buffer.bytes(), head_stride};
}

template <>
struct snapshot_access<default_kv_cache_store> {
  static std::vector<plane_ref> planes(default_kv_cache_store& s, std::size_t l) {
    const std::size_t slots = s.config().capacity;
    return {plane_of(s.layers_[l].keys, slots), plane_of(s.layers_[l].values, slots)};
  }
};
template <>
struct snapshot_access<turboquant_kv_cache_store> {
  static std::vector<plane_ref> planes(turboquant_kv_cache_store& s, std::size_t l) {
    auto& x = s.layers_[l];
    const std::size_t slots = codec::group_capacity(s.config().capacity);
    if (!s.quant_.qjl)
      return {plane_of(x.keys.codes, slots), plane_of(x.keys.scales, slots),
              plane_of(x.values.codes, slots), plane_of(x.values.scales, slots)};
    return {plane_of(x.keys.codes, slots),   plane_of(x.keys.scales, slots),
            plane_of(x.keys.signs, slots),   plane_of(x.keys.residual_norms, slots),
            plane_of(x.values.codes, slots), plane_of(x.values.scales, slots)};
  }
};
template <>
struct snapshot_access<int8_kv_cache_store> {
  static std::vector<plane_ref> planes(int8_kv_cache_store& s, std::size_t l) {
    auto& x = s.layers_[l];
    const std::size_t slots = s.config().capacity;
    return {plane_of(x.keys.codes, slots), plane_of(x.keys.scales, slots),
            plane_of(x.values.codes, slots), plane_of(x.values.scales, slots)};
  }
};

namespace {

/// One plane's row: bytes, the element size its bytes are swapped by (1: a byte stream), and
/// for TurboQuant's key codes and signs, the bits of the codes the store holds in slot groups.
struct plane_spec {
  std::size_t row_bytes;
  std::size_t element;
  unsigned grouped_bits = 0;
};

std::size_t bits_bytes(std::size_t d, unsigned bits) { return (d * bits + 7) / 8; }

// The planes of a kind, in the order planes() gives their buffers.
std::vector<plane_spec> layout(snapshot_kind kind, const kv_cache_config& c,
                               const turboquant_options& t) {
  const std::size_t d = c.head_dim, f = sizeof(float);
  switch (kind) {
    case snapshot_kind::default_store:
      return {{d * size_of(c.key_type), size_of(c.key_type)},
              {d * size_of(c.value_type), size_of(c.value_type)}};
    case snapshot_kind::turboquant:
      if (!t.qjl)
        return {{bits_bytes(d, t.key_bits), 1, t.key_bits},
                {f, f},
                {bits_bytes(d, t.value_bits), 1},
                {f, f}};
      return {{bits_bytes(d, t.key_bits - 1), 1, t.key_bits - 1},
              {f, f},
              {bits_bytes(d, 1), 1, 1},
              {f, f},
              {bits_bytes(d, t.value_bits), 1},
              {f, f}};
    case snapshot_kind::int8:
      return {{d, 1}, {f, f}, {d, 1}, {f, f}};
  }
  return {};
}

struct slot_span {
  std::size_t slot = 0, count = 0;
};

/// Bytes a plane's buffer takes for `heads` heads of `spec`'s rows.
std::size_t plane_bytes(const plane_ref& p, const plane_spec& spec, std::size_t heads,
                        std::size_t d) {
  return spec.grouped_bits
             ? heads * p.head_stride / codec::group_slots * codec::group_bytes(d, spec.grouped_bits)
             : heads * p.head_stride * spec.row_bytes;
}

/// The group of a grouped plane holding slot `slot` of head h.
std::byte* group_at(const plane_ref& p, const plane_spec& spec, std::size_t d, std::size_t h,
                    std::size_t slot) {
  return p.data +
         (h * p.head_stride + slot) / codec::group_slots * codec::group_bytes(d, spec.grouped_bits);
}

/// Writes rows [r.slot, r.slot + r.count) of head h of a plane, as packed rows of spec's bytes.
void save_rows(const plane_ref& p, const plane_spec& spec, std::size_t d, std::size_t h,
               const slot_span& r, snapshot_out& out) {
  if (!spec.grouped_bits) {
    out.elements(p.data + (h * p.head_stride + r.slot) * spec.row_bytes,
                 r.count * spec.row_bytes / spec.element, spec.element);
    return;
  }
  std::vector<std::uint8_t> codes(d);
  std::vector<std::byte> row(spec.row_bytes);
  for (std::size_t slot = r.slot; slot < r.slot + r.count; ++slot) {
    const std::byte* group = group_at(p, spec, d, h, slot);
    for (std::size_t i = 0; i < d; ++i)
      codes[i] = codec::grouped_code_at(group, spec.grouped_bits, slot % codec::group_slots, i);
    codec::pack(codes.data(), d, spec.grouped_bits, row.data());
    out.elements(row.data(), row.size(), 1);
  }
}

/// Reads rows [r.slot, r.slot + r.count) of head h of a plane from packed rows at `from`;
/// returns the bytes read.
std::size_t load_rows(const plane_ref& p, const plane_spec& spec, std::size_t d, std::size_t h,
                      const slot_span& r, const std::byte* from) {
  const std::size_t n = r.count * spec.row_bytes;
  if (!spec.grouped_bits) {
    copy_elements(p.data + (h * p.head_stride + r.slot) * spec.row_bytes, from, n / spec.element,
                  spec.element);
    return n;
  }
  std::vector<std::uint8_t> codes(d);
  for (std::size_t slot = r.slot; slot < r.slot + r.count; ++slot, from += spec.row_bytes) {
    for (std::size_t i = 0; i < d; ++i) codes[i] = codec::code_at(from, spec.grouped_bits, i);
    codec::grouped_store(group_at(p, spec, d, h, slot), d, spec.grouped_bits,
                         slot % codec::group_slots, codes.data());
  }
  return n;
}

// The slot runs of the held positions of `layer` (sinks, ring head, ring tail), in position order.
std::vector<slot_span> held_runs(const slotted_kv_cache_store& s, std::size_t layer) {
  const std::size_t n = s.length(layer), start = s.window_start(layer), keep = s.options().keep;
  std::vector<slot_span> out;
  auto range = [&](std::size_t from, std::size_t to) {
    while (from < to) {  // at most twice: to the ring's end, then from its start
      const std::size_t slot = s.slot_of(from);
      const std::size_t count = std::min(to - from, s.config().capacity - slot);
      out.push_back({slot, count});
      from += count;
    }
  };
  if (start == 0) {
    range(0, n);
  } else {
    range(0, keep);
    range(start, n);
  }
  return out;
}

// Bytes the store's buffers take (an upper bound for TurboQuant's rotations), or 0 on overflow.
std::size_t store_bytes(snapshot_kind kind, const kv_cache_config& c, const turboquant_options& t) {
  std::size_t row = 0, rows = 0, per_layer = 0, total = 0;
  for (const plane_spec& p : layout(kind, c, t))
    row +=
        p.grouped_bits ? (codec::group_bytes(c.head_dim, p.grouped_bits) + 31) / 32 : p.row_bytes;
  // TurboQuant's heads take whole groups of slots (quant_codec.h).
  const std::size_t slots =
      kind == snapshot_kind::turboquant ? codec::group_capacity(c.capacity) : c.capacity;
  if (slots < c.capacity || __builtin_mul_overflow(c.kv_heads, slots, &rows) ||
      __builtin_mul_overflow(rows, row, &per_layer))
    return 0;
  if (kind == snapshot_kind::turboquant) {
    std::size_t square = 0, extra = 0;  // rotations (a d x d matrix at most) and projections
    if (__builtin_mul_overflow(c.head_dim, c.head_dim, &square) ||
        __builtin_mul_overflow(square, c.kv_heads * sizeof(float) * (t.qjl ? 2 : 1), &extra) ||
        __builtin_add_overflow(per_layer, extra, &per_layer))
      return 0;
  }
  if (__builtin_mul_overflow(per_layer, c.layers, &total)) return 0;
  return total;
}

turboquant_options read_turboquant(snapshot_in& in) {
  turboquant_options t;
  for (auto [field, name] :
       {std::pair{&t.key_bits, "key_bits"}, std::pair{&t.value_bits, "value_bits"}}) {
    const std::uint64_t at = in.offset();
    const std::uint32_t bits = in.u32();
    if (bits < 2 || bits > 4)
      in.fail(std::string("config out of range: turboquant ") + name + " " + std::to_string(bits) +
                  " not in 2..4",
              at);
    *field = bits;
  }
  const std::uint64_t at = in.offset();
  const std::uint8_t qjl = in.u8();
  if (qjl > 1)
    in.fail("config out of range: turboquant qjl byte " + std::to_string(qjl) + " not 0 or 1", at);
  t.qjl = qjl == 1;
  t.seed = in.u64();
  return t;
}

/// The planes of a code window of one side (codes, scales, with QJL signs and residual norms),
/// over the store's buffers (a code window's runs all point at them: head 0, slot 0).
std::vector<plane_ref> code_planes(const windowed_kv& w) {
  if (w.code_runs().empty()) return {};
  const compressed_view& v = w.code_runs()[0];
  // The kernels' and the snapshot's pointers are read-only; plane_ref serves load too.
  const auto at = [](const void* p) {
    return const_cast<std::byte*>(static_cast<const std::byte*>(p));
  };
  std::vector<plane_ref> out = {{at(v.codes), 0, v.head_stride}, {at(v.scales), 0, v.head_stride}};
  if (w.format().qjl) {
    out.push_back({at(v.signs), 0, v.head_stride});
    out.push_back({at(v.residual_norms), 0, v.head_stride});
  }
  return out;
}

/// The slot spans of a code window's runs, in position order.
std::vector<slot_span> code_spans(const windowed_kv& w) {
  std::vector<slot_span> out;
  for (const compressed_view& v : w.code_runs()) out.push_back({v.first_slot, v.positions});
  return out;
}

/// Writes head h of an element window's rows in position order (elements of `size` bytes).
void save_elements(const windowed_kv& w, std::size_t h, snapshot_out& out) {
  const std::size_t size = size_of(w.type());
  for (const tensor_view& run : w.runs())
    for (std::size_t p = 0; p < run.positions(); ++p)
      out.elements(run.row_bytes(h, p), run.head_dim(), size);
}

/// TurboQuant's parameters as a store's key and value code windows carry them.
turboquant_options turboquant_of(const windowed_kv& keys, const windowed_kv& values) {
  const compressed_format &k = keys.format(), &v = values.format();
  return turboquant_options{k.qjl ? k.bits + 1 : k.bits, v.bits, k.qjl, k.seed};
}

/// Fills a new store of the snapshot's kind with the counters and rows read (`data`).
template <class Store>
std::unique_ptr<kv_cache_store> restore(std::unique_ptr<Store> store, const snapshot_header& h,
                                        const std::vector<plane_spec>& specs,
                                        const std::vector<layer_counters>& counters,
                                        const std::byte* next) {
  const kv_cache_config& c = h.config;
  for (std::size_t l = 0; l < c.layers; ++l)
    snapshot_access<slotted_kv_cache_store>::set(*store, l, counters[l]);
  for (std::size_t l = 0; l < c.layers; ++l) {
    const std::vector<plane_ref> planes = snapshot_access<Store>::planes(*store, l);
    const std::vector<slot_span> runs = held_runs(*store, l);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      // At least the rows (TurboQuant's value codes keep a few bytes more after them).
      if (planes[i].bytes < plane_bytes(planes[i], specs[i], c.kv_heads, c.head_dim))
        throw std::logic_error("ringkv::load: snapshot plane layout disagrees with the store's");
      for (std::size_t hd = 0; hd < c.kv_heads; ++hd)
        for (const slot_span& r : runs)
          next += load_rows(planes[i], specs[i], c.head_dim, hd, r, next);
    }
  }
  return store;
}

}  // namespace

void save_slots(snapshot_kind kind, const kv_cache_store& s, snapshot_out& out) {
  const kv_cache_config c = s.config();
  // Every layer's rows: the held positions [0, keep) ∪ [window_start, length), as exposed.
  const auto side = [&](kv_side which, std::size_t l) {
    return *s.stored_window(which, l, s.window_start(l), s.length(l));
  };
  turboquant_options t;
  if (kind == snapshot_kind::turboquant) {
    t = turboquant_of(side(kv_side::keys, 0), side(kv_side::values, 0));
    out.u32(t.key_bits);
    out.u32(t.value_bits);
    out.u8(t.qjl ? 1 : 0);
    out.u64(t.seed);
  }
  for (std::size_t l = 0; l < c.layers; ++l) {
    out.u64(s.length(l));
    out.u64(s.window_start(l));
  }
  const std::vector<plane_spec> specs = layout(kind, c, t);
  for (std::size_t l = 0; l < c.layers; ++l) {
    const windowed_kv keys = side(kv_side::keys, l), values = side(kv_side::values, l);
    if (kind == snapshot_kind::default_store) {
      for (const windowed_kv* w : {&keys, &values})
        for (std::size_t h = 0; h < c.kv_heads; ++h) save_elements(*w, h, out);
      continue;
    }
    std::vector<plane_ref> planes = code_planes(keys);
    const std::size_t key_planes = planes.size();
    for (const plane_ref& p : code_planes(values)) planes.push_back(p);
    const std::vector<slot_span> key_runs = code_spans(keys), value_runs = code_spans(values);
    for (std::size_t i = 0; i < specs.size(); ++i)
      for (std::size_t h = 0; h < c.kv_heads; ++h)
        for (const slot_span& r : i < key_planes ? key_runs : value_runs)
          save_rows(planes[i], specs[i], c.head_dim, h, r, out);
  }
}

std::unique_ptr<kv_cache_store> load_slots(const snapshot_header& h, snapshot_in& in,
                                           trace::sink& sink, std::size_t max_store_bytes) {
  const kv_cache_config& c = h.config;
  const turboquant_options t =
      h.kind == snapshot_kind::turboquant ? read_turboquant(in) : turboquant_options{};
  std::vector<layer_counters> counters(c.layers);
  for (layer_counters& lc : counters) lc = read_counters(h, in);
  const std::size_t bytes = store_bytes(h.kind, c, t);
  if (bytes == 0 || bytes > max_store_bytes)
    in.fail("config out of range: the store would take " +
                (bytes == 0 ? std::string("more than 2^64") : std::to_string(bytes)) +
                " bytes (limit " + std::to_string(max_store_bytes) + ")",
            16);
  const std::vector<plane_spec> specs = layout(h.kind, c, t);
  std::size_t row_bytes = 0;
  for (const plane_spec& p : specs) row_bytes += p.row_bytes;
  // Held rows <= capacity per layer and bytes did not overflow: this sum cannot either.
  std::size_t data_bytes = 0;
  for (const layer_counters& lc : counters) {
    const std::size_t held =
        lc.window_start == 0 ? lc.length : h.options.keep + lc.length - lc.window_start;
    data_bytes += held * c.kv_heads * row_bytes;
  }
  const std::vector<std::byte> data = in.block(data_bytes);
  in.finish();  // checked before the store is allocated: nothing is built from a corrupt file

  switch (h.kind) {
    case snapshot_kind::default_store:
      return restore(std::make_unique<default_kv_cache_store>(c, h.options, sink), h, specs,
                     counters, data.data());
    case snapshot_kind::turboquant:
      return restore(std::make_unique<turboquant_kv_cache_store>(c, t, h.options, sink), h, specs,
                     counters, data.data());
    case snapshot_kind::int8:
      return restore(std::make_unique<int8_kv_cache_store>(c, h.options, sink), h, specs, counters,
                     data.data());
  }
  return nullptr;  // unreachable: read_header accepts only these kinds
}

}  // namespace ringkv::detail
