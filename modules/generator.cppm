// ringkv.generator — a coroutine generator that is an input range for std::ranges and range-v3.
//
// Written by hand because the toolchain lacks std::generator (not in libstdc++ 12 nor libc++ 19)
// and range-v3 0.12's generator does not work with standard C++20 coroutines. Where the standard
// library has std::generator (__cpp_lib_generator), ringkv::generator is still this class, so the
// behaviour (references to the yielded value, lazy increments, exceptions out of the operation
// that runs the body: begin(), *, -> or == end) stays the same everywhere. Kept small on purpose:
// one element type, no recursive yield, no allocator.
module;
#include <coroutine>
#include <cstddef>
#include <exception>
#include <iterator>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>
#include <range/v3/range/concepts.hpp>
#include <range/v3/view/interface.hpp>
export module ringkv.generator;

export namespace ringkv {

/// A lazily evaluated sequence of T produced by a coroutine; single pass. Copies share the one
/// coroutine (reference counted in its frame, no allocation), which makes a generator
/// semiregular — range-v3 0.12 requires that of a view, so `gen() | ranges::views::take(n)` works
/// on a temporary.
///
/// Increments are lazy: begin() runs the body to its first yield, but ++ only marks an advance
/// that runs when the next value is needed (*, ->, == end, or a second ++). take(n) compares its
/// count before touching the iterator, so `decode(...) | views::take(n)` runs the body exactly n
/// times — an eager ++ would pull and append token n + 1 that nobody reads (the P2406 problem).
/// An exception from the body comes out of the operation that ran it: begin(), ++, *, or == end.
template <class T>
class generator : public std::ranges::view_base {
 public:
  using value_type = std::remove_cvref_t<T>;
  using reference = const value_type&;

  class promise_type {
   public:
    generator get_return_object() noexcept {
      return generator(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_always initial_suspend() const noexcept { return {}; }
    std::suspend_always final_suspend() const noexcept { return {}; }
    // The yielded object lives in the coroutine frame until it resumes, so a pointer suffices.
    std::suspend_always yield_value(const value_type& v) noexcept {
      current_ = std::addressof(v);
      return {};
    }
    void return_void() const noexcept {}
    void unhandled_exception() noexcept { error_ = std::current_exception(); }
    template <class U>
    void await_transform(U&&) = delete;  // a generator only yields

    const value_type* current_ = nullptr;
    std::exception_ptr error_;
    std::size_t owners_ = 1;
    bool started_ = false;
    bool pending_ = false;  // an increment not yet run
  };

  /// Iterator over the yielded values; copyable (copies share the one coroutine).
  class iterator {
   public:
    using value_type = generator::value_type;
    using reference = generator::reference;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // range-v3 adaptors read this one

    iterator() noexcept = default;
    /// The current value (runs a pending advance first), valid until the next increment.
    reference operator*() const {
      settle(coro_);
      return *coro_.promise().current_;
    }
    const value_type* operator->() const { return std::addressof(**this); }
    /// Marks an advance to the next yield; it runs when the next value is needed. O(1).
    iterator& operator++() {
      settle(coro_);
      coro_.promise().pending_ = true;
      return *this;
    }
    void operator++(int) { ++*this; }
    /// Whether the body has finished (runs a pending advance first).
    friend bool operator==(const iterator& it, std::default_sentinel_t) {
      if (!it.coro_) return true;
      settle(it.coro_);
      return it.coro_.done();
    }

   private:
    friend generator;
    explicit iterator(std::coroutine_handle<promise_type> c) noexcept : coro_(c) {}
    std::coroutine_handle<promise_type> coro_;
  };

  generator() noexcept = default;
  generator(generator&& o) noexcept : coro_(std::exchange(o.coro_, {})) {}
  generator(const generator& o) noexcept : coro_(o.coro_) {
    if (coro_) ++coro_.promise().owners_;
  }
  generator& operator=(generator o) noexcept {
    std::swap(coro_, o.coro_);
    return *this;
  }
  /// Destroys the coroutine frame with its last owner, also when the consumer stopped early.
  ~generator() {
    if (coro_ && --coro_.promise().owners_ == 0) coro_.destroy();
  }

  /// Runs the body to its first yield (once; a generator is single pass) and rethrows what it threw.
  iterator begin() {
    if (coro_ && !coro_.promise().started_) {
      coro_.promise().started_ = true;
      advance(coro_);
    }
    return iterator(coro_);
  }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  explicit generator(std::coroutine_handle<promise_type> c) noexcept : coro_(c) {}
  static void settle(std::coroutine_handle<promise_type> c) {
    if (c.promise().pending_) {
      c.promise().pending_ = false;
      advance(c);
    }
  }
  static void advance(std::coroutine_handle<promise_type> c) {
    c.promise().current_ = nullptr;
    c.resume();
    if (c.promise().error_) std::rethrow_exception(std::exchange(c.promise().error_, {}));
  }

  std::coroutine_handle<promise_type> coro_;
};

}  // namespace ringkv

// range-v3 treats a type as a view when it opts in; a generator is cheap to move and single pass.
namespace ranges {
template <class T>
inline constexpr bool enable_view<ringkv::generator<T>> = true;
}  // namespace ranges
