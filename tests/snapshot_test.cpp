#define BOOST_TEST_MODULE snapshot
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <system_error>
#include <typeinfo>
#include <utility>
#include <vector>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/quant_codec.h"

import ringkv;

#include "store_support.hpp"
#include "own_rows_store.hpp"

namespace fs = std::filesystem;
namespace trace = ringkv::trace;
using ringkv::dtype;
using ringkv::kv_cache_config;
using ringkv::kv_side;
using ringkv::store_options;

namespace {

std::string to_bytes(const ringkv::kv_cache_store& s) {
  std::ostringstream out(std::ios::binary);
  ringkv::save(s, out);
  return out.str();
}

std::unique_ptr<ringkv::kv_cache_store> from_bytes(const std::string& bytes,
                                                   trace::sink& sink = trace::null_sink()) {
  std::istringstream in(bytes, std::ios::binary);
  return ringkv::load(in, sink);
}

/// Appends `n` tokens of seeded normal rows to `layer` (another seed per layer and position).
void append_random(ringkv::kv_cache_store& s, std::size_t layer, std::size_t n, unsigned seed) {
  const std::size_t row = s.config().row_floats();
  std::vector<float> k(row), v(row);
  std::mt19937 rng(seed * 7919 + unsigned(layer));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i) {
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    s.append(layer, k, v);
  }
}

/// Bit-identical float arrays (an empty vector has no data to memcmp).
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Whether two windows are the same runs at the same slots with the same bytes.
bool same_window(const ringkv::windowed_kv& a, const ringkv::storage& a_buf,
                 const ringkv::windowed_kv& b, const ringkv::storage& b_buf) {
  if (a.runs().size() != b.runs().size()) return false;
  for (std::size_t i = 0; i < a.runs().size(); ++i) {
    const ringkv::tensor_view &x = a.runs()[i], &y = b.runs()[i];
    if (a.run_first_position(i) != b.run_first_position(i) || x.positions() != y.positions() ||
        x.data() - a_buf.data() != y.data() - b_buf.data())  // the same slots
      return false;
    for (std::size_t h = 0; h < x.heads(); ++h)
      if (std::memcmp(x.row_bytes(h, 0), y.row_bytes(h, 0),
                      x.positions() * x.head_dim() * x.element_bytes()) != 0)
        return false;
  }
  return true;
}

/// Whether two compressed windows are the same runs with the same codes, norms and signs.
bool same_compressed(const ringkv::compressed_window& a, const ringkv::compressed_window& b) {
  const auto &f = a.format(), &g = b.format();
  if (a.code_runs().size() != b.code_runs().size() || f.code_bytes != g.code_bytes ||
      f.qjl != g.qjl || f.bits != g.bits || f.sign_bytes != g.sign_bytes || f.grouped != g.grouped)
    return false;
  const ringkv::codec::rows_format fa = ringkv::codec::format_of(f);
  for (std::size_t i = 0; i < a.code_runs().size(); ++i) {
    const auto &x = a.code_runs()[i], &y = b.code_runs()[i];
    if (a.run_first_position(i) != b.run_first_position(i) || x.positions != y.positions ||
        x.first_slot != y.first_slot)
      return false;
    const auto rx = ringkv::codec::run_of(x, 0), ry = ringkv::codec::run_of(y, 0);
    for (std::size_t h = 0; h < f.heads; ++h)
      for (std::size_t p = 0; p < x.positions; ++p) {
        const std::size_t ix = h * x.head_stride + x.first_slot + p;
        const std::size_t iy = h * y.head_stride + y.first_slot + p;
        if (std::memcmp(x.scales + ix, y.scales + iy, sizeof(float)) != 0) return false;
        if (f.qjl && std::memcmp(x.residual_norms + ix, y.residual_norms + iy, sizeof(float)) != 0)
          return false;
        if (f.kind == ringkv::compression::int8) {
          if (std::memcmp(x.codes + ix * f.code_bytes, y.codes + iy * f.code_bytes, f.code_bytes) !=
              0)
            return false;
          continue;
        }
        const ringkv::codec::row_reader cx(fa, x.codes, f.bits, f.code_bytes, h, rx, p);
        const ringkv::codec::row_reader cy(fa, y.codes, f.bits, f.code_bytes, h, ry, p);
        for (std::size_t c = 0; c < f.head_dim; ++c)
          if (cx(c) != cy(c)) return false;
        if (!f.qjl) continue;
        const ringkv::codec::row_reader sx(fa, x.signs, 1, f.sign_bytes, h, rx, p);
        const ringkv::codec::row_reader sy(fa, y.signs, 1, f.sign_bytes, h, ry, p);
        for (std::size_t c = 0; c < f.head_dim; ++c)
          if (sx(c) != sy(c)) return false;
      }
  }
  return true;
}

