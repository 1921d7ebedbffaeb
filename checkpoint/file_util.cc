#include "checkpoint/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {
constexpr size_t kBufferSize = 4 << 20;
using base::ErrnoToStatus;
}  // namespace

absl::StatusOr<std::unique_ptr<FileWriter>> FileWriter::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
  return std::unique_ptr<FileWriter>(new FileWriter(fd, path));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileWriter::WriteAll(const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path_));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status FileWriter::Append(absl::string_view data) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
  size_ += data.size();
  if (buf_.size() + data.size() <= kBufferSize) {
    buf_.append(data.data(), data.size());
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Flush());
  if (data.size() >= kBufferSize) return WriteAll(data.data(), data.size());
  buf_.append(data.data(), data.size());
  return absl::OkStatus();
}

absl::Status FileWriter::Flush() {
  if (buf_.empty()) return absl::OkStatus();
  absl::Status s = WriteAll(buf_.data(), buf_.size());
  buf_.clear();
  return s;
}

absl::Status FileWriter::Sync() {
  RETURN_IF_ERROR(Flush());
  if (::fdatasync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync ", path_));
  return absl::OkStatus();
}

absl::Status FileWriter::Close() {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status s = Flush();
  if (::close(fd_) != 0 && s.ok()) s = ErrnoToStatus(errno, absl::StrCat("close ", path_));
  fd_ = -1;
  return s;
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return ErrnoToStatus(e, absl::StrCat("stat ", path));
  }
  size_t size = static_cast<size_t>(st.st_size);
  const char* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return ErrnoToStatus(e, absl::StrCat("mmap ", path));
    }
    data = static_cast<const char*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(data, size, path));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
}

absl::Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open dir ", dir));
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return ErrnoToStatus(e, absl::StrCat("fsync dir ", dir));
  return absl::OkStatus();
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents) {
  std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(std::unique_ptr<FileWriter> w, FileWriter::Create(tmp));
  RETURN_IF_ERROR(w->Append(contents));
  RETURN_IF_ERROR(w->Sync());
  RETURN_IF_ERROR(w->Close());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncDir(dir.empty() ? "." : dir);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string out;
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
    if (out.size() + static_cast<size_t>(r) > max_size) {
      ::close(fd);
      return absl::OutOfRangeError(absl::StrCat(path, " is larger than ", max_size, " bytes"));
    }
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string JoinPath(absl::string_view a, absl::string_view b) {
  if (a.empty()) return std::string(b);
  if (a.back() == '/') return absl::StrCat(a, b);
  return absl::StrCat(a, "/", b);
}

}  // namespace ember::ckpt
