// The GGUF reader's refusals, the model maker, and the runner against itself: every way of
// feeding a prompt gives the same logits bit for bit. No llama.cpp here (llama_parity_test).
#define BOOST_TEST_MODULE gguf_runner
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "parity_support.hpp"

using gguf_run::architecture;
using parity::feed;

namespace {

/// Hand-encoded GGUF bytes, so a test can break one field and know its offset.
struct raw {
  std::vector<std::byte> b;
  std::size_t at() const { return b.size(); }
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    for (char c : s) b.push_back(std::byte(c));
  }
  void pad(std::size_t a) { b.resize((b.size() + a - 1) / a * a); }
};

/// The parts of a one-key, one-tensor file a test may change.
struct tiny {
  std::uint32_t magic = 0x46554747, version = 3;
  std::uint64_t tensor_count = 1, kv_count = 1;
  std::string key = "general.architecture";
  std::uint32_t value_type = 8;  // string
  std::string name = "t";
  std::vector<std::uint64_t> dims = {4};
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
  std::size_t data_bytes = 16;
  /// Byte offsets of fields, filled by bytes().
  mutable std::size_t kv_count_at = 0, value_type_at = 0, dims_at = 0, type_at = 0, offset_at = 0;

  std::vector<std::byte> bytes() const {
    raw r;
    r.put(magic);
    r.put(version);
    r.put(tensor_count);
    kv_count_at = r.at();
    r.put(kv_count);
    r.str(key);
    value_type_at = r.at();
    r.put(value_type);
    r.str("x");
    r.str(name);
    r.put<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
    dims_at = r.at();
    for (auto d : dims) r.put(d);
    type_at = r.at();
    r.put(type);
    offset_at = r.at();
    r.put(offset);
    r.pad(32);
    r.b.resize(r.b.size() + data_bytes);
    return r.b;
  }
};

/// Parses `bytes` and returns the refusal (failing the test when there is none).
gguf::format_error refusal(std::vector<std::byte> bytes) {
  const std::size_t size = bytes.size();
  try {
    gguf::file f(std::move(bytes));
  } catch (const gguf::format_error& e) {
    BOOST_TEST(e.offset() <= size);
    return e;
  }
  BOOST_FAIL("the file was accepted");
  throw std::logic_error("unreachable");
}

bool names(const gguf::format_error& e, const std::string& field, std::uint64_t offset,
           const std::string& words) {
  BOOST_TEST_MESSAGE(e.what());
  return e.field() == field && e.offset() == offset &&
         std::string(e.what()).find(words) != std::string::npos;
}

/// The spec of a small model of `a`: embd 16, 2 heads of 8 over 1 kv head, window 4.
gguf_run::model_spec small_spec(architecture a, std::uint64_t seed = 3) {
  gguf_run::model_spec s;
  s.arch = a;
  s.vocab = 16;
  s.embd = 16;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 8;
  s.ff = 24;
  s.window = 4;
  s.seed = seed;
  return s;
}

std::vector<std::byte> small_model(architecture a, std::uint64_t seed = 3) {
  return gguf_run::make_model(small_spec(a, seed)).bytes();
}

