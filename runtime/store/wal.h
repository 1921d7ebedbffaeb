// File helpers for the store's durable mode: length+crc framed records, atomic file replace.
// Format: repeated { u32le length, u32le crc32 (zlib) of payload, payload }. See docs/store.md.
// Thread-compatible (no shared state).
#ifndef EMBER_RUNTIME_STORE_WAL_H_
#define EMBER_RUNTIME_STORE_WAL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::store {

// Appends one framed record holding `payload` to *out.
void AppendFramed(const std::string& payload, std::string* out);

struct FramedFile {
  std::vector<std::string> records;  // complete, checksum-valid records in order
  int64_t valid_bytes = 0;           // offset just past the last valid record
  bool torn_tail = false;            // bytes after valid_bytes were incomplete or corrupt
};

// Reads a framed file. NotFound if it does not exist. Stops at the first incomplete or corrupt
// record (a crash mid-append) and reports it through torn_tail instead of failing.
absl::StatusOr<FramedFile> ReadFramedFile(const std::string& path);

// write() all of `data` to fd, retrying on EINTR/short writes.
absl::Status WriteAll(int fd, const std::string& data, const std::string& what);

// Writes dir/name via dir/name.tmp + fsync + rename + fsync(dir): readers see old or new, never half.
absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 const std::string& data);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_WAL_H_
