// Files emberd opens under its work root, where a script job's user can write (issue 31).
//
// A root emberd with script_user hands each job directory to the script's user, so any name in it
// may be a symlink, a FIFO or a directory the script swapped in, and nothing reached through a path
// string there can be trusted. Every open here walks down from the work root one component at a
// time with openat(O_DIRECTORY|O_NOFOLLOW) (a symlink anywhere below the root fails with
// ELOOP/ENOTDIR), opens the last component O_NOFOLLOW, and:
//   * the daemon's own directories (logs/, uploads/, .ember/) must be owned by the daemon's user
//     and writable by no one else ("own": FAILED_PRECONDITION otherwise), so nothing in them was
//     planted by the script;
//   * new files are created O_CREAT|O_EXCL (never through an existing name) and renamed into place;
//   * reads take regular files only, opened O_NONBLOCK (a FIFO never blocks the daemon).
// Thread-safe (no shared state).
#ifndef EMBER_RUNTIME_DAEMON_JOB_FILES_H_
#define EMBER_RUNTIME_DAEMON_JOB_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::daemon {

// An owned file descriptor (-1 = none), closed on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

inline constexpr gid_t kNoGroup = static_cast<gid_t>(-1);

// The directory root/rel (rel "" = root itself): root opened as given (the daemon's configured
// work root), then each '/'-separated component of rel with O_DIRECTORY|O_NOFOLLOW. `create`:
// missing components are made (0750, and group `group` unless kNoGroup). `own`: the last
// directory must be owned by geteuid() and not writable by group or others. Errors name the path:
// FAILED_PRECONDITION for a symlink or a directory that is not the daemon's, else from errno.
absl::StatusOr<Fd> OpenDirBelow(const std::string& root, absl::string_view rel, bool create,
                                bool own, gid_t group = kNoGroup);

// The daemon's own directory root/rel for the files it writes there (logs/, .ember/, uploads/):
// created 0750 (group `group`, so the script's user can read what it needs), and when a directory
// that is not the daemon's sits at that name (a script replaced it), that one is renamed aside to
// "<name>.untrusted-<unix ms>" (logged) and a fresh one made (then *replaced, when given, is set).
// Its parent must not be a symlink.
absl::StatusOr<Fd> MakeOwnDir(const std::string& root, absl::string_view rel, gid_t group,
                              bool* replaced = nullptr);

// Opens the file root/rel with `flags` (| O_NOFOLLOW | O_CLOEXEC; reads also O_NONBLOCK and must
// find a regular file). `own_dir`: its directory must be the daemon's (OpenDirBelow's `own`).
absl::StatusOr<Fd> OpenFileBelow(const std::string& root, absl::string_view rel, int flags,
                                 mode_t mode, bool own_dir);

// Replaces root/rel with `data` (mode exactly `mode`, group `group` unless kNoGroup): written to
// a fresh O_EXCL temporary in the same directory, renamed over rel (a symlink at rel is replaced,
// never followed). Safe in a directory another user can write; `own_dir` as above.
absl::Status WriteFileBelow(const std::string& root, absl::string_view rel, absl::string_view data,
                            mode_t mode, gid_t group, bool own_dir);

// The last `n` lines of the open file `fd` (at most 64 KiB read from its end).
std::vector<std::string> TailLinesOfFd(int fd, int n);

// The last `n` lines of root/rel, a file in a directory of the daemon's; none when it cannot be
// opened safely.
std::vector<std::string> TailOwnFile(const std::string& root, absl::string_view rel, int n);

// When the log `name` in the directory `dir_fd` exceeds max_bytes: shifts name.1 .. name.<keep-1>
// up by one (renameat: a planted name is moved, never followed), copies the log into a fresh
// O_EXCL file (0640, the log's group) renamed to name.1, and truncates the log through its own
// descriptor. Copy-truncate, not rename, because the ranks hold the log open O_APPEND across
// daemon restarts: a renamed log would keep their output. Returns true when it rotated.
bool RotateLogIfLarger(int dir_fd, const std::string& name, int64_t max_bytes, int keep);

// `path` relative to `root` ("" when it is not below root/).
std::string RelativeTo(const std::string& root, const std::string& path);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_JOB_FILES_H_