/// Whether the stores' own windows of [from, to) agree: zero-copy views (same slots, same bytes)
/// for default stores, compressed runs (same codes) for the compressed ones.
bool same_windows(const ringkv::kv_cache_store& a_, const ringkv::kv_cache_store& b_, std::size_t l,
                  std::size_t from, std::size_t to) {
  if (auto* a = dynamic_cast<const ringkv::default_kv_cache_store*>(&a_)) {
    const auto& b = dynamic_cast<const ringkv::default_kv_cache_store&>(b_);
    return same_window(a->key_window(l, from, to), a->key_storage(l), b.key_window(l, from, to),
                       b.key_storage(l)) &&
           same_window(a->value_window(l, from, to), a->value_storage(l),
                       b.value_window(l, from, to), b.value_storage(l));
  }
  const auto& a = dynamic_cast<const ringkv::compressed_kv_cache_store&>(a_);
  const auto& b = dynamic_cast<const ringkv::compressed_kv_cache_store&>(b_);
  return same_compressed(a.compressed_key_window(l, from, to),
                         b.compressed_key_window(l, from, to)) &&
         same_compressed(a.compressed_value_window(l, from, to),
                         b.compressed_value_window(l, from, to));
}

/// Every observable of two stores of the same kind agrees bit for bit: geometry, counters, which
/// ranges are held, every window and every read. Returns the windows compared.
std::size_t check_identical(const ringkv::kv_cache_store& a, const ringkv::kv_cache_store& b) {
  BOOST_REQUIRE(typeid(a) == typeid(b));
  const kv_cache_config c = a.config();
  BOOST_REQUIRE(c.layers == b.config().layers && c.kv_heads == b.config().kv_heads &&
                c.head_dim == b.config().head_dim && c.capacity == b.config().capacity &&
                c.key_type == b.config().key_type && c.value_type == b.config().value_type);
  BOOST_REQUIRE(a.options().sliding_window == b.options().sliding_window &&
                a.options().keep == b.options().keep && a.options().slack == b.options().slack);
  if (auto* t = dynamic_cast<const ringkv::turboquant_kv_cache_store*>(&a)) {
    const auto x = t->quant_options(),
               y = dynamic_cast<const ringkv::turboquant_kv_cache_store&>(b).quant_options();
    BOOST_REQUIRE(x.key_bits == y.key_bits && x.value_bits == y.value_bits && x.qjl == y.qjl &&
                  x.seed == y.seed);
  }
  std::size_t windows = 0;
  for (std::size_t l = 0; l < c.layers; ++l) {
    BOOST_REQUIRE_EQUAL(a.length(l), b.length(l));
    BOOST_REQUIRE_EQUAL(a.window_start(l), b.window_start(l));
    for (std::size_t from = 0; from <= a.length(l); ++from)
      for (std::size_t to = from; to <= a.length(l); ++to) {
        BOOST_REQUIRE(a.holds(l, from, to) == b.holds(l, from, to));
        if (!a.holds(l, from, to)) continue;
        BOOST_REQUIRE(same_windows(a, b, l, from, to));
        std::vector<float> x(c.row_floats() * (to - from)), y(x.size());
        a.read_keys(l, from, to, x);
        b.read_keys(l, from, to, y);
        BOOST_REQUIRE(same_floats(x, y));
        a.read_values(l, from, to, x);
        b.read_values(l, from, to, y);
        BOOST_REQUIRE(same_floats(x, y));
        ++windows;
      }
  }
  return windows;
}

/// Seeded q/k/v rows for n tokens, q with two query heads per KV head.
struct token_data {
  std::vector<float> q, k, v;
  std::vector<ringkv::token_qkv> tokens;
  token_data(std::size_t n, const kv_cache_config& c, unsigned seed)
      : q(n * 2 * c.row_floats()), k(n * c.row_floats()), v(n * c.row_floats()) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto* buf : {&q, &k, &v})
      for (float& x : *buf) x = nd(rng);
    const std::size_t r = c.row_floats();
    for (std::size_t i = 0; i < n; ++i)
      tokens.push_back({std::span<const float>(q).subspan(2 * r * i, 2 * r),
                        std::span<const float>(k).subspan(r * i, r),
                        std::span<const float>(v).subspan(r * i, r)});
  }
};

