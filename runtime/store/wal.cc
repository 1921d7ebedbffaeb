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

uint32_t Crc(const char* p, size_t n) {
  return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(p), static_cast<uInt>(n)));
}
uint32_t Crc(const std::string& s) { return Crc(s.data(), s.size()); }

constexpr int64_t kScanGaveUp = -2;

// Offset of the first non-empty, checksum-valid record starting at or after `from`; -1 if none;
// kScanGaveUp after checksumming 1 GiB of candidates (bounds the scan of a huge damaged file).
int64_t FindValidRecord(const std::string& data, size_t from) {
  int64_t budget = int64_t{1} << 30;
  for (size_t q = from; q + 8 < data.size(); ++q) {
    uint32_t len = base::LoadU32LE(data.data() + q);
    if (len == 0 || len > data.size() - q - 8) continue;
    if (Crc(data.data() + q + 8, len) == base::LoadU32LE(data.data() + q + 4)) {
      return static_cast<int64_t>(q);
    }
    budget -= len;
    if (budget < 0) return kScanGaveUp;
  }
  return -1;
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
  out.file_bytes = static_cast<int64_t>(data.size());
  size_t pos = 0;
  while (pos + 8 <= data.size()) {
    uint32_t len = base::LoadU32LE(data.data() + pos);
    uint32_t crc = base::LoadU32LE(data.data() + pos + 4);
    if (len > data.size() - pos - 8) break;  // runs past the end of the file
    if (Crc(data.data() + pos + 8, len) != crc) {
      // A complete record with a bad checksum: the last one may be a page the kernel never
      // finished writing (power loss); anything after it means damage in the middle.
      out.corrupt = pos + 8 + len != data.size();
      break;
    }
    out.records.push_back(data.substr(pos + 8, len));
    out.offsets.push_back(static_cast<int64_t>(pos));
    pos += 8 + len;
  }
  out.valid_bytes = static_cast<int64_t>(pos);
  if (pos == data.size()) return out;
  // The bad record claims to run past the end of the file. That is what a torn append looks like,
  // and also what a damaged length field looks like: it is a torn tail only if no valid record
  // starts anywhere after it.
  int64_t next = FindValidRecord(data, pos + 1);
  if (next >= 0) {
    out.corrupt = true;
    out.next_valid_offset = next;
  } else if (next == kScanGaveUp) {
    out.corrupt = true;  // could not rule damage out: refuse rather than drop records
  }
  out.torn_tail = !out.corrupt;
  return out;
}

}  // namespace ember::store
