// atomic_file.cpp - write_file_atomically (corpus.h): the one way every tool writes an output file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "attnfuzz/corpus.h"

namespace attnfuzz {

std::string write_file_atomically(const std::filesystem::path& path, std::string_view bytes,
                                  const struct timespec* mtime) {
  static std::atomic<uint64_t> counter{0};
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  const std::filesystem::path tmp =
      path.parent_path() / ("." + path.filename().string() + "." + host + "." + std::to_string(::getpid()) + "." +
                            std::to_string(counter++));
  const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return path.string() + ": cannot open for writing: " + std::strerror(errno);
  std::string why;
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = path.string() + ": write error: " + std::strerror(n < 0 ? errno : ENOSPC);
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (why.empty() && mtime) {
    const struct timespec ts[2] = {*mtime, *mtime};
    ::futimens(fd, ts);
  }
  if (::close(fd) != 0 && why.empty()) why = path.string() + ": write error: " + std::strerror(errno);
  if (why.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
    why = path.string() + ": cannot rename the temporary file into place: " + std::strerror(errno);
  if (!why.empty()) ::unlink(tmp.c_str());
  return why;
}

}  // namespace attnfuzz
