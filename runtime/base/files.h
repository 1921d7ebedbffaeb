// Opening and reading input files safely: regular files only, so a FIFO, socket or device given
// as input is refused at once (with a clear error) instead of blocking the caller forever or
// reading without end. Thread-safe (no shared state).
//
//   ASSIGN_OR_RETURN(std::string text, base::ReadRegularFile(path, /*max_size=*/1 << 20));
#ifndef EMBER_RUNTIME_BASE_FILES_H_
#define EMBER_RUNTIME_BASE_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ember::base {

// Opens `path` read-only (O_CLOEXEC). The open itself never blocks (O_NONBLOCK, cleared again
// once fstat shows a regular file). INVALID_ARGUMENT naming the path and its file type when it is
// not a regular file (a directory, FIFO, socket or device); errno errors as ErrnoToStatus. The
// caller owns the returned descriptor and closes it. `size` (optional) receives st_size.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size = nullptr);

// Reads a whole regular file; OUT_OF_RANGE, naming the limit, when it is larger than `max_size`
// (checked against its size before reading, and again while reading).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_size);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_FILES_H_
