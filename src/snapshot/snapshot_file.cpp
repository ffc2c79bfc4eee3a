// ringkv.store's snapshot functions: save and load over ringkv.snapshot's format (a ringkv.store
// unit may import it: only the interface of ringkv.store must not), atomic file replacement
// (temporary file in the target's folder, fsync, rename, folder fsync) and loading from a path,
// refusing bytes after the checksum.
module;
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <istream>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <system_error>
#include <fcntl.h>
#include <unistd.h>
module ringkv.store;
import ringkv.snapshot;

namespace ringkv {
namespace {
namespace fs = std::filesystem;

[[noreturn]] void fail_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), "ringkv::replace_file: " + what);
}

// An open descriptor closed on every path out.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
  void close_checked(const std::string& what) {
    const int f = fd;
    fd = -1;
    if (::close(f) != 0) fail_errno("closing " + what);
  }
};

void sync_path(const fs::path& p, int flags, const std::string& what) {
  fd_guard g{::open(p.c_str(), flags | O_CLOEXEC)};
  if (g.fd < 0) fail_errno("opening " + what + " to sync it");
  if (::fsync(g.fd) != 0) fail_errno("fsync of " + what);
  g.close_checked(what);
}

// Creates a new empty file next to `path` with a fresh random name (so concurrent writers do not
// collide) and the mode a new file gets (0666 less the umask, unlike mkstemp's 0600).
fs::path create_temporary(const fs::path& folder, const fs::path& path) {
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, ".tmp-%08x", unsigned(random()));
    const fs::path tmp = folder / (path.filename().string() + suffix);
    fd_guard g{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666)};
    if (g.fd >= 0) {
      g.close_checked(tmp.string());
      return tmp;
    }
    if (errno != EEXIST || attempt == 100)
      fail_errno("creating a temporary file next to " + path.string());
  }
}

// Writes and syncs the temporary file; throws on any failure.
void write_synced(const fs::path& tmp, const std::function<void(std::ostream&)>& write) {
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail_errno("opening " + tmp.string());
    write(out);
    out.flush();
    if (!out) fail_errno("writing " + tmp.string());
    out.close();
    if (!out) fail_errno("closing " + tmp.string());
  }
  sync_path(tmp, O_RDONLY, tmp.string());
}
}  // namespace

void replace_file(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp = create_temporary(folder, path);
  try {
    write_synced(tmp, write);
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail_errno("renaming " + tmp.string() + " to " + path.string());
  } catch (...) {
    std::error_code ignored;  // the original error is the one to report
    fs::remove(tmp, ignored);
    throw;
  }
  // The rename is durable once the folder's entry is.
  sync_path(folder, O_RDONLY | O_DIRECTORY, folder.string());
}

void save(const kv_cache_store& store, std::ostream& out) { detail::save_snapshot(store, out); }

std::unique_ptr<kv_cache_store> load(std::istream& in, trace::sink& sink,
                                     std::size_t max_store_bytes) {
  return detail::load_snapshot(in, sink, max_store_bytes);
}

void save(const kv_cache_store& store, const fs::path& path) {
  replace_file(path, [&](std::ostream& out) { save(store, out); });
}

std::unique_ptr<kv_cache_store> load(const fs::path& path, trace::sink& sink,
                                     std::size_t max_store_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::system_error(errno, std::generic_category(),
                            "ringkv::load: cannot open " + path.string());
  auto store = load(in, sink, max_store_bytes);
  if (in.peek() != std::ifstream::traits_type::eof()) {
    in.clear();
    const auto at = std::uint64_t(in.tellg());
    throw snapshot_error("ringkv::load: trailing bytes after the checksum at byte " +
                             std::to_string(at) + " of " + path.string(),
                         at);
  }
  return store;
}

}  // namespace ringkv
