// The framing of the store's files (wal.log, snapshot): length+crc framed records, and a reader
// that tells a torn final record (a crash mid-append) from damage in the middle. WalLog
// (wal_log.h) is the log built on it. Format: repeated { u32le length, u32le crc32 (zlib) of
// payload, payload }. See docs/store.md. Thread-compatible (no shared state).
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
  std::vector<int64_t> offsets;      // file offset of each record's header
  int64_t valid_bytes = 0;           // offset just past the last valid record
  int64_t file_bytes = 0;            // size of the file
  // Bytes after valid_bytes are an incomplete final record (a crash mid-append): safe to drop,
  // nothing in them was acknowledged.
  bool torn_tail = false;
  // A bad record at valid_bytes is followed by a valid one at next_valid_offset: the file was
  // damaged after it was written. Dropping the rest would lose acknowledged records.
  bool corrupt = false;
  int64_t next_valid_offset = -1;    // set when corrupt and a later valid record was found
};

// Reads a framed file. NotFound if it does not exist. Stops at the first incomplete or bad record
// and classifies what follows: an incomplete record that runs to the end of the file is a torn
// tail; a checksum mismatch with more bytes after it, or a bad record followed by a valid one, is
// corruption (see FramedFile). Never fails for either; the caller decides.
absl::StatusOr<FramedFile> ReadFramedFile(const std::string& path);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_WAL_H_
