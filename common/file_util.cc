#include "common/file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace flashdraft {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  return absl::InternalError(absl::StrCat(path, ": ", what, ": ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Errno("read failed", path, errno);
  return buffer.str();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const std::function<void(size_t written)>& written) {
  return WriteFileAtomically(path, std::vector<absl::string_view>{contents}, written);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<absl::string_view>& pieces,
                                 const std::function<void(size_t written)>& written) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp, errno);
  constexpr size_t kChunk = size_t{16} << 20;
  size_t total = 0;
  for (absl::string_view piece : pieces) {
    const char* p = piece.data();
    size_t left = piece.size();
    while (left > 0) {
      ssize_t n = ::write(fd, p, written ? std::min(left, kChunk) : left);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        return Errno("write failed", tmp, err);
      }
      p += n;
      left -= static_cast<size_t>(n);
      total += static_cast<size_t>(n);
      if (written) written(total);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Errno("fsync/close failed", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Errno("rename failed", path, err);
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace flashdraft
