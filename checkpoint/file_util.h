// POSIX file helpers for checkpoints: a buffered writer with fsync, read-only memory maps,
// bounded-memory range reads. Errors carry the path (ErrnoToStatus). Inputs are read only from regular files (a FIFO or device is an
// INVALID_ARGUMENT, never a hang). Files are created 0640 and directories 0750 (kFileMode,
// kDirMode; docs/operations.md, "File permissions").
// Each object is thread-compatible (one thread at a time); the free functions are thread-safe.
#ifndef EMBER_CHECKPOINT_FILE_UTIL_H_
#define EMBER_CHECKPOINT_FILE_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/base/files.h"

namespace ember::ckpt {

inline constexpr mode_t kFileMode = 0640;  // owner read/write, the service's group reads
inline constexpr mode_t kDirMode = 0750;

// Appends to a new file (O_TRUNC) through a 4 MiB buffer; big appends go straight to write(2).
class FileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<FileWriter>> Create(const std::string& path);
  ~FileWriter();  // closes without syncing if Close() was not called
  absl::Status Append(absl::string_view data);
  absl::Status Flush();
  absl::Status Sync();   // Flush + fdatasync
  absl::Status Close();  // Flush + close (no sync)
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  FileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status WriteAll(const char* p, size_t n);
  int fd_;
  std::string path_;
  std::string buf_;
  uint64_t size_ = 0;
};

// A read-only MAP_PRIVATE mapping of a whole file (empty files map to an empty view).
// The mapped bytes are valid while the object lives. Thread-safe for concurrent reads.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  absl::string_view bytes() const { return absl::string_view(data_, size_); }
  const std::string& path() const { return path_; }

 private:
  MappedFile(const char* data, size_t size, std::string path)
      : data_(data), size_(size), path_(std::move(path)) {}
  const char* data_;
  size_t size_;
  std::string path_;
};

// A regular file open for positional reads; size() is its size when opened. Thread-safe.
class RegularFile {
 public:
  static absl::StatusOr<std::unique_ptr<RegularFile>> Open(const std::string& path);
  ~RegularFile();
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Calls `fn` on consecutive pieces of at most `piece` bytes covering [offset, offset + length),
  // so memory stays bounded by `piece` whatever the length. DATA_LOSS if the file ends early.
  absl::Status ReadRange(uint64_t offset, uint64_t length,
                         const std::function<absl::Status(absl::string_view)>& fn,
                         size_t piece = 4 << 20) const;

 private:
  RegularFile(int fd, uint64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}
  int fd_;
  uint64_t size_;
  std::string path_;
};

// Atomic replace, directory fsync and `mkdir -p` are runtime/base/files.h's (base::WriteFileAtomic
// with kFileMode, base::SyncDir, base::MakeDirs with kDirMode).
// Reads a whole regular file; OUT_OF_RANGE if it is larger than max_size.
absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_size);
absl::Status RemoveAll(const std::string& path);
bool PathExists(const std::string& path);
std::string JoinPath(absl::string_view a, absl::string_view b);

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_FILE_UTIL_H_
