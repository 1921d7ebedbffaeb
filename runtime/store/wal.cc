#include "runtime/store/wal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/little_endian.h"
#include "runtime/base/status_macros.h"

namespace ember::store {
namespace {

uint32_t Crc(const std::string& s) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
}

}  // namespace

void AppendFramed(const std::string& payload, std::string* out) {
  base::AppendU32LE(static_cast<uint32_t>(payload.size()), out);
  base::AppendU32LE(Crc(payload), out);
  out->append(payload);
}

absl::StatusOr<FramedFile> ReadFramedFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return base::ErrnoToStatus(errno, absl::StrCat("open ", path));
  std::string data;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      return base::ErrnoToStatus(e, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    data.append(buf, n);
  }
  close(fd);
  FramedFile out;
  size_t pos = 0;
  while (pos + 8 <= data.size()) {
    uint32_t len = base::LoadU32LE(data.data() + pos);
    uint32_t crc = base::LoadU32LE(data.data() + pos + 4);
    if (pos + 8 + len > data.size()) break;
    std::string payload = data.substr(pos + 8, len);
    if (Crc(payload) != crc) break;
    out.records.push_back(std::move(payload));
    pos += 8 + len;
  }
  out.valid_bytes = static_cast<int64_t>(pos);
  out.torn_tail = pos != data.size();
  return out;
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& what) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return base::ErrnoToStatus(errno, absl::StrCat("write ", what));
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 const std::string& data) {
  std::string tmp = absl::StrCat(dir, "/", name, ".tmp");
  std::string final_path = absl::StrCat(dir, "/", name);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return base::ErrnoToStatus(errno, absl::StrCat("create ", tmp));
  absl::Status s = WriteAll(fd, data, tmp);
  if (s.ok() && fsync(fd) != 0) s = base::ErrnoToStatus(errno, absl::StrCat("fsync ", tmp));
  close(fd);
  RETURN_IF_ERROR(s);
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    return base::ErrnoToStatus(errno, absl::StrCat("rename ", tmp, " -> ", final_path));
  }
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return base::ErrnoToStatus(errno, absl::StrCat("open dir ", dir));
  int rc = fsync(dfd);
  int e = errno;
  close(dfd);
  if (rc != 0) return base::ErrnoToStatus(e, absl::StrCat("fsync dir ", dir));
  return absl::OkStatus();
}

}  // namespace ember::store
