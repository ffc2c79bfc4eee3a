// The runner's logits against llama.cpp's, at every position, for random granite_swa and gemma3
// models (parity_support.hpp): prompts of 40 tokens (every ring wraps several times) and 320
// (llama.cpp's own 256-cell window cache wraps too: it is fed 32 tokens a batch), fed to the
// runner in one chunk, in uneven chunks, token by token and prefilled then decoded.
//
// Tolerances, on the log-softmax (natural log) of the logits, per position, divided by the size
// of that position's logits, max(1, largest |logit|): every operation's rounding is relative to
// the values it rounds, and those grow with the logits, so the same agreement gives a |Δ log p|
// that grows with them too (|Δ log p_i| ≤ |Δ logit_i| + max |Δ logit| ≤ 2 ε max |logit|). Logits
// of a few units keep the absolute bound (the size is at least 1). The set includes a
// tied-embedding model whose logits reach 100-200 (parity_support): there granite's measured
// 2.2e-7 of the logits' size is 2.3e-5 absolute, which an absolute 1e-5 would refuse.
// - granite_swa, f32: 1e-5. Both sides compute in f32 with the same order of operations where
//   it matters (RMSNorm's double sum, RoPE's angle recurrence, the order of the scales); what
//   differs is the summation order of dot products (ggml's SIMD blocking and the runner's,
//   ringkv's online softmax against ggml's two-pass one) and the vector exp in SiLU (ggml's and
//   Highway's): a few f32 ulps an operation, ~1e-7 relative through 2-4 layers. Measured worst:
//   3.2e-7, so the bound has a 30x margin and still fails a window off by one by orders of
//   magnitude.
// - gemma3, f32: 1e-3, with the runner emulating llama.cpp's CPU GELU (input rounded to f16,
//   the result read from an f16 table). The emulation makes most positions agree as granite's
//   do (measured: ~5e-7 at the first positions), but a pre-GELU value one f32 ulp on the other
//   side of an f16 rounding boundary than llama.cpp's lands on the neighbouring f16 entry: one
//   activation moves by 2^-11 relative, and that propagates to ~1e-4 (measured worst 6.8e-5).
//   So the suite also requires 80% of the positions of every prompt to agree within 1e-5, the
//   granite bound, which rare flips leave alone (measured: 97%). With the exact GELU the
//   runner computes a different function: measured worst 2.8e-4, bounded at 3e-3.
// Four sequences served together (gguf_run::batch_runner, one attend_batch a layer) are compared
// with llama.cpp serving the same four as one multi-sequence batch a step (a K/V stream a
// sequence, and one unified buffer), prefill chunks and teacher-forced decode tokens mixed in a
// step, under the same bounds (measured: granite 3.2e-7; gemma3 5.0e-5, at least 94 % of a model's
// positions within 1e-5, the share taken over a model's sequences as a flip moves the rest of one).
#define BOOST_TEST_MODULE llama_parity
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "llama_reference.hpp"
#include "parity_support.hpp"

using gguf_run::architecture;
using parity::feed;

