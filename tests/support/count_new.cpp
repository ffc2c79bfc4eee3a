// Counts heap allocations for the tests' "no allocation" claims. Linked into each test binary.
// Normally it replaces every form of the global operator new (the replacement is program-wide).
// Under ThreadSanitizer, whose runtime defines the global operator new itself (a second
// definition does not link), it counts every allocation of the sanitizer's allocator through
// its malloc hook instead — operator new's and malloc's alike, so the claims keep being checked.
#include "count_new.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RINGKV_TEST_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define RINGKV_TEST_TSAN 1
#endif

namespace {
std::atomic<std::uint64_t> calls{0};
}  // namespace

std::uint64_t ringkv_test::new_calls() noexcept { return calls.load(std::memory_order_relaxed); }

#ifdef RINGKV_TEST_TSAN
#include <sanitizer/allocator_interface.h>

namespace {
void count_malloc(const volatile void*, std::size_t) {
  calls.fetch_add(1, std::memory_order_relaxed);
}
void ignore_free(const volatile void*) {}

// Installed before main, so every allocation a test makes is counted.
const int hooks_installed = __sanitizer_install_malloc_and_free_hooks(count_malloc, ignore_free);
}  // namespace
#else
namespace {
void* allocate(std::size_t n, std::size_t align) {
  calls.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return allocate(n, 0); }
void* operator new[](std::size_t n) { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, std::size_t(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, 0);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, 0);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
#endif