/// The next `n` decode outputs of every layer, concatenated. The decode stream takes one dtype
/// for keys and values (f32, f16 or bf16): a store whose K and V share one gets outputs; a mixed
/// store gets the same `n` appends and no outputs (its windows and reads are compared afterwards
/// instead).
std::vector<float> decode_next(ringkv::kv_cache_store& s, std::size_t n) {
  std::vector<float> out;
  const bool one_dtype = s.config().key_type == s.config().value_type;
  for (std::size_t l = 0; l < s.config().layers; ++l) {
    token_data data(n, s.config(), 100 + unsigned(l));
    if (!one_dtype) {
      for (const auto& t : data.tokens) s.append(l, t.k, t.v);
      continue;
    }
    for (std::span<const float> row : ringkv::decode(s, l, data.tokens))
      out.insert(out.end(), row.begin(), row.end());
  }
  BOOST_REQUIRE(out.size() ==
                (one_dtype ? s.config().layers * n * 2 * s.config().row_floats() : 0u));
  return out;
}

struct state {
  const char* name;
  std::size_t capacity;
  store_options options;
  std::function<void(ringkv::kv_cache_store&)> fill;
};

std::vector<state> states() {
  const store_options ring{.sliding_window = true};
  return {
      {"fresh dense", 104, {}, [](auto&) {}},
      {"fresh ring", 8, ring, [](auto&) {}},
      {"partly filled dense",
       110,
       {},
       [](auto& s) { append_random(s, 0, 5, 1), append_random(s, 1, 3, 2); }},
      {"partly filled ring", 8, ring,
       [](auto& s) { append_random(s, 0, 5, 3), append_random(s, 1, 7, 4); }},
      {"wrapped many times", 8, ring,
       [](auto& s) { append_random(s, 0, 8 * 7 + 3, 5), append_random(s, 1, 8 * 5, 6); }},
      {"with keep",
       8,
       {.sliding_window = true, .keep = 2},
       [](auto& s) { append_random(s, 0, 50, 7), append_random(s, 1, 9, 8); }},
      {"with slack after a truncate",
       10,
       {.sliding_window = true, .keep = 1, .slack = 3},
       [](auto& s) {
         append_random(s, 0, 47, 9), append_random(s, 1, 31, 10);
         s.truncate(0, 45), s.truncate(1, 28);
       }},
  };
}

/// A small wrapped ring with sinks and mixed element types: the corruption sweep's subject.
ringkv::default_kv_cache_store small_store() {
  ringkv::default_kv_cache_store s({.layers = 2,
                                    .kv_heads = 1,
                                    .head_dim = 2,
                                    .capacity = 4,
                                    .key_type = dtype::f16,
                                    .value_type = dtype::f32},
                                   {.sliding_window = true, .keep = 1});
  append_random(s, 0, 11, 1);
  append_random(s, 1, 3, 2);
  return s;
}

/// A temporary folder removed at the end of the test.
struct temp_folder {
  fs::path path;
  temp_folder() {
    std::string name = (fs::temp_directory_path() / "ringkv-snapshot-XXXXXX").string();
    BOOST_REQUIRE(::mkdtemp(name.data()) != nullptr);
    path = name;
  }
  ~temp_folder() { fs::remove_all(path); }
  std::size_t entries() const {
    return std::size_t(std::distance(fs::directory_iterator(path), fs::directory_iterator()));
  }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// An output buffer that forwards to another stream and throws after `limit` bytes, as a disk
/// that fills up or a process that dies midway would stop the write.
class failing_buffer : public std::streambuf {
 public:
  failing_buffer(std::ostream& out, std::size_t limit) : out_(out), left_(limit) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    char ch = traits_type::to_char_type(c);
    return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (std::size_t(n) > left_) {
      out_.write(s, std::streamsize(left_));
      left_ = 0;
      throw std::runtime_error("failing_buffer: simulated failure midway");
    }
    out_.write(s, n);
    left_ -= std::size_t(n);
    return n;
  }

 private:
  std::ostream& out_;
  std::size_t left_;
};

template <class F>
std::string refusal(F&& f, std::uint64_t* offset = nullptr) {
  try {
    f();
  } catch (const ringkv::snapshot_error& e) {
    if (offset) *offset = e.offset();
    return e.what();
  }
  return "";
}

}  // namespace

