// Built against the installed package by scripts/test; returns non-zero on a wrong answer.
#include <cstdio>
import ringkv;

int main() {
  ringkv::trace::recorder rec(16);
  {
    ringkv::storage s(4096, "consumer", rec);
    ringkv::scope arena(1024, rec);
    auto v = arena.allocate_view(ringkv::dtype::f32, 2, 4, 8);
    v.row<float>(1, 3)[7] = 42.0f;
    if (v.row<float>(1, 3)[7] != 42.0f) return 1;
  }
  if (rec.emitted() != 4) {  // two allocations, two releases
    std::fprintf(stderr, "expected 4 events, got %llu\n", (unsigned long long)rec.emitted());
    return 1;
  }
  std::puts("ringkv package consumer: ok");
  return 0;
}
