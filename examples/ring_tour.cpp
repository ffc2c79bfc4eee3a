// A tour of the ring: a KV cache layer with one attention sink and one slot of slack fills up and
// wraps. Each step shows the positions held, the window the next query attends as the runs it
// physically is (slots and positions), and what the trace saw: nothing, since windows are views.
// Then a gather (the one traced copy), a rolled-back speculative token, and refusals.
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>
import ringkv;

namespace trace = ringkv::trace;

namespace {
template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

std::string span_text(std::size_t first, std::size_t count) {
  if (count == 1) return std::to_string(first);
  return std::to_string(first) + ".." + std::to_string(first + count - 1);
}

std::string describe(const trace::event& e) {
  auto text = [](std::string_view s) { return std::string(s); };
  return std::visit(overloaded{
                        [&](const trace::allocation& a) {
                          return "allocation " + text(a.site) + " " + std::to_string(a.bytes) +
                                 " B";
                        },
                        [&](const trace::release& r) {
                          return "release " + text(r.site) + " " + std::to_string(r.bytes) + " B";
                        },
                        [&](const trace::adapter_inserted& a) {
                          return "adapter_inserted " + text(a.kind) + " (" + text(a.target) + ") " +
                                 std::to_string(a.bytes) + " B";
                        },
                        [&](const trace::scope_reset& s) {
                          return "scope_reset, " + std::to_string(s.live_before) + " B were live";
                        },
                        [&](const trace::kernel_run& k) { return "kernel_run " + text(k.kernel); },
                    },
                    e);
}

// Prints the events recorded since `seen` and moves `seen` past them.
void print_new_events(const trace::recorder& rec, std::size_t& seen) {
  std::size_t i = 0;
  bool any = false;
  for (const trace::event& e : rec.events())
    if (i++ >= seen) {
      std::printf("  trace    %s\n", describe(e).c_str());
      any = true;
    }
  if (!any) std::printf("  trace    (nothing: no allocation, no copy)\n");
  seen = rec.size();
}

std::string held_text(const ringkv::default_kv_cache_store& s) {
  const std::size_t n = s.length(0), start = s.window_start(0), keep = s.options().keep;
  if (n == 0) return "(none)";
  if (start == 0) return span_text(0, n);
  return span_text(0, keep) + " | " + span_text(start, n - start);
}

std::string runs_text(const ringkv::default_kv_cache_store& s, const ringkv::windowed_kv& w) {
  std::string out;
  const auto* base = s.key_storage(0).data();
  for (std::size_t i = 0; i < w.runs().size(); ++i) {
    const auto& run = w.runs()[i];
    const std::size_t slot = std::size_t(run.data() - base) / (run.head_dim() * sizeof(float));
    out += (i ? " [slots " : "[slots ") + span_text(slot, run.positions()) + " = positions " +
           span_text(w.run_first_position(i), run.positions()) + "]";
  }
  return out + (w.wrapped() ? " wrapped" : "");
}

void append_token(ringkv::default_kv_cache_store& s, std::vector<float>& row, float tag) {
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = tag + 0.01f * float(i);
  s.append(0, row, row);
}
}  // namespace

int main(int argc, char** argv) {
  trace::recorder rec(256);
  const ringkv::kv_cache_config config{.layers = 1, .kv_heads = 2, .head_dim = 4, .capacity = 6};
  const ringkv::store_options options{.sliding_window = true, .keep = 1, .slack = 1};
  ringkv::default_kv_cache_store store(config, options, rec);
  std::printf(
      "ring: capacity %zu, keep %zu (a sink in slot 0), slack %zu -> attention window W = "
      "%zu (the sink + %zu newest)\n",
      config.capacity, options.keep, options.slack, store.attention_window(),
      store.attention_window() - options.keep);
  std::size_t seen = 0;
  print_new_events(rec, seen);

  std::vector<float> row(config.row_floats());
  for (std::size_t p = 0; p < 10; ++p) {
    const std::size_t start_before = store.window_start(0);
    append_token(store, row, float(p));
    std::printf("\nstep %zu: append position %zu -> slot %zu", p, p, store.slot_of(p));
    if (store.window_start(0) != start_before)
      std::printf(" (overwrites position %zu)", start_before == 0 ? options.keep : start_before);
    std::printf("\n  held     %-16s window_start %zu, length %zu\n", held_text(store).c_str(),
                store.window_start(0), store.length(0));
    const auto q = store.query_window(p);
    const auto w = store.key_window(0, q.from, q.to);
    std::printf("  window   query %zu attends [%zu, %zu) + sink: %s\n", p, q.from, q.to,
                runs_text(store, w).c_str());
    print_new_events(rec, seen);
  }

  ringkv::scope arena(4096, rec);
  std::printf("\na kernel that cannot iterate runs gathers the window once:\n");
  const auto q = store.query_window(9);
  const auto gathered = store.key_window(0, q.from, q.to).gather(arena, rec, "keys");
  std::printf("  gathered [%zu heads, %zu positions, %zu head_dim] contiguous\n", gathered.heads(),
              gathered.positions(), gathered.head_dim());
  print_new_events(rec, seen);

  std::printf("\nspeculative decoding: two draft tokens, then both rejected (truncate to 10):\n");
  append_token(store, row, 100.0f);
  append_token(store, row, 101.0f);
  store.truncate(0, 10);
  std::printf("  held     %-16s window_start %zu, length %zu\n", held_text(store).c_str(),
              store.window_start(0), store.length(0));
  try {
    store.truncate(0, 7);
  } catch (const std::out_of_range& e) {
    std::printf("  refused  %s\n", e.what());
  }
  try {
    store.key_window(0, 2, 10);
  } catch (const std::out_of_range& e) {
    std::printf("  refused  %s\n", e.what());
  }
  print_new_events(rec, seen);

  const auto m = store.memory();
  std::printf("\nmemory: %zu B physical, %zu B logical held, compression %.1fx\n", m.physical_bytes,
              m.logical_bytes, m.compression_ratio);
  if (argc > 2 && std::string(argv[1]) == "--trace") {
    std::ofstream out(argv[2]);
    trace::write_chrome_trace(out, rec);
    std::printf("wrote %s\n", argv[2]);
  }
  return 0;
}