/// A store kind of the round trips: how to build one (events to `sink`).
struct kind {
  const char* name;
  std::size_t head_dim;
  std::function<std::unique_ptr<ringkv::kv_cache_store>(const kv_cache_config&,
                                                        const store_options&, trace::sink&)>
      make;
};

std::vector<kind> kinds() {
  auto plain = [](dtype k, dtype v) {
    return [k, v](kv_cache_config c, const store_options& o, trace::sink& sink) {
      c.key_type = k, c.value_type = v;
      return std::unique_ptr<ringkv::kv_cache_store>(
          std::make_unique<ringkv::default_kv_cache_store>(c, o, sink));
    };
  };
  auto turbo = [](ringkv::turboquant_options t) {
    return [t](const kv_cache_config& c, const store_options& o, trace::sink& sink) {
      return std::unique_ptr<ringkv::kv_cache_store>(
          std::make_unique<ringkv::turboquant_kv_cache_store>(c, t, o, sink));
    };
  };
  return {
      {"default f32", 5, plain(dtype::f32, dtype::f32)},
      {"default f16", 5, plain(dtype::f16, dtype::f16)},
      {"default bf16", 5, plain(dtype::bf16, dtype::bf16)},
      {"default f16 keys, bf16 values", 5, plain(dtype::f16, dtype::bf16)},
      {"default fp8_e4m3", 5, plain(dtype::fp8_e4m3, dtype::fp8_e4m3)},
      {"turboquant 3-bit, dense rotation", 5, turbo({.key_bits = 3, .value_bits = 3, .seed = 11})},
      {"turboquant 4-bit keys with QJL, 2-bit values, Hadamard", 8,
       turbo({.key_bits = 4, .value_bits = 2, .qjl = true, .seed = 12})},
      {"int8", 5,
       [](const kv_cache_config& c, const store_options& o, trace::sink& sink) {
         return std::unique_ptr<ringkv::kv_cache_store>(
             std::make_unique<ringkv::int8_kv_cache_store>(c, o, sink));
       }},
  };
}

BOOST_AUTO_TEST_CASE(
    every_store_kind_and_state_round_trips_windows_reads_and_the_next_100_decode_outputs_bit_for_bit) {
  std::size_t cases = 0, windows = 0, outputs = 0;
  for (const kind& k : kinds())
    for (const state& st : states()) {
      BOOST_TEST_CONTEXT(k.name << ", " << st.name) {
        const kv_cache_config c{
            .layers = 2, .kv_heads = 2, .head_dim = k.head_dim, .capacity = st.capacity};
        trace::recorder built(64), rec(64);
        auto original = k.make(c, st.options, built);
        st.fill(*original);
        const std::string bytes = to_bytes(*original);
        auto loaded = from_bytes(bytes, rec);
        // The loaded store's buffers, allocated once each and traced, as a new store's are.
        BOOST_TEST(rec.emitted() == built.emitted());
        windows += check_identical(*original, *loaded);
        const std::vector<float> next = decode_next(*original, 100),
                                 again = decode_next(*loaded, 100);
        BOOST_TEST(same_floats(next, again));
        outputs += next.size();
        check_identical(*original, *loaded);  // and they stay identical after those 100 tokens
        BOOST_TEST(to_bytes(*loaded) == to_bytes(*original));
        ++cases;
      }
    }
  BOOST_TEST_MESSAGE(cases << " round trips, " << windows << " held windows compared, " << outputs
                           << " decode output floats compared");
  BOOST_TEST(cases == 8u * 7u);
}

BOOST_AUTO_TEST_CASE(
    only_held_rows_are_written_so_a_wrapped_ring_costs_its_capacity_not_its_history) {
  const kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = 4, .capacity = 8};
  ringkv::default_kv_cache_store ring(c, {.sliding_window = true});
  const std::size_t empty = to_bytes(ring).size();
  BOOST_TEST(empty == 68u + 16u + 8u);  // header, one layer's counters, checksum
  append_random(ring, 0, 3, 1);
  BOOST_TEST(to_bytes(ring).size() == empty + 3 * 2 * c.row_floats() * sizeof(float));
  append_random(ring, 0, 1000, 2);
  BOOST_TEST(to_bytes(ring).size() == empty + 8 * 2 * c.row_floats() * sizeof(float));
}