namespace {

constexpr double granite_tolerance = 1e-5, gemma3_tolerance = 1e-3;
constexpr std::size_t prompt_lengths[] = {40, 320};
constexpr std::size_t llama_ubatch = 32;

struct llama_setup {
  llama_setup() { llama_reference::init(RINGKV_LLAMA_BINS); }
};

const std::vector<float>& reference(const parity::test_model& m, std::size_t n) {
  static std::map<std::pair<std::string, std::size_t>, std::vector<float>> cache;
  auto [it, fresh] = cache.try_emplace({m.path, n});
  if (fresh) {
    const auto tokens = parity::prompt(n, m.spec.vocab, n);
    it->second = llama_reference::logits(m.path, tokens, llama_ubatch);
  }
  return it->second;
}

/// Worst distance of the runner from llama.cpp over every model and prompt of `a`, fed as `f`;
/// prints it per position range: [0, window) (the ring still filling), [window, 256) and
/// [256, end) (llama.cpp's own cache wrapped).
/// `close_share`, when given, gets the smallest share of positions within granite_tolerance.
double worst_distance(architecture a, feed f, gguf_run::run_options o, const char* label,
                      double* close_share = nullptr) {
  double worst = 0.0;
  for (const parity::test_model& tm : parity::models(a)) {
    const gguf_run::model m = gguf_run::model::from(gguf::file::read(tm.path));
    for (std::size_t n : prompt_lengths) {
      const auto tokens = parity::prompt(n, m.hp.vocab, n);
      const auto ours = parity::run(m, tokens, f, o);
      const auto& theirs = reference(tm, n);
      BOOST_REQUIRE_EQUAL(theirs.size(), ours.size());
      const std::size_t w = m.hp.window, V = m.hp.vocab;
      const double d0 = parity::distance(ours, theirs, V, 0, std::min(w, n));
      const double d1 =
          parity::distance(ours, theirs, V, std::min(w, n), std::min<std::size_t>(256, n));
      const double d2 = parity::distance(ours, theirs, V, std::min<std::size_t>(256, n), n);
      std::printf(
          "  %-11s %-28s %3zu tokens, %-19s %-10s |logit| <= %4.1f, max |Δ log p| / size: "
          "[0,%zu) %.2e  [%zu,256) %.2e  [256,end) %.2e\n",
          gguf_run::name_of(a), tm.name.c_str(), n, parity::name_of(f), label,
          parity::largest_logit(ours, V, 0, n), w, d0, w, d1, n > 256 ? d2 : 0.0);
      for (double d : {d0, d1, d2})
        worst = std::isnan(d) || std::isnan(worst) ? NAN : std::max(worst, d);
      std::size_t close = 0;
      for (std::size_t p = 0; p < n; ++p)
        close += parity::distance(ours, theirs, V, p, p + 1) <= granite_tolerance;
      if (close_share != nullptr) *close_share = std::min(*close_share, double(close) / double(n));
    }
  }
  return worst;
}

gguf_run::run_options f32_options(architecture a) {
  gguf_run::run_options o;
  o.gelu_f16_table = a == architecture::gemma3;
  return o;
}

void check_f32(architecture a, feed f) {
  double share = 1.0;
  const double worst = worst_distance(a, f, f32_options(a), "f32", &share);
  if (a == architecture::granite_swa) {
    BOOST_TEST(worst <= granite_tolerance);
  } else {
    BOOST_TEST(worst <= gemma3_tolerance);
    std::printf("  gemma3: at least %.0f%% of the positions of every prompt within %.0e\n",
                100.0 * share, granite_tolerance);
    BOOST_TEST(share >= 0.8);
  }
}

/// Worst distance, over every model of `a`, of four sequences served together by a
/// batch_runner from llama.cpp serving them together (one multi-sequence batch a step, a
/// stream a sequence or one unified buffer): prompts of 25-60 tokens in chunks of 8, then 12
/// given tokens each through the decode path.
double worst_together(architecture a, bool unified, double* close_share) {
  constexpr std::size_t chunk = 8, decoded = 12;
  const std::size_t prompts[] = {40, 25, 60, 33};
  double worst = 0.0;
  for (const parity::test_model& tm : parity::models(a)) {
    const gguf_run::model m = gguf_run::model::from(gguf::file::read(tm.path));
    const std::size_t V = m.hp.vocab;
    std::vector<std::vector<std::int32_t>> tokens;
    std::vector<llama_reference::sequence_feed> feeds;
    for (std::size_t i = 0; i < std::size(prompts); ++i)
      tokens.push_back(parity::prompt(prompts[i] + decoded, V, 100 + i));
    for (std::size_t i = 0; i < tokens.size(); ++i) feeds.push_back({tokens[i], prompts[i]});
    const auto theirs = llama_reference::logits_together(tm.path, feeds, chunk, unified);
    gguf_run::run_options o = f32_options(a);
    o.max_positions = 80;
    gguf_run::batch_runner batch(m, o, tokens.size());
    std::vector<std::size_t> ids, fed(tokens.size(), 0), first;
    std::size_t total = 0;
    for (const auto& t : tokens) {
      ids.push_back(batch.add());
      first.push_back(total);
      total += t.size();
    }
    std::vector<float> ours(total * V);
    for (bool more = true; more;) {
      std::vector<gguf_run::batch_runner::part> parts;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        const std::size_t take = fed[i] < prompts[i]
                                     ? std::min(chunk, prompts[i] - fed[i])
                                     : std::min<std::size_t>(1, tokens[i].size() - fed[i]);
        if (take == 0) continue;
        parts.push_back({ids[i], std::span(tokens[i]).subspan(fed[i], take),
                         std::span(ours).subspan((first[i] + fed[i]) * V, take * V)});
        fed[i] += take;
      }
      more = !parts.empty();
      batch.run(parts);
    }
    BOOST_REQUIRE_EQUAL(theirs.size(), ours.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::size_t from = first[i], to = first[i] + tokens[i].size();
      const double prefill = parity::distance(ours, theirs, V, from, from + prompts[i]);
      const double decode = parity::distance(ours, theirs, V, from + prompts[i], to);
      std::printf(
          "  %-11s %-28s together (%s), sequence %zu: max |Δ log p| prefill %.2e, "
          "decode %.2e\n",
          gguf_run::name_of(a), tm.name.c_str(), unified ? "unified" : "streams", i, prefill,
          decode);
      for (double d : {prefill, decode})
        worst = std::isnan(d) || std::isnan(worst) ? NAN : std::max(worst, d);
    }
    // As the single-sequence prompts' share: over the model's positions (here its four
    // sequences'), since one GELU-table flip moves the positions after it in its sequence.
    std::size_t close = 0;
    for (std::size_t p = 0; p < total; ++p)
      close += parity::distance(ours, theirs, V, p, p + 1) <= granite_tolerance;
    *close_share = std::min(*close_share, double(close) / double(total));
  }
  return worst;
}

}  // namespace

