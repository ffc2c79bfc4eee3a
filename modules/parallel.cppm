// ringkv.parallel — the thread-pool interface the kernels split work over, and the pool ringkv
// owns. A task is a non-owning reference to a callable (no std::function, nothing allocated per
// task or per call), handed out by index.
module;
#include <cstddef>
#include <memory>
#include <type_traits>
export module ringkv.parallel;

export namespace ringkv {

/// A non-owning reference to a callable `void(std::size_t index)`: an object pointer and a
/// function pointer. The callable must outlive every call (a lambda passed straight to
/// parallel_for lives until parallel_for returns). Copying it copies the reference.
class task_ref {
 public:
  /// Refers to `f` (an lvalue or a temporary alive for the call); O(1), no allocation.
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, task_ref> &&
             std::is_object_v<std::remove_reference_t<F>> &&
             std::is_invocable_v<std::remove_reference_t<F>&, std::size_t>)
  task_ref(F&& f) noexcept  // NOLINT(google-explicit-constructor): a callable is a task
      : object_(const_cast<void*>(static_cast<const volatile void*>(std::addressof(f)))),
        call_(&invoke<std::remove_reference_t<F>>) {}
  /// Refers to a plain function; O(1).
  task_ref(void (*f)(std::size_t)) noexcept : function_(f), call_(&invoke_function) {}

  /// Runs the task for `index`; whatever the callable throws propagates.
  void operator()(std::size_t index) const { call_(*this, index); }

 private:
  template <class F>
  static void invoke(const task_ref& t, std::size_t index) {
    (*static_cast<F*>(t.object_))(index);
  }
  static void invoke_function(const task_ref& t, std::size_t index) { t.function_(index); }

  union {
    void* object_;
    void (*function_)(std::size_t);
  };
  void (*call_)(const task_ref&, std::size_t);
};

/// What ringkv splits work over: run fn(0) … fn(n − 1), each exactly once, on the pool's threads,
/// in any order and any interleaving, and return when all have finished. Implementations must
/// not allocate per call; a caller's own pool (an inference runtime's) can implement this.
class thread_pool {
 public:
  virtual ~thread_pool() = default;
  /// How many threads run tasks at once (the caller's included); ≥ 1. Work is split for this.
  virtual std::size_t size() const noexcept = 0;
  /// Runs fn(i) for every i in [0, n) and returns when all are done; n = 0 returns at once. If
  /// a task throws, the first exception is rethrown here after every running task has returned.
  virtual void parallel_for(std::size_t n, task_ref fn) = 0;
};

/// The pool ringkv owns: size() − 1 std::jthread workers, and the calling thread takes part.
/// Each thread takes its own share of the indices first (the caller the first n / size(), each
/// worker the next), then any the others have not started, so uneven tasks balance and a call
/// of the same n gives each thread the same share while all keep up (n ≤ 64; beyond, one
/// counter hands out the indices).
/// Calls from several threads at once are serialised (one parallel_for runs at a time); a task
/// that calls parallel_for on the pool that runs it gets its tasks run inline, in order, on its
/// own thread (no deadlock). A task that throws: tasks not yet started are skipped, those
/// running finish, and parallel_for rethrows the first exception; the pool stays usable.
/// Workers sleep on a condition variable between calls; the destructor stops and joins them.
class default_thread_pool final : public thread_pool {
 public:
  /// `threads` in all (the caller included); 0: std::thread::hardware_concurrency() (1 when it
  /// is unknown). Starts threads − 1 workers (allocates their state once); O(threads).
  explicit default_thread_pool(std::size_t threads = 0);
  /// Stops and joins the workers (a parallel_for must not be running); O(threads).
  ~default_thread_pool() override;
  default_thread_pool(const default_thread_pool&) = delete;
  default_thread_pool& operator=(const default_thread_pool&) = delete;

  /// Threads in all, the caller included; O(1).
  std::size_t size() const noexcept override;
  /// See thread_pool::parallel_for. Size 1, n = 1 or a nested call: every task inline on the
  /// caller, in index order. Otherwise wakes the workers once; no allocation (unless a task
  /// throws: the exception is kept). O(n) tasks + one wake-up.
  void parallel_for(std::size_t n, task_ref fn) override;

 private:
  class shared;  // the workers' rendezvous (src/parallel/parallel.cpp)
  std::unique_ptr<shared> shared_;
};

}  // namespace ringkv