BOOST_AUTO_TEST_CASE(a_file_round_trips_and_is_replaced_whole) {
  temp_folder dir;
  const fs::path file = dir.path / "cache.rkv";
  ringkv::default_kv_cache_store s({.layers = 2, .kv_heads = 1, .head_dim = 3, .capacity = 6},
                                   {.sliding_window = true, .keep = 1});
  append_random(s, 0, 20, 1);
  ringkv::save(s, file);
  BOOST_TEST(read_file(file) == to_bytes(s));
  const ::mode_t mask = ::umask(0);
  ::umask(mask);
  BOOST_TEST(unsigned(fs::status(file).permissions()) == (0666u & ~unsigned(mask)));  // not 0600
  append_random(s, 1, 9, 2);
  ringkv::save(s, file);  // over the previous one
  BOOST_TEST(read_file(file) == to_bytes(s));
  BOOST_TEST(dir.entries() == 1u);  // no temporary file left behind
  check_identical(s, *ringkv::load(file));
  BOOST_CHECK_THROW(ringkv::load(dir.path / "missing.rkv"), std::system_error);
  std::ofstream(file, std::ios::binary | std::ios::app) << 'x';
  std::uint64_t at = 0;
  const std::string why = refusal([&] { ringkv::load(file); }, &at);
  BOOST_TEST(why.find("trailing bytes") != std::string::npos, why);
  BOOST_TEST(at == to_bytes(s).size());
}

BOOST_AUTO_TEST_CASE(a_write_that_fails_midway_leaves_the_previous_file_byte_identical) {
  temp_folder dir;
  const fs::path file = dir.path / "cache.rkv";
  ringkv::default_kv_cache_store s = small_store();
  ringkv::save(s, file);
  const std::string before = read_file(file);
  append_random(s, 1, 5, 3);  // a different snapshot to fail to write
  const std::size_t size = to_bytes(s).size();
  std::size_t failures = 0;
  for (std::size_t limit : {std::size_t{0}, std::size_t{5}, std::size_t{68}, size / 2, size - 1}) {
    // The buffer's own exception reaches the caller (not some other failure on the way).
    BOOST_CHECK_EXCEPTION(ringkv::replace_file(file,
                                               [&](std::ostream& out) {
                                                 failing_buffer buf(out, limit);
                                                 std::ostream failing(&buf);
                                                 failing.exceptions(std::ios::badbit);
                                                 ringkv::save(s, failing);
                                               }),
                          std::runtime_error, [](const std::runtime_error& e) {
                            return e.what() ==
                                   std::string("failing_buffer: simulated failure midway");
                          });
    BOOST_TEST(read_file(file) == before);
    BOOST_TEST(dir.entries() == 1u);  // the temporary file was removed
    ++failures;
  }
  // A write that cannot even start (the target's folder is missing) refuses the same way.
  BOOST_CHECK_THROW(ringkv::save(s, dir.path / "missing" / "cache.rkv"), std::system_error);
  // A rename that fails (the target is a non-empty folder) leaves no temporary file either.
  fs::create_directories(dir.path / "taken" / "inside");
  BOOST_CHECK_THROW(ringkv::save(s, dir.path / "taken"), std::system_error);
  BOOST_TEST(dir.entries() == 2u);
  BOOST_TEST(read_file(file) == before);
  BOOST_TEST(failures == 5u);
}