/// Index of the first occurrence of `text` in `b`.
std::size_t find(const std::vector<std::byte>& b, const std::string& text) {
  for (std::size_t i = 0; i + text.size() <= b.size(); ++i)
    if (std::memcmp(b.data() + i, text.data(), text.size()) == 0) return i;
  BOOST_FAIL("not found: " + text);
  return 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_valid_file_reads_back_its_keys_and_tensors) {
  gguf::writer w;
  w.add_string("general.architecture", "x");
  w.add_u32("x.count", 7);
  w.add_f32("x.scale", 0.5f);
  w.add_bool_array("x.flags", {true, false, true});
  std::vector<std::byte> data(6 * 2);
  const std::uint16_t h = gguf::float_to_half(1.5f);
  std::memcpy(data.data() + 2, &h, 2);
  w.add_tensor("a", {3, 2}, gguf::tensor_type::f16, data);
  w.add_tensor("b", {5}, gguf::tensor_type::f32, std::vector<std::byte>(20));
  const gguf::file f(w.bytes());
  BOOST_TEST(f.get_string("general.architecture") == "x");
  BOOST_TEST(f.get_u32("x.count") == 7u);
  BOOST_TEST(f.get_f32("x.scale") == 0.5f);
  BOOST_TEST(f.get_uint_array("x.flags") == (std::vector<std::uint64_t>{1, 0, 1}),
             boost::test_tools::per_element());
  BOOST_TEST(f.tensors().size() == 2u);
  const gguf::tensor_info* a = f.find_tensor("a");
  BOOST_REQUIRE(a != nullptr);
  BOOST_TEST(a->elements() == 6u);
  BOOST_TEST(gguf::to_floats(*a)[1] == 1.5f);
  BOOST_TEST(f.find_tensor("b")->offset % 32 == 0u);
  BOOST_TEST(f.find_tensor("c") == nullptr);
}

BOOST_AUTO_TEST_CASE(a_bad_header_is_refused_naming_the_field_and_its_offset) {
  tiny t;
  t.magic = 0x46554748;
  BOOST_TEST(names(refusal(t.bytes()), "magic", 0, "not a GGUF file"));
  t = {};
  t.version = 2;
  BOOST_TEST(names(refusal(t.bytes()), "version", 4, "version 2 (this reader takes version 3)"));
  t = {};
  t.tensor_count = std::uint64_t(1) << 60;
  BOOST_TEST(names(refusal(t.bytes()), "tensor_count", 8, "cannot fit"));
  t = {};
  t.kv_count = 1000;
  BOOST_TEST(names(refusal(t.bytes()), "kv_count", 16, "cannot fit"));
  BOOST_TEST(names(refusal({}), "magic", 0, "needs 4 bytes"));
}

BOOST_AUTO_TEST_CASE(bad_metadata_is_refused_naming_the_key_and_its_offset) {
  tiny t;
  t.value_type = 13;
  auto b = t.bytes();
  BOOST_TEST(names(refusal(b), "value of general.architecture type", t.value_type_at,
                   "unknown value type 13"));
  t = {};
  t.key = "";
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "key/value 0 key", t.kv_count_at + 8, "empty key"));
  t = {};
  t.key = "bad\nkey";
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "key/value 0 key", t.kv_count_at + 8, "not printable ASCII"));

  raw r;  // an array of arrays, and a bool that is neither 0 nor 1
  r.put<std::uint32_t>(0x46554747);
  r.put<std::uint32_t>(3);
  r.put<std::uint64_t>(0);
  r.put<std::uint64_t>(1);
  r.str("k");
  r.put<std::uint32_t>(9);
  const std::size_t element_at = r.at();
  r.put<std::uint32_t>(9);
  r.put<std::uint64_t>(1);
  r.b.resize(r.b.size() + 32);
  BOOST_TEST(names(refusal(r.b), "value of k element type", element_at, "nested arrays"));
  r.b.resize(element_at);
  r.put<std::uint32_t>(7);
  const std::size_t count_at = r.at();
  r.put<std::uint64_t>(1000);
  BOOST_TEST(names(refusal(r.b), "value of k count", count_at, "cannot fit"));
  r.b.resize(count_at);
  r.put<std::uint64_t>(1);
  const std::size_t bool_at = r.at();
  r.put<std::uint8_t>(2);
  BOOST_TEST(names(refusal(r.b), "value of k[0]", bool_at, "bool byte 2 is not 0 or 1"));

  gguf::writer w;  // a key given twice
  w.add_u32("k", 1);
  w.add_u32("k", 2);
  const auto dup = w.bytes();
  BOOST_TEST(names(refusal(dup), "key/value 1 key", 24 + 8 + 1 + 4 + 4, "duplicate key k"));
}

