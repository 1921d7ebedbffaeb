#include "runtime/base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

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

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", dir, " to fsync it"));
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(e, absl::StrCat("fsync directory ", dir));
  return absl::OkStatus();
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents, mode_t mode) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  auto fail = [&](const char* what) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoToStatus(e, absl::StrCat(what, " ", tmp));
  };
  // Exactly `mode`, whatever the umask or the mode of a temporary left by a crash.
  if (::fchmod(fd, mode) != 0) return fail("chmod");
  if (absl::Status s = WriteAll(fd, contents, tmp); !s.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::fsync(fd) != 0) return fail("fsync");
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(e, absl::StrCat("close ", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoToStatus(e, absl::StrCat("rename ", tmp, " -> ", path));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncDir(dir.empty() ? "." : dir);
}

absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  std::filesystem::path cur;
  for (const auto& part : std::filesystem::path(dir)) {
    cur /= part;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("mkdir ", cur.string()));
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " exists and is not a directory (or a parent is not)"));
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view what) {
  while (!data.empty()) {
    ssize_t w = ::write(fd, data.data(), data.size());
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", what));
    }
    data.remove_prefix(static_cast<size_t>(w));
  }
  return absl::OkStatus();
}

absl::Status CopyFile(const std::string& from, const std::string& to, mode_t mode) {
  ASSIGN_OR_RETURN(int in, OpenRegularFile(from));
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (out < 0) {
    int e = errno;
    ::close(in);
    return ErrnoToStatus(e, absl::StrCat("create ", to));
  }
  absl::Status s;
  if (::fchmod(out, mode) != 0) s = ErrnoToStatus(errno, absl::StrCat("chmod ", to));
  char buf[1 << 16];
  while (s.ok()) {
    ssize_t n = ::read(in, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) s = ErrnoToStatus(errno, absl::StrCat("read ", from));
    if (n <= 0) break;
    s = WriteAll(out, absl::string_view(buf, static_cast<size_t>(n)), to);
  }
  if (s.ok() && ::fsync(out) != 0) s = ErrnoToStatus(errno, absl::StrCat("fsync ", to));
  ::close(in);
  if (::close(out) != 0 && s.ok()) s = ErrnoToStatus(errno, absl::StrCat("close ", to));
  if (!s.ok()) ::unlink(to.c_str());
  return s;
}

}  // namespace ember::base