BOOST_AUTO_TEST_CASE(load_refuses_each_kind_of_damage_naming_it_and_its_byte_offset) {
  const std::string good = to_bytes(small_store());
  struct damage {
    const char* name;
    std::function<void(std::string&)> apply;
    const char* words;
    std::uint64_t offset;
  };
  auto put64 = [](std::string& b, std::size_t at, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = char(v >> (8 * i));
  };
  const std::uint64_t end = good.size();
  const damage cases[] = {
      {"magic", [](std::string& b) { b[1] = 'X'; }, "wrong magic", 0},
      {"newer version", [](std::string& b) { b[8] = 2; }, "newer format version 2", 8},
      {"unknown kind", [](std::string& b) { b[12] = 99; }, "unknown store kind 99", 12},
      {"zero layers", [&](std::string& b) { put64(b, 16, 0); }, "config out of range: layers 0",
       16},
      {"huge head_dim", [&](std::string& b) { put64(b, 32, 1ull << 40); },
       "config out of range: head_dim", 32},
      {"bad dtype", [](std::string& b) { b[48] = 7; }, "config out of range: key_type 7", 48},
      {"ring flag", [](std::string& b) { b[50] = 2; }, "sliding_window", 50},
      {"keep + slack", [&](std::string& b) { put64(b, 60, 3); },
       "keep 1 + slack 3 must be < capacity 4", 52},
      {"length > capacity", [&](std::string& b) { put64(b, 84, 5); },
       "lengths inconsistent with capacity 4", 84},
      {"window_start > length", [&](std::string& b) { put64(b, 76, 12); }, "window_start > length",
       68},
      {"truncated", [](std::string& b) { b.resize(b.size() - 9); }, "truncated", end - 9},
      {"checksum", [](std::string& b) { b[b.size() - 20] ^= 0x10; }, "checksum mismatch", end - 8},
      {"empty", [](std::string& b) { b.clear(); }, "truncated", 0},
  };
  for (const damage& d : cases) {
    std::string bytes = good;
    d.apply(bytes);
    trace::recorder rec(64);
    std::uint64_t at = ~0ull;
    const std::string why = refusal([&] { from_bytes(bytes, rec); }, &at);
    BOOST_TEST_CONTEXT(d.name << ": " << why) {
      BOOST_TEST(why.find(d.words) != std::string::npos);
      BOOST_TEST(why.find("at byte " + std::to_string(d.offset)) != std::string::npos);
      BOOST_TEST(at == d.offset);
      // Whatever was built before the refusal was released again: nothing half-built escapes.
      std::size_t allocated = 0, released = 0;
      for (const auto& a : rec.of<trace::allocation>()) allocated += a.bytes;
      for (const auto& r : rec.of<trace::release>()) released += r.bytes;
      BOOST_TEST(allocated == released);
    }
  }
  std::istringstream in(good);
  std::uint64_t at = 0;
  // Its buffers take 2 layers * 4 slots * 2 floats * (2 + 4) bytes = 96.
  BOOST_TEST(refusal([&] { ringkv::load(in, trace::null_sink(), 95); }, &at)
                 .find("would take 96 bytes (limit 95)") != std::string::npos);
  BOOST_TEST(at == 16u);
}

BOOST_AUTO_TEST_CASE(saving_a_store_type_without_a_format_is_refused) {
  class other final : public ringkv::kv_cache_store {
   public:
    std::size_t append(std::size_t, std::span<const float>, std::span<const float>) override {
      return 0;
    }
    std::size_t length(std::size_t) const override { return 0; }
    std::size_t window_start(std::size_t) const override { return 0; }
    kv_cache_config config() const override { return {1, 1, 1, 1}; }
    store_options options() const override { return {}; }
    void read_keys(std::size_t, std::size_t, std::size_t, std::span<float>) const override {}
    void read_values(std::size_t, std::size_t, std::size_t, std::span<float>) const override {}
    void truncate(std::size_t, std::size_t) override {}
    void clear() override {}
    void clear(std::size_t) override {}
    ringkv::memory_report memory() const override { return {}; }
  };
  std::ostringstream out;
  BOOST_CHECK_EXCEPTION(ringkv::save(other{}, out), std::invalid_argument, [](const auto& e) {
    return store_test::mentions(
        e, {"ringkv::save", "no snapshot format", "default, TurboQuant and int8 stores have"});
  });
  BOOST_TEST(out.str().empty());
}

// A store written outside the library has a snapshot for exposing its rows (stored_window): it
// loads as a default store holding the same positions, whose windows, reads and next decode
// outputs are the original's bit for bit, and whose own snapshot is the same bytes.
BOOST_AUTO_TEST_CASE(a_store_written_outside_the_library_round_trips_through_a_snapshot) {
  for (const ringkv::dtype type : ringkv::all_dtypes)
    for (const bool ring : {false, true}) {
      BOOST_TEST_CONTEXT(ringkv::name_of(type) << (ring ? " ring" : " dense")) {
        const kv_cache_config c{.layers = 2,
                                .kv_heads = 2,
                                .head_dim = 8,
                                .capacity = 20,
                                .key_type = type,
                                .value_type = type};
        store_test::own_rows_store own(c, ring);
        std::mt19937 rng(7);
        std::normal_distribution<float> normal;
        std::vector<float> k(c.row_floats()), v(c.row_floats());
        for (std::size_t l = 0; l < c.layers; ++l)
          for (std::size_t i = 0; i < (ring ? 33 : 5) + l; ++i) {
            for (float& e : k) e = normal(rng);
            for (float& e : v) e = normal(rng);
            own.append(l, k, v);
          }
        const std::string bytes = to_bytes(own);
        trace::recorder rec(64);
        auto loaded = from_bytes(bytes, rec);
        BOOST_TEST((loaded->config().key_type == type));
        for (std::size_t l = 0; l < c.layers; ++l) {
          BOOST_TEST(loaded->length(l) == own.length(l));
          BOOST_TEST(loaded->window_start(l) == own.window_start(l));
          const std::size_t from = own.window_start(l), to = own.length(l);
          std::vector<float> x(c.row_floats() * (to - from)), y(x.size());
          own.read_keys(l, from, to, x);
          loaded->read_keys(l, from, to, y);
          BOOST_TEST(same_floats(x, y));
          own.read_values(l, from, to, x);
          loaded->read_values(l, from, to, y);
          BOOST_TEST(same_floats(x, y));
        }
        const std::size_t next = ring ? 30 : 10;  // a dense store keeps room for them
        BOOST_TEST(same_floats(decode_next(own, next), decode_next(*loaded, next)));
        BOOST_TEST(to_bytes(*loaded) == to_bytes(own));
      }
    }
}