BOOST_AUTO_TEST_CASE(bad_tensor_infos_are_refused_naming_the_tensor_and_its_offset) {
  tiny t;
  t.type = 2;  // Q4_0
  auto b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 (t) type", t.type_at,
                   "ggml type 2 is not supported (F32 = 0, F16 = 1, BF16 = 30; quantized"));
  t = {};
  t.offset = 8;
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 (t) offset", t.offset_at,
                   "8 is not a multiple of the alignment 32"));
  t = {};
  t.offset = 32;
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 (t) offset", t.offset_at,
                   "run past the end of the data section (16 bytes)"));
  t = {};
  t.dims = {4, 0};
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 (t) dims[1]", t.dims_at + 8, "is not in 1"));
  t = {};
  t.dims = {1, 1, 1, 1, 1};
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 (t) n_dims", t.dims_at - 4, "5 dimensions"));
  t = {};
  t.dims = {std::uint64_t(1) << 40, std::uint64_t(1) << 40};
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 (t) dims[1]", t.dims_at + 8, "more than 2^50"));
  t = {};
  t.name = std::string(64, 'n');
  b = t.bytes();
  BOOST_TEST(names(refusal(b), "tensor 0 name length", t.dims_at - 4 - 8 - 64, "64 exceeds 63"));

  gguf::writer w;  // two tensors, then the second's offset moved onto the first
  w.add_tensor("a", {16}, gguf::tensor_type::f32, std::vector<std::byte>(64));
  w.add_tensor("b", {4}, gguf::tensor_type::f32, std::vector<std::byte>(16));
  auto two = w.bytes();
  // The header (24 bytes), tensor a's info (name 9, n_dims 4, dims 8, type 4, offset 8), then
  // b's name, n_dims, dims and type.
  const std::size_t b_offset_at = 24 + 33 + 9 + 4 + 8 + 4;
  std::memset(two.data() + b_offset_at, 0, 8);
  BOOST_TEST(names(refusal(two), "tensor 1 (b) offset", b_offset_at, "overlaps tensor a's"));

  gguf::writer w2;  // an alignment that is not a power of two
  w2.add_u32("general.alignment", 24);
  BOOST_TEST(
      names(refusal(w2.bytes()), "general.alignment", 24 + 8 + 17 + 4, "not a power of two"));
}

BOOST_AUTO_TEST_CASE(every_truncation_of_a_model_file_is_refused_with_an_offset_inside_it) {
  const auto whole = small_model(architecture::granite_swa);
  BOOST_TEST(gguf::file(whole).tensors().size() > 10u);
  std::size_t refused = 0;
  // Every prefix through the metadata and tensor infos, then every 61st byte of the data.
  const std::size_t header_end = find(whole, "blk.1.ffn_down.weight") + 64;  // the last info
  for (std::size_t n = 0; n < whole.size(); n += n < header_end ? 1 : 61) {
    try {
      gguf::file f(std::vector<std::byte>(whole.begin(), whole.begin() + n));
      BOOST_FAIL("a file cut at " << n << " of " << whole.size() << " bytes was accepted");
    } catch (const gguf::format_error& e) {
      BOOST_REQUIRE(e.offset() <= n);
      ++refused;
    }
  }
  BOOST_TEST(refused > header_end);
}

