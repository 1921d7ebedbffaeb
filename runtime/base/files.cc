#include "runtime/base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::base {
namespace {

const char* FileType(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoToStatus(e, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", FileType(st.st_mode), "; only regular files are read"));
  }
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_size) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  auto too_big = [&] {
    return absl::OutOfRangeError(absl::StrCat(path, " is larger than ", max_size, " bytes"));
  };
  if (size > max_size) {
    ::close(fd);
    return too_big();
  }
  std::string out;
  out.reserve(size);
  char buf[65536];
  while (true) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return ErrnoToStatus(e, absl::StrCat("read ", path));
    }
    if (r == 0) break;
    if (out.size() + static_cast<size_t>(r) > max_size) {  // grew while we read
      ::close(fd);
      return too_big();
    }
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

}  // namespace ember::base
