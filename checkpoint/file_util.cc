#include "checkpoint/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {
constexpr size_t kBufferSize = 4 << 20;
using base::ErrnoToStatus;
}  // namespace

absl::StatusOr<std::unique_ptr<FileWriter>> FileWriter::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, kFileMode);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("create ", path));
  ::fchmod(fd, kFileMode);  // a leftover file keeps its old mode through O_TRUNC
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
  uint64_t file_size = 0;
  ASSIGN_OR_RETURN(int fd, base::OpenRegularFile(path, &file_size));
  size_t size = static_cast<size_t>(file_size);
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

absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_size) {
  return base::ReadRegularFile(path, max_size);
}

absl::StatusOr<std::unique_ptr<RegularFile>> RegularFile::Open(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(int fd, base::OpenRegularFile(path, &size));
  return std::unique_ptr<RegularFile>(new RegularFile(fd, size, path));
}

RegularFile::~RegularFile() { ::close(fd_); }

absl::Status RegularFile::ReadRange(uint64_t offset, uint64_t length,
                                    const std::function<absl::Status(absl::string_view)>& fn,
                                    size_t piece) const {
  std::string buf(static_cast<size_t>(std::min<uint64_t>(piece, length)), '\0');
  while (length > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), length));
    ssize_t r = ::pread(fd_, buf.data(), want, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path_, " at offset ", offset));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat(path_, " ends at offset ", offset, ", ", length,
                                              " bytes short of the range asked for"));
    }
    RETURN_IF_ERROR(fn(absl::string_view(buf.data(), static_cast<size_t>(r))));
    offset += static_cast<uint64_t>(r);
    length -= static_cast<uint64_t>(r);
  }
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