/// Flips bits of each byte of `original`'s snapshot in turn (masks 0x01, 0x80, 0xff) and
/// truncates it at each length; every variant must be refused, or load to an identical store.
void sweep(const char* name, const ringkv::kv_cache_store& original) {
  const std::string good = to_bytes(original);
  std::map<std::string, std::size_t> reasons;
  std::size_t variants = 0, identical = 0, bad_offsets = 0;
  auto classify = [&](const std::string& bytes) {
    ++variants;
    std::unique_ptr<ringkv::kv_cache_store> loaded;
    std::uint64_t at = 0;
    const std::string why = refusal([&] { loaded = from_bytes(bytes); }, &at);
    if (why.empty()) {
      check_identical(original, *loaded);  // only a byte nothing depends on could do this
      ++identical;
      return;
    }
    bad_offsets += at > bytes.size();
    for (const char* r : {"wrong magic", "format version", "unknown store kind",
                          "config out of range", "options out of range", "reserved byte",
                          "lengths inconsistent", "truncated", "checksum mismatch"})
      if (why.find(r) != std::string::npos) return void(++reasons[r]);
    BOOST_ERROR("unclassified refusal: " << why);
  };
  for (std::size_t i = 0; i < good.size(); ++i)
    for (unsigned char mask : {0x01, 0x80, 0xff}) {
      std::string bytes = good;
      bytes[i] = char(bytes[i] ^ mask);
      classify(bytes);
    }
  const std::size_t flips = variants;
  for (std::size_t n = 0; n < good.size(); ++n) classify(good.substr(0, n));
  std::ostringstream counts;
  for (const auto& [why, n] : reasons) counts << ", " << why << " " << n;
  BOOST_TEST_MESSAGE(name << " snapshot of " << good.size() << " bytes: " << flips
                          << " flipped and " << good.size()
                          << " truncated variants; loaded identical " << identical << counts.str());
  BOOST_TEST(identical == 0u);  // the format has no padding: every byte counts
  BOOST_TEST(bad_offsets == 0u);
  BOOST_TEST(reasons["truncated"] >= good.size());
  BOOST_TEST(reasons["checksum mismatch"] > 0u);
  BOOST_TEST(variants == 4 * good.size());
}

BOOST_AUTO_TEST_CASE(every_flipped_byte_and_every_truncation_of_a_small_snapshot_is_refused) {
  sweep("default store (f16 keys, f32 values, wrapped ring, keep 1)", small_store());
  ringkv::turboquant_kv_cache_store t({.layers = 1, .kv_heads = 1, .head_dim = 4, .capacity = 3},
                                      {.key_bits = 3, .value_bits = 2, .qjl = true},
                                      {.sliding_window = true});
  append_random(t, 0, 7, 3);
  sweep("TurboQuant (3-bit keys with QJL, 2-bit values, wrapped ring)", t);
  ringkv::int8_kv_cache_store i({.layers = 1, .kv_heads = 1, .head_dim = 3, .capacity = 2});
  append_random(i, 0, 2, 4);
  sweep("int8 (dense, full)", i);
}

BOOST_AUTO_TEST_CASE(turboquant_parameters_out_of_range_are_refused_at_their_offset) {
  ringkv::turboquant_kv_cache_store t({.layers = 1, .kv_heads = 1, .head_dim = 4, .capacity = 3});
  const std::string good = to_bytes(t);
  struct damage {
    std::size_t at;
    char value;
    const char* words;
  };
  for (const damage& d : {damage{68, 5, "turboquant key_bits 5 not in 2..4"},
                          damage{72, 1, "turboquant value_bits 1 not in 2..4"},
                          damage{76, 2, "turboquant qjl byte 2"}}) {
    std::string bytes = good;
    bytes[d.at] = d.value;
    std::uint64_t at = 0;
    const std::string why = refusal([&] { from_bytes(bytes); }, &at);
    BOOST_TEST(why.find(d.words) != std::string::npos, why);
    BOOST_TEST(at == d.at);
  }
}

