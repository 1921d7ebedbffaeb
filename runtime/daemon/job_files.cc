#include "runtime/daemon/job_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

absl::Status FromErrno(int err, absl::string_view what, absl::string_view path) {
  std::string msg = absl::StrCat(what, " ", path, ": ", strerror(err));
  if (err == ELOOP || err == ENOTDIR) {
    return absl::FailedPreconditionError(absl::StrCat(
        msg, " (a symlink, or not a directory, where emberd expects its own file or directory: "
             "the job's script put it there; emberd does not follow it)"));
  }
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

absl::Status CheckOwn(int fd, absl::string_view path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return FromErrno(errno, "stat", path);
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is owned by uid ", st.st_uid, " with mode ",
        absl::StrFormat("%04o", st.st_mode & 07777), ": emberd keeps its own files there only in a directory of its own (uid ", ::geteuid(),
        ", not group/other-writable); it was replaced, and emberd does not use it"));
  }
  return absl::OkStatus();
}

std::vector<std::string> Components(absl::string_view rel) {
  std::vector<std::string> out;
  for (absl::string_view c : absl::StrSplit(rel, '/', absl::SkipEmpty())) out.emplace_back(c);
  return out;
}

// A unique name for a temporary next to `base`.
std::string TempName(absl::string_view base) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ ::getpid());
  return absl::StrCat(".", base, ".tmp-", ::getpid(), "-", rng() % 1000000000);
}

}  // namespace

absl::StatusOr<Fd> OpenDirBelow(const std::string& root, absl::string_view rel, bool create,
                                bool own, gid_t group) {
  Fd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return FromErrno(errno, "open", root);
  std::string path = root;
  for (const std::string& c : Components(rel)) {
    if (c == "." || c == "..") {
      return absl::InvalidArgumentError(absl::StrCat("'", rel, "': no . or .. components"));
    }
    path = absl::StrCat(path, "/", c);
    int fd = ::openat(dir.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(dir.get(), c.c_str(), 0750) != 0 && errno != EEXIST) {
        return FromErrno(errno, "mkdir", path);
      }
      fd = ::openat(dir.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        ::fchmod(fd, 0750);  // whatever the umask
        if (group != kNoGroup) (void)!::fchown(fd, static_cast<uid_t>(-1), group);
      }
    }
    if (fd < 0) return FromErrno(errno, "open", path);
    dir = Fd(fd);
  }
  if (own) {
    absl::Status s = CheckOwn(dir.get(), path);
    if (!s.ok()) return s;
  }
  return dir;
}

absl::StatusOr<Fd> MakeOwnDir(const std::string& root, absl::string_view rel, gid_t group,
                              bool* replaced) {
  if (replaced != nullptr) *replaced = false;
  auto first = OpenDirBelow(root, rel, /*create=*/true, /*own=*/true, group);
  if (first.ok() || !absl::IsFailedPrecondition(first.status())) {
    if (first.ok() && group != kNoGroup) (void)!::fchown(first->get(), static_cast<uid_t>(-1), group);
    return first;
  }
  // Not the daemon's (or a symlink) at the last name: move it aside, make a fresh one.
  const size_t slash = rel.rfind('/');
  const std::string parent_rel(slash == absl::string_view::npos ? "" : rel.substr(0, slash));
  const std::string name(slash == absl::string_view::npos ? rel : rel.substr(slash + 1));
  if (name.empty()) return first.status();
  auto parent = OpenDirBelow(root, parent_rel, /*create=*/false, /*own=*/false);
  if (!parent.ok()) return parent.status();
  const std::string aside = absl::StrCat(name, ".untrusted-", absl::ToUnixMillis(absl::Now()));
  if (::renameat(parent->get(), name.c_str(), parent->get(), aside.c_str()) != 0) {
    return FromErrno(errno, "rename aside", absl::StrCat(root, "/", rel));
  }
  spdlog::warn("{}/{}: {}; moved it to {} and made a fresh one", root, std::string(rel),
               std::string(first.status().message()), aside);
  if (replaced != nullptr) *replaced = true;
  return OpenDirBelow(root, rel, /*create=*/true, /*own=*/true, group);
}

