// A tour of the bottom layers: traced storage, a scope that grows once and then stops
// allocating, and the recorded trace printed as a table.
#include <cstdio>
#include <fstream>
#include <string>
#include <variant>
import ringkv;

namespace trace = ringkv::trace;

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

int main(int argc, char** argv) {
  trace::recorder rec(64);
  {
    ringkv::storage keys(4 * 64 * 32 * sizeof(float), "kv-layer0-keys", rec);
    ringkv::scope arena(4096, rec);
    for (int forward = 0; forward < 3; ++forward) {
      arena.allocate_view(ringkv::dtype::f32, 4, 16, 32);  // 8 KiB: grows on the first forward
      arena.reset();
    }
  }
  std::printf("%-4s %-18s %-20s %10s\n", "#", "event", "site/kind", "bytes");
  int i = 0;
  for (const trace::event& e : rec.events()) {
    std::visit(overloaded{
                   [&](const trace::allocation& a) {
                     std::printf("%-4d %-18s %-20.*s %10zu\n", i, "allocation", int(a.site.size()),
                                 a.site.data(), a.bytes);
                   },
                   [&](const trace::release& r) {
                     std::printf("%-4d %-18s %-20.*s %10zu\n", i, "release", int(r.site.size()),
                                 r.site.data(), r.bytes);
                   },
                   [&](const trace::adapter_inserted& a) {
                     std::printf("%-4d %-18s %-20.*s %10zu\n", i, "adapter", int(a.kind.size()),
                                 a.kind.data(), a.bytes);
                   },
                   [&](const trace::scope_reset& s) {
                     std::printf("%-4d %-18s %-20s %10zu\n", i, "scope_reset", "live before",
                                 s.live_before);
                   },
                   [&](const trace::kernel_run& k) {
                     std::printf("%-4d %-18s %-20.*s %10zu\n", i, "kernel_run",
                                 int(k.kernel.size()), k.kernel.data(), k.bytes_read);
                   },
               },
               e);
    ++i;
  }
  if (argc > 2 && std::string(argv[1]) == "--trace") {
    std::ofstream out(argv[2]);
    trace::write_chrome_trace(out, rec);
    std::printf("wrote %s\n", argv[2]);
  }
  return 0;
}