BOOST_AUTO_TEST_CASE(nan_and_inf_in_keys_values_and_queries_are_refused_with_nothing_changed) {
  // Documented in README. Refused rather than propagated: the kernels' exponentials turn a NaN
  // score into a weight that silently drops the row, so a NaN would not even show.
  const kv_cache_config c{.layers = 1, .kv_heads = 2, .head_dim = 4, .capacity = 4};
  ringkv::default_kv_cache_store s(c, {.sliding_window = true});
  append_random(s, 0, 6, 1);
  const auto before = store_test::snap(s);
  const float nan = std::nanf(""), inf = INFINITY;
  std::size_t refused = 0;
  for (const float bad : {nan, inf, -inf})
    for (const bool in_key : {true, false}) {
      std::vector<float> k(c.row_floats(), 1.0f), v(c.row_floats(), 1.0f);
      (in_key ? k : v)[5] = bad;
      try {
        s.append(0, k, v);
        BOOST_ERROR("a non-finite " << (in_key ? "key" : "value") << " was accepted");
      } catch (const std::invalid_argument& e) {
        BOOST_TEST(store_test::mentions(e, {in_key ? "key" : "value", "non-finite", "index 5"}),
                   e.what());
        ++refused;
      }
      BOOST_TEST((store_test::snap(s) == before));
    }
  // A query: refused by the attention step before `out` is written, and by the stream before
  // the token is appended.
  const ringkv::windowed_attention attention;
  std::vector<float> q(2 * c.row_floats(), 0.5f), out(q.size(), 7.0f);
  q[3] = nan;
  BOOST_CHECK_EXCEPTION(
      attention.decode_step(q, s.key_window(0, 3, 6), s.value_window(0, 3, 6), out),
      std::invalid_argument, [](const auto& e) {
        return store_test::mentions(e, {"decode_step", "query has a non-finite element",
                                        "at index 3", "NaN and Inf are refused"});
      });
  BOOST_TEST((out == std::vector<float>(q.size(), 7.0f)));
  BOOST_TEST((store_test::snap(s) == before));
  token_data data(3, c, 5);
  data.q[2 * c.row_floats() + 1] = inf;  // the second token's query
  // The store as it must be after the first token alone: the same rows, then that token.
  ringkv::default_kv_cache_store first_only(c, {.sliding_window = true});
  append_random(first_only, 0, 6, 1);
  first_only.append(0, data.tokens[0].k, data.tokens[0].v);
  std::size_t rows = 0;
  BOOST_CHECK_EXCEPTION(for (auto row : ringkv::decode(s, 0, data.tokens)) rows += row.size() > 0,
                        std::invalid_argument, [](const auto& e) {
                          return store_test::mentions(
                              e, {"ringkv::decode", "token q has a non-finite element (inf)",
                                  "at index 1", "NaN and Inf are refused"});
                        });
  BOOST_TEST(rows == 1u);
  BOOST_TEST((store_test::snap(s) == store_test::snap(first_only)));
  BOOST_TEST(s.length(0) == 7u);  // the first token only
  BOOST_TEST(refused == 6u);
  // A finite input too large for an f16 store is refused too (it would round to Inf); the
  // largest it holds, ±65504, is snapshotted with its exact bits.
  ringkv::default_kv_cache_store h(
      {.layers = 1, .kv_heads = 1, .head_dim = 2, .capacity = 2, .key_type = dtype::f16});
  const std::vector<float> big{1e6f, -1e6f}, largest{65519.0f, -65504.0f}, small{1.0f, 2.0f};
  BOOST_CHECK_EXCEPTION(h.append(0, big, small), std::invalid_argument, [](const auto& e) {
    return std::string(e.what()).find("key[0] = 1000000.000000 is too large for f16") !=
           std::string::npos;
  });
  BOOST_TEST(h.length(0) == 0u);
  h.append(0, largest, small);
  auto back = from_bytes(to_bytes(h));
  std::vector<float> rk(2);
  back->read_keys(0, 0, 1, rk);
  BOOST_TEST((rk == std::vector<float>{65504.0f, -65504.0f}));
  check_identical(h, *back);
}
