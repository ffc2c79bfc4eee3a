// Built against the installed package by scripts/test; returns non-zero on a wrong answer.
#include <cstdio>
import ringkv;

int main() {
  ringkv::trace::recorder rec(16);
  {
    ringkv::storage s(4096, "consumer", rec);
    ringkv::scope arena(1024, rec);
    // row() is a template compiled here, from the installed interface: in a dense
    // [2 heads, 4 positions, 8 dims] view, row (1, 3) is the 8th row of 8 floats.
    auto v = arena.allocate_view(ringkv::dtype::f32, 2, 4, 8);
    const auto row = v.row<float>(1, 3);
    if (row.data() != reinterpret_cast<float*>(v.data()) + 7 * 8 || row.size() != 8) {
      std::fprintf(stderr, "row (1, 3) is not the 8th row of 8 floats\n");
      return 1;
    }
  }
  if (rec.emitted() != 4) {  // two allocations, two releases
    std::fprintf(stderr, "expected 4 events, got %llu\n", (unsigned long long)rec.emitted());
    return 1;
  }
  std::puts("ringkv package consumer: ok");
  return 0;
}