BOOST_AUTO_TEST_CASE(a_model_file_missing_a_tensor_or_with_a_wrong_shape_is_refused_naming_it) {
  auto b = small_model(architecture::gemma3);
  BOOST_TEST(gguf_run::model::from(gguf::file(b)).hp.layers == 2u);
  auto renamed = b;
  renamed[find(renamed, "blk.1.ffn_up.weight") + 9] = std::byte('q');
  BOOST_CHECK_EXCEPTION(gguf_run::model::from(gguf::file(renamed)), gguf::format_error,
                        [](const gguf::format_error& e) {
                          return e.field() == "tensor blk.1.ffn_up.weight" &&
                                 std::string(e.what()).find("required tensor is missing") !=
                                     std::string::npos;
                        });
  auto reshaped = b;  // attn_q {16, 16} → {16, 8}: still inside the file, the wrong shape
  const std::size_t dims_at = find(reshaped, "blk.0.attn_q.weight") + 19 + 4;
  const std::uint64_t eight = 8;
  std::memcpy(reshaped.data() + dims_at + 8, &eight, 8);
  BOOST_CHECK_EXCEPTION(gguf_run::model::from(gguf::file(reshaped)), gguf::format_error,
                        [](const gguf::format_error& e) {
                          return e.field() == "tensor blk.0.attn_q.weight" &&
                                 std::string(e.what()).find(
                                     "has dims {16, 8}, expected {16, 16}") != std::string::npos;
                        });
  gguf::writer w;
  w.add_string("general.architecture", "llama");
  BOOST_CHECK_EXCEPTION(gguf_run::model::from(gguf::file(w.bytes())), gguf::format_error,
                        [](const gguf::format_error& e) {
                          return e.field() == "general.architecture" &&
                                 std::string(e.what()).find("\"llama\" is not supported") !=
                                     std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(what_llama_cpp_applies_and_the_runner_does_not_is_refused_by_name) {
  gguf_run::model_spec spec = small_spec(architecture::granite_swa);
  const auto refused = [](const std::string& field) {
    return [field](const gguf::format_error& e) {
      return e.field() == field &&
             std::string(e.what()).find("is not supported by this runner") != std::string::npos;
    };
  };
  for (const char* key : {"attention.rope_pattern", "rope.scaling.attn_factor"}) {
    gguf::writer w = gguf_run::make_model(spec);
    w.add_u32(std::string("granite_swa.") + key, 1);
    BOOST_CHECK_EXCEPTION(gguf_run::model::from(gguf::file(w.bytes())), gguf::format_error,
                          refused(std::string("granite_swa.") + key));
  }
  gguf::writer w = gguf_run::make_model(spec);
  w.add_tensor("rope_freqs.weight", {4}, gguf::tensor_type::f32, std::vector<std::byte>(16));
  BOOST_CHECK_EXCEPTION(gguf_run::model::from(gguf::file(w.bytes())), gguf::format_error,
                        refused("tensor rope_freqs.weight"));

  // Without attention.key_length the head dimension defaults to embd / heads (8 here, the value
  // length 16): the key that is missing is named, not value_length.
  spec.arch = architecture::gemma3;
  spec.head_dim = 16;
  auto b = gguf_run::make_model(spec).bytes();
  b[find(b, "gemma3.attention.key_length") + 26] = std::byte('X');
  BOOST_CHECK_EXCEPTION(gguf_run::model::from(gguf::file(b)), gguf::format_error,
                        [](const gguf::format_error& e) {
                          return e.field() == "gemma3.attention.key_length" &&
                                 std::string(e.what()).find(
                                     "is missing, and its default embedding_length / head_count "
                                     "= 8 differs from value_length 16") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(
    the_maker_writes_the_same_bytes_for_the_same_seed_and_other_weights_for_another) {
  for (architecture a : {architecture::granite_swa, architecture::gemma3}) {
    const auto one = small_model(a, 5), again = small_model(a, 5), other = small_model(a, 6);
    BOOST_TEST((one == again));
    BOOST_TEST(one.size() == other.size());
    BOOST_TEST((one != other));
  }
}

BOOST_AUTO_TEST_CASE(a_made_model_reads_back_with_the_sizes_pattern_and_weights_it_was_made_with) {
  for (gguf::tensor_type t :
       {gguf::tensor_type::f32, gguf::tensor_type::f16, gguf::tensor_type::bf16}) {
    gguf_run::model_spec s;
    s.layers = 4;
    s.sliding = {true, false, true, true};
    s.weights = t;
    const auto m = gguf_run::model::from(gguf::file(gguf_run::make_model(s).bytes()));
    BOOST_TEST(m.hp.layers == 4u);
    BOOST_TEST(m.hp.heads == s.heads);
    BOOST_TEST(m.hp.kv_heads == s.kv_heads);
    BOOST_TEST(m.hp.head_dim == s.head_dim);
    BOOST_TEST(m.hp.window == s.window);
    BOOST_TEST(m.hp.vocab == s.vocab);
    BOOST_TEST(m.hp.sliding == s.sliding, boost::test_tools::per_element());
    BOOST_TEST(m.layers[3].sinks.size() == s.heads);
    // F16/BF16 weights are the f32 ones rounded: the first row of embeddings within rounding.
    const auto f32 = gguf_run::model::from(gguf::file(
        gguf_run::make_model({.layers = 4, .sliding = {true, false, true, true}}).bytes()));
    for (std::size_t i = 0; i < s.embd; ++i)
      BOOST_TEST(std::abs(m.embd.w[i] - f32.embd.w[i]) <= 4e-3f * std::abs(f32.embd.w[i]));
  }
  gguf_run::model_spec g;
  g.arch = architecture::gemma3;
  g.layers = 5;
  g.period = 3;
  const auto m = gguf_run::model::from(gguf::file(gguf_run::make_model(g).bytes()));
  BOOST_TEST(m.hp.sliding == (std::vector<bool>{true, true, false, true, true}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(every_way_of_feeding_a_prompt_gives_the_same_logits_bit_for_bit) {
  for (architecture a : {architecture::granite_swa, architecture::gemma3})
    for (gguf_run::cache_type c :
         {gguf_run::cache_type::f32, gguf_run::cache_type::bf16, gguf_run::cache_type::fp8,
          gguf_run::cache_type::int8, gguf_run::cache_type::turboquant})
      for (std::size_t threads : {1, 2}) {
        BOOST_TEST_CONTEXT(gguf_run::name_of(a)
                           << ", " << gguf_run::name_of(c) << ", " << threads << " threads") {
          const auto& tm = parity::models(a)[1];
          const auto m = gguf_run::model::from(gguf::file::read(tm.path));
          const auto tokens = parity::prompt(90, m.hp.vocab, 4);
          gguf_run::run_options o;
          o.cache = c;
          o.threads = threads;
          const auto one = parity::run(m, tokens, feed::one_chunk, {.cache = c});
          for (feed f : {feed::one_chunk, feed::uneven_chunks, feed::token_by_token,
                         feed::prefill_then_decode}) {
            const auto other = parity::run(m, tokens, f, o);
            BOOST_TEST_INFO(parity::name_of(f));
            BOOST_TEST(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)) == 0);
          }
        }
      }
}

BOOST_AUTO_TEST_CASE(every_sequence_of_a_batch_gives_the_logits_it_gets_alone_bit_for_bit) {
  // Sequences join and leave at different steps; each step runs one part a live sequence: a
  // prompt chunk (3-17 tokens) while its prompt lasts, then one given token a step.
  struct plan {
    std::size_t joins, prompt, steps;
  };
  const plan plans[] = {{0, 17, 12}, {1, 5, 9}, {2, 30, 4}, {4, 3, 8}, {6, 11, 3}};
  for (architecture a : {architecture::granite_swa, architecture::gemma3})
    for (gguf_run::cache_type c : {gguf_run::cache_type::f32, gguf_run::cache_type::f16})
      for (std::size_t threads : {1, 2}) {
        BOOST_TEST_CONTEXT(gguf_run::name_of(a)
                           << ", " << gguf_run::name_of(c) << ", " << threads << " threads") {
          const auto& tm = parity::models(a)[1];
          const auto m = gguf_run::model::from(gguf::file::read(tm.path));
          const std::size_t vocab = m.hp.vocab;
          gguf_run::run_options o;
          o.cache = c;
          o.threads = threads;
          o.max_positions = 64;
          gguf_run::batch_runner batch(m, o, std::size(plans));
          struct live {
            std::size_t id = 0, fed = 0, total = 0;
            std::vector<std::int32_t> tokens;
            std::vector<float> logits;
          };
          std::vector<live> seqs(std::size(plans));
          for (std::size_t i = 0; i < seqs.size(); ++i) {
            seqs[i].total = plans[i].prompt + plans[i].steps;
            seqs[i].tokens = parity::prompt(seqs[i].total, vocab, 10 + i);
            seqs[i].logits.resize(seqs[i].total * vocab);
          }
          for (std::size_t step = 0; step < 20; ++step) {
            std::vector<gguf_run::batch_runner::part> parts;
            for (std::size_t i = 0; i < seqs.size(); ++i) {
              live& q = seqs[i];
              if (plans[i].joins == step) q.id = batch.add();
              if (plans[i].joins > step || q.fed >= q.total) continue;
              const std::size_t n =
                  q.fed < plans[i].prompt ? std::min(plans[i].prompt - q.fed, 3 + step % 15) : 1;
              parts.push_back({q.id, std::span(q.tokens).subspan(q.fed, n),
                               std::span(q.logits).subspan(q.fed * vocab, n * vocab)});
              q.fed += n;
            }
            std::reverse(parts.begin(), parts.end());  // any order
            batch.run(parts);
            for (live& q : seqs)
              if (q.id != 0 && q.fed == q.total) {
                batch.remove(q.id);
                q.id = 0;
                q.fed = q.total + 1;  // done
              }
          }
          for (std::size_t i = 0; i < seqs.size(); ++i) {
            BOOST_TEST_REQUIRE(seqs[i].fed == seqs[i].total + 1);
            o.threads = 1;
            const auto alone = parity::run(m, seqs[i].tokens, feed::token_by_token, o);
            BOOST_TEST_INFO("sequence " << i);
            BOOST_TEST(std::memcmp(alone.data(), seqs[i].logits.data(),
                                   alone.size() * sizeof(float)) == 0);
          }
        }
      }
}

BOOST_AUTO_TEST_CASE(
    the_runner_refuses_a_bad_token_or_a_prompt_past_its_room_before_any_layer_changes) {
  const auto& tm = parity::models(architecture::granite_swa)[1];
  const auto m = gguf_run::model::from(gguf::file::read(tm.path));
  const auto tokens = parity::prompt(30, m.hp.vocab, 9);
  const auto expected = parity::run(m, tokens, feed::one_chunk);
  gguf_run::runner r(m, {.max_positions = 30});
  std::vector<float> logits(30 * m.hp.vocab);
  r.prefill(std::span(tokens).first(10), std::span(logits).first(10 * m.hp.vocab));
  std::vector<std::int32_t> bad(tokens.begin() + 10, tokens.begin() + 14);
  bad[2] = static_cast<std::int32_t>(m.hp.vocab);
  std::vector<float> scratch(4 * m.hp.vocab);
  BOOST_CHECK_EXCEPTION(
      r.prefill(bad, scratch), std::out_of_range, [&](const std::out_of_range& e) {
        return std::string(e.what()).find("token id " + std::to_string(m.hp.vocab) +
                                          " is not below the vocabulary size") != std::string::npos;
      });
  std::vector<std::int32_t> too_many(21, 1);
  std::vector<float> more(21 * m.hp.vocab);
  BOOST_CHECK_THROW(r.prefill(too_many, more), std::length_error);
  BOOST_CHECK_THROW(r.decode(-1, std::span(scratch).first(m.hp.vocab)), std::out_of_range);
  BOOST_TEST(r.position() == 10u);
  r.prefill(std::span(tokens).subspan(10), std::span(logits).subspan(10 * m.hp.vocab));
  BOOST_TEST(std::memcmp(logits.data(), expected.data(), logits.size() * sizeof(float)) == 0);
}