BOOST_GLOBAL_FIXTURE(llama_setup);

BOOST_AUTO_TEST_CASE(sequences_served_together_match_llama_cpp_serving_them_together) {
  for (architecture a : {architecture::granite_swa, architecture::gemma3})
    for (bool unified : {false, true}) {
      double share = 1.0;
      const double worst = worst_together(a, unified, &share);
      std::printf(
          "  %s together (%s): worst %.2e, at least %.0f%% of a model's positions within "
          "%.0e\n",
          gguf_run::name_of(a), unified ? "unified" : "streams", worst, 100.0 * share,
          granite_tolerance);
      BOOST_TEST_INFO(gguf_run::name_of(a) << (unified ? ", unified" : ", streams"));
      if (a == architecture::granite_swa) {
        BOOST_TEST(worst <= granite_tolerance);
      } else {
        BOOST_TEST(worst <= gemma3_tolerance);
        BOOST_TEST(share >= 0.8);
      }
    }
}

BOOST_AUTO_TEST_CASE(granite_swa_logits_match_llama_cpp_at_every_position_in_one_chunk) {
  check_f32(architecture::granite_swa, feed::one_chunk);
}
BOOST_AUTO_TEST_CASE(granite_swa_logits_match_llama_cpp_at_every_position_in_uneven_chunks) {
  check_f32(architecture::granite_swa, feed::uneven_chunks);
}
BOOST_AUTO_TEST_CASE(granite_swa_logits_match_llama_cpp_at_every_position_token_by_token) {
  check_f32(architecture::granite_swa, feed::token_by_token);
}
BOOST_AUTO_TEST_CASE(granite_swa_logits_match_llama_cpp_at_every_position_prefilled_then_decoded) {
  check_f32(architecture::granite_swa, feed::prefill_then_decode);
}
BOOST_AUTO_TEST_CASE(gemma3_logits_match_llama_cpp_at_every_position_in_one_chunk) {
  check_f32(architecture::gemma3, feed::one_chunk);
}
BOOST_AUTO_TEST_CASE(gemma3_logits_match_llama_cpp_at_every_position_in_uneven_chunks) {
  check_f32(architecture::gemma3, feed::uneven_chunks);
}
BOOST_AUTO_TEST_CASE(gemma3_logits_match_llama_cpp_at_every_position_token_by_token) {
  check_f32(architecture::gemma3, feed::token_by_token);
}
BOOST_AUTO_TEST_CASE(gemma3_logits_match_llama_cpp_at_every_position_prefilled_then_decoded) {
  check_f32(architecture::gemma3, feed::prefill_then_decode);
}

BOOST_AUTO_TEST_CASE(
    gemma3_with_the_exact_gelu_stays_within_the_f16_gelu_tables_rounding_of_llama_cpp) {
  gguf_run::run_options o;
  o.gelu_f16_table = false;
  const double worst = worst_distance(architecture::gemma3, feed::one_chunk, o, "exact GELU");
  BOOST_TEST(worst <= 3e-3);
}

// f16/bf16/fp8 caches round every stored key and value, TurboQuant (4 bits) and int8 quantize them:
// their distance from llama.cpp's f32 logits is a property of the format, not a bug, so it is
// printed and only required to be finite and well below the spread of the logits themselves.
BOOST_AUTO_TEST_CASE(half_and_compressed_caches_stay_finite_and_close_to_llama_cpp_f32) {
  for (architecture a : {architecture::granite_swa, architecture::gemma3})
    for (gguf_run::cache_type c :
         {gguf_run::cache_type::f16, gguf_run::cache_type::bf16, gguf_run::cache_type::fp8,
          gguf_run::cache_type::turboquant, gguf_run::cache_type::int8}) {
      gguf_run::run_options o = f32_options(a);
      o.cache = c;
      const double worst = worst_distance(a, feed::one_chunk, o, gguf_run::name_of(c));
      BOOST_TEST(std::isfinite(worst));
      BOOST_TEST(worst < 1.0);
    }
}
