// block_arena: a memfd (Linux) or an unlinked POSIX shared-memory object elsewhere, mapped once
// for the arena's own access and block by block into the dense layers' reservations.
#include "pool/block_arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <string>
#include <system_error>
#include <utility>

namespace ringkv::pool_detail {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), "ringkv::kv_cache_pool: " + what);
}

int shared_file() {
#if defined(__linux__)
  const int fd = memfd_create("ringkv-pool", MFD_CLOEXEC);
#else
  const std::string name = "/ringkv-pool-" + std::to_string(::getpid());
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) shm_unlink(name.c_str());
#endif
  if (fd < 0) fail("cannot create the blocks' shared memory");
  return fd;
}

}  // namespace

std::size_t page_bytes() noexcept {
  static const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
  return page;
}

reservation::reservation(std::size_t bytes) : bytes_(bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot reserve " + std::to_string(bytes) + " bytes of addresses");
  data_ = static_cast<std::byte*>(p);
}

reservation::reservation(reservation&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

reservation& reservation::operator=(reservation&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

reservation::~reservation() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

block_arena::block_arena(std::size_t unit_bytes, std::size_t units)
    : unit_bytes_(unit_bytes), refs_(units, 0) {
  free_.reserve(units);
  for (std::size_t u = units; u-- > 0;) free_.push_back(unit(u));
  if (units == 0) return;
  fd_ = shared_file();
  const std::size_t bytes = units * unit_bytes;
  if (ftruncate(fd_, off_t(bytes)) != 0) {
    close(fd_);
    fail("cannot size the blocks' shared memory to " + std::to_string(bytes) + " bytes");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    close(fd_);
    fail("cannot map the blocks' shared memory");
  }
  base_ = static_cast<std::byte*>(p);
}

block_arena::~block_arena() {
  if (base_ != nullptr) munmap(base_, refs_.size() * unit_bytes_);
  if (fd_ >= 0) close(fd_);
}

unit block_arena::take() noexcept {
  const unit u = free_.back();
  free_.pop_back();
  refs_[u] = 1;
  return u;
}

void block_arena::drop(unit u) noexcept {
  if (--refs_[u] == 0) free_.push_back(u);
}

std::size_t block_arena::shared() const noexcept {
  std::size_t n = 0;
  for (const std::uint32_t r : refs_) n += r > 1 ? 1 : 0;
  return n;
}

void block_arena::map(std::byte* where, unit u, std::size_t bytes) const {
  // Populated: one call maps every page instead of a fault a page on the first appends.
  // Re-measure: build/release/bench/batch_bench --benchmark_filter='^pool/'
  void* p = mmap(where, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd_,
                 off_t(std::size_t(u) * unit_bytes_));
  if (p == MAP_FAILED) fail("cannot map a block into a dense layer");
}

void block_arena::unmap(std::byte* where, std::size_t bytes) noexcept {
  // Back to reserved addresses (not munmap: another mapping must not land in the layer's range).
  // Left mapped, the range would still see a block another sequence may take next: stop.
  if (mmap(where, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
           0) == MAP_FAILED)
    std::terminate();
}

}  // namespace ringkv::pool_detail