// rel = "<dir_rel>/<name>" (dir_rel "" when rel has no '/'); a name of "", "." or ".." is refused.
static absl::Status SplitFileRel(absl::string_view rel, std::string* dir_rel, std::string* name) {
  const size_t slash = rel.rfind('/');
  *dir_rel = std::string(slash == absl::string_view::npos ? "" : rel.substr(0, slash));
  *name = std::string(slash == absl::string_view::npos ? rel : rel.substr(slash + 1));
  if (name->empty() || *name == "." || *name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", rel, "': not a file name"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> OpenFileBelow(const std::string& root, absl::string_view rel, int flags,
                                 mode_t mode, bool own_dir) {
  std::string dir_rel, name;
  if (absl::Status s = SplitFileRel(rel, &dir_rel, &name); !s.ok()) return s;
  auto dir = OpenDirBelow(root, dir_rel, /*create=*/false, own_dir);
  if (!dir.ok()) return dir.status();
  const bool read_only = (flags & O_ACCMODE) == O_RDONLY;
  const int fd = ::openat(dir->get(), name.c_str(),
                          flags | O_NOFOLLOW | O_CLOEXEC | (read_only ? O_NONBLOCK : 0), mode);
  const std::string path = absl::StrCat(root, "/", rel);
  if (fd < 0) return FromErrno(errno, "open", path);
  Fd f(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return FromErrno(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (read_only) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return f;
}

absl::Status WriteFileBelow(const std::string& root, absl::string_view rel, absl::string_view data,
                            mode_t mode, gid_t group, bool own_dir) {
  std::string dir_rel, name;
  if (absl::Status s = SplitFileRel(rel, &dir_rel, &name); !s.ok()) return s;
  auto dir = OpenDirBelow(root, dir_rel, /*create=*/false, own_dir);
  if (!dir.ok()) return dir.status();
  const std::string path = absl::StrCat(root, "/", rel);
  const std::string tmp = TempName(name);
  Fd f(::openat(dir->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                mode));
  if (f.get() < 0) return FromErrno(errno, "create a temporary for", path);
  absl::Status st;
  if (::fchmod(f.get(), mode) != 0 ||
      (group != kNoGroup && ::fchown(f.get(), static_cast<uid_t>(-1), group) != 0)) {
    st = FromErrno(errno, "set the mode of", path);
  }
  for (size_t off = 0; st.ok() && off < data.size();) {
    ssize_t w = ::write(f.get(), data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      st = FromErrno(errno, "write", path);
      break;
    }
    off += static_cast<size_t>(w);
  }
  if (st.ok() && ::fsync(f.get()) != 0) st = FromErrno(errno, "fsync", path);
  if (st.ok() && ::renameat(dir->get(), tmp.c_str(), dir->get(), name.c_str()) != 0) {
    st = FromErrno(errno, "rename into place", path);
  }
  if (!st.ok()) ::unlinkat(dir->get(), tmp.c_str(), 0);
  return st;
}

std::vector<std::string> TailLinesOfFd(int fd, int n) {
  std::vector<std::string> out;
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) return out;
  off_t start = st.st_size > 65536 ? st.st_size - 65536 : 0;
  std::string buf(st.st_size - start, '\0');
  ssize_t got = ::pread(fd, buf.data(), buf.size(), start);
  if (got <= 0) return out;
  buf.resize(got);
  std::vector<std::string> lines = absl::StrSplit(buf, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (start > 0 && !lines.empty()) lines.erase(lines.begin());  // partial first line
  int from = std::max<int>(0, static_cast<int>(lines.size()) - n);
  return std::vector<std::string>(lines.begin() + from, lines.end());
}

std::vector<std::string> TailOwnFile(const std::string& root, absl::string_view rel, int n) {
  auto f = OpenFileBelow(root, rel, O_RDONLY, 0, /*own_dir=*/true);
  if (!f.ok()) {
    spdlog::warn("not reading {}/{}: {}", root, std::string(rel), std::string(f.status().message()));
    return {};
  }
  return TailLinesOfFd(f->get(), n);
}

bool RotateLogIfLarger(int dir_fd, const std::string& name, int64_t max_bytes, int keep) {
  if (keep < 1) return false;
  Fd live(::openat(dir_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  if (live.get() < 0 || ::fstat(live.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size <= max_bytes) {
    return false;
  }
  for (int i = keep - 1; i >= 1; --i) {
    ::renameat(dir_fd, absl::StrCat(name, ".", i).c_str(), dir_fd,
               absl::StrCat(name, ".", i + 1).c_str());
  }
  const std::string tmp = TempName(name);
  Fd out(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640));
  if (out.get() < 0) {
    spdlog::warn("rotating log {}: cannot create {}: {}", name, tmp, strerror(errno));
    return false;
  }
  ::fchmod(out.get(), 0640);
  (void)!::fchown(out.get(), static_cast<uid_t>(-1), st.st_gid);
  std::string buf(1 << 16, '\0');
  bool ok = true;
  for (off_t off = 0;;) {
    ssize_t got = ::pread(live.get(), buf.data(), buf.size(), off);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) ok = false;
    if (got <= 0) break;
    for (ssize_t w = 0; w < got;) {
      ssize_t n = ::write(out.get(), buf.data() + w, got - w);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ok = false;
        break;
      }
      w += n;
    }
    if (!ok) break;
    off += got;
  }
  if (!ok || ::renameat(dir_fd, tmp.c_str(), dir_fd, absl::StrCat(name, ".1").c_str()) != 0) {
    spdlog::warn("rotating log {}: {}", name, strerror(errno));
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return false;
  }
  return ::ftruncate(live.get(), 0) == 0;
}

std::string RelativeTo(const std::string& root, const std::string& path) {
  std::string prefix = root;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  prefix += "/";
  if (!absl::StartsWith(path, prefix)) return "";
  return path.substr(prefix.size());
}

}  // namespace ember::daemon
