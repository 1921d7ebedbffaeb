// Files: reading input files safely (regular files only, so a FIFO, socket or device given as
// input is refused at once with a clear error instead of blocking the caller forever or reading
// without end), writing a file atomically and durably, writing all of a buffer to a descriptor,
// copying a file, and `mkdir -p`. Thread-safe (no shared
// state; two writers of the same path at once must be serialised by the caller).
//
//   ASSIGN_OR_RETURN(std::string text, base::ReadRegularFile(path, /*max_size=*/1 << 20));
//   RETURN_IF_ERROR(base::WriteFileAtomic(dir + "/state", text));  // old or new, never half
#ifndef EMBER_RUNTIME_BASE_FILES_H_
#define EMBER_RUNTIME_BASE_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::base {

// Opens `path` read-only (O_CLOEXEC). The open itself never blocks (O_NONBLOCK, cleared again
// once fstat shows a regular file). INVALID_ARGUMENT naming the path and its file type when it is
// not a regular file (a directory, FIFO, socket or device); errno errors as ErrnoToStatus. The
// caller owns the returned descriptor and closes it. `size` (optional) receives st_size.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size = nullptr);

// Reads a whole regular file; OUT_OF_RANGE, naming the limit, when it is larger than `max_size`
// (checked against its size before reading, and again while reading).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_size);

// Replaces `path` with `contents` so that a crash at any point leaves either the old file or the
// new one: writes path + ".tmp" (with exactly `mode`, whatever the umask), fsyncs it, renames it
// over `path` and fsyncs the directory. Errors name the step and the path; the temporary file is
// removed on a failed write.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents,
                             mode_t mode = 0644);

// fsync(2) on a directory, so renames and creations inside it are durable.
absl::Status SyncDir(const std::string& dir);

// `mkdir -p`: creates `dir` and its missing parents with `mode` (existing directories keep their
// mode). FAILED_PRECONDITION when `dir` (or a parent) exists and is not a directory.
absl::Status MakeDirs(const std::string& dir, mode_t mode = 0755);

// write(2) of all of `data` to `fd`, retrying short writes and EINTR: the streaming half of the
// above, for files kept open (an append-only log). Errors say "write <what>".
absl::Status WriteAll(int fd, absl::string_view data, absl::string_view what);

// Copies the regular file `from` to the new file `to` (created with exactly `mode`; ALREADY_EXISTS
// if it exists, so a copy never overwrites), streaming 64 KiB at a time, and fsyncs the copy.
// Errors name the step and the path; a partial copy is removed.
absl::Status CopyFile(const std::string& from, const std::string& to, mode_t mode = 0600);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_FILES_H_
