#include "runtime/daemon/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ember::daemon {
namespace {

constexpr long kCgroup2Magic = 0x63677270;  // CGROUP2_SUPER_MAGIC (linux/magic.h)

std::string ReadWhole(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 200 || name[0] == '.' || name[0] == '-' ||
      absl::StartsWith(name, "cgroup.")) {
    return false;
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", strerror(err));
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

// The directory must be this user's (or root's when `root_ok`) and writable by no one else.
absl::Status CheckOwned(int fd, const std::string& path, bool root_ok) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  const bool owner_ok = st.st_uid == ::geteuid() || (root_ok && st.st_uid == 0);
  if (!owner_ok || (st.st_mode & 022) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cgroup directory ", path, " is owned by uid ", st.st_uid, " with mode ",
        absl::Hex(st.st_mode & 07777), ": it must be uid ", ::geteuid(),
        root_ok ? " (or root)" : "", "'s and writable by no one else (remove it, or fix it)"));
  }
  return absl::OkStatus();
}

// Reads a small file below `dirfd` ("" when it cannot be read).
std::string ReadAt(int dirfd, const char* name) {
  const int fd = ::openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || out.size() > (4 << 20)) break;
    out.append(buf, n);
  }
  ::close(fd);
  return out;
}

bool WriteAt(int dirfd, const char* name, absl::string_view value) {
  const int fd = ::openat(dirfd, name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool ok = ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  ::close(fd);
  return ok;
}

std::vector<pid_t> ProcsAt(int dirfd) {
  std::vector<pid_t> out;
  for (absl::string_view line : absl::StrSplit(ReadAt(dirfd, "cgroup.procs"), '\n')) {
    int pid = 0;
    if (absl::SimpleAtoi(line, &pid) && pid > 0) out.push_back(pid);
  }
  return out;
}

// The names of the groups directly below `dirfd`.
std::vector<std::string> SubgroupsAt(int dirfd) {
  std::vector<std::string> out;
  const int dup = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dup < 0) return out;
  DIR* d = ::fdopendir(dup);
  if (d == nullptr) {
    ::close(dup);
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      is_dir = ::fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (is_dir) out.push_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

// Every process of the group at `dirfd` and of the groups below it.
void CollectProcs(int dirfd, int depth, std::vector<pid_t>* out) {
  for (pid_t p : ProcsAt(dirfd)) out->push_back(p);
  if (depth > 32) return;
  for (const std::string& sub : SubgroupsAt(dirfd)) {
    Fd fd(::openat(dirfd, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() >= 0) CollectProcs(fd.get(), depth + 1, out);
  }
}

// Removes the groups below `dirfd` (depth first); false when one stays.
bool RemoveSubgroups(int dirfd, int depth) {
  bool ok = true;
  for (const std::string& sub : SubgroupsAt(dirfd)) {
    Fd fd(::openat(dirfd, sub.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() >= 0 && depth < 32) ok = RemoveSubgroups(fd.get(), depth + 1) && ok;
    ok = (::unlinkat(dirfd, sub.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) && ok;
  }
  return ok;
}

bool Populated(int dirfd) {
  for (absl::string_view line : absl::StrSplit(ReadAt(dirfd, "cgroup.events"), '\n')) {
    if (absl::ConsumePrefix(&line, "populated ")) return line != "0";
  }
  std::vector<pid_t> procs;  // no cgroup.events: look at the processes
  CollectProcs(dirfd, 0, &procs);
  return !procs.empty();
}

bool Frozen(int dirfd) {
  for (absl::string_view line : absl::StrSplit(ReadAt(dirfd, "cgroup.events"), '\n')) {
    if (absl::ConsumePrefix(&line, "frozen ")) return line == "1";
  }
  return false;
}

int SignalEach(int dirfd) {
  std::vector<pid_t> procs;
  CollectProcs(dirfd, 0, &procs);
  int n = 0;
  for (pid_t p : procs) n += ::kill(p, SIGKILL) == 0 ? 1 : 0;
  return n;
}

}  // namespace

std::optional<Cgroup2Mount> FindCgroup2Mount(absl::string_view mountinfo) {
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    // id parent major:minor root mount_point options [optional...] - fstype source super_options
    size_t sep = 6;
    while (sep < f.size() && f[sep] != "-") ++sep;
    if (f.size() < 5 || sep + 1 >= f.size()) continue;
    if (f[sep + 1] != "cgroup2") continue;
    return Cgroup2Mount{Unescape(f[4]), Unescape(f[3])};
  }
  return std::nullopt;
}

std::optional<std::string> Cgroup2PathOf(absl::string_view proc_cgroup) {
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n')) {
    if (absl::ConsumePrefix(&line, "0::") && absl::StartsWith(line, "/")) {
      return std::string(line);
    }
  }
  return std::nullopt;
}

absl::StatusOr<std::string> OwnCgroup2Dir() {
  auto mount = FindCgroup2Mount(ReadWhole("/proc/self/mountinfo"));
  if (!mount) return absl::NotFoundError("no cgroup2 file system is mounted (/proc/self/mountinfo)");
  auto path = Cgroup2PathOf(ReadWhole("/proc/self/cgroup"));
  if (!path) return absl::NotFoundError("/proc/self/cgroup has no cgroup v2 (0::) line");
  absl::string_view rel = *path;
  if (mount->root != "/") {
    if (!absl::ConsumePrefix(&rel, mount->root) || (!rel.empty() && rel[0] != '/')) {
      return absl::NotFoundError(absl::StrCat("this process's cgroup ", *path,
                                              " is not below the cgroup2 mount's root ",
                                              mount->root, " (at ", mount->mount_point, ")"));
    }
  }
  std::string dir = mount->mount_point;
  if (rel != "/" && !rel.empty()) absl::StrAppend(&dir, rel);
  return dir;
}

std::string ProcessCgroups::LeafName(const std::string& job, int attempt) {
  std::string leaf = absl::StrCat("job-", job, ".a", attempt);
  return ValidName(job) && attempt >= 0 && ValidName(leaf) ? leaf : "";
}

std::string ProcessCgroups::Describe() const {
  const char* how = kill_ == CgroupKill::kKillFile ? "cgroup.kill"
                    : kill_ == CgroupKill::kFreeze ? "freeze, SIGKILL each, thaw"
                                                   : "SIGKILL each";
  return absl::StrCat("cgroup v2 ", dir_, " (", how, ")");
}

absl::StatusOr<std::unique_ptr<ProcessCgroups>> ProcessCgroups::Open(
    const ProcessCgroupsOptions& o) {
  if (!ValidName(o.name)) {
    return absl::InvalidArgumentError(absl::StrCat("cgroup name '", o.name, "': not one plain path component"));
  }
  std::string parent = o.parent;
  if (parent.empty()) {
    auto own = OwnCgroup2Dir();
    if (!own.ok()) return own.status();
    parent = *own + "/ember";
  }
  if (parent.empty() || parent[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("cgroup parent '", parent, "': not an absolute path"));
  }
  if (::mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("cannot make the cgroup directory ", parent));
  }
  Fd pfd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (pfd.get() < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", parent));
  struct statfs sfs;
  if (::fstatfs(pfd.get(), &sfs) != 0 || static_cast<long>(sfs.f_type) != kCgroup2Magic) {
    return absl::FailedPreconditionError(
        absl::StrCat(parent, " is not on a cgroup2 file system (give a cgroup v2 directory)"));
  }
  if (absl::Status s = CheckOwned(pfd.get(), parent, /*root_ok=*/true); !s.ok()) return s;
  const std::string dir = absl::StrCat(parent, "/", o.name);
  if (::mkdirat(pfd.get(), o.name.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("cannot make the cgroup directory ", dir));
  }
  Fd fd(::openat(pfd.get(), o.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", dir));
  if (absl::Status s = CheckOwned(fd.get(), dir, /*root_ok=*/false); !s.ok()) return s;
  CgroupKill kill = o.kill;
  const bool has_kill = ::faccessat(fd.get(), "cgroup.kill", F_OK, 0) == 0;
  const bool has_freeze = ::faccessat(fd.get(), "cgroup.freeze", F_OK, 0) == 0;
  if (kill == CgroupKill::kAuto) {
    kill = has_kill ? CgroupKill::kKillFile : has_freeze ? CgroupKill::kFreeze : CgroupKill::kSignalEach;
  } else if ((kill == CgroupKill::kKillFile && !has_kill) ||
             (kill == CgroupKill::kFreeze && !has_freeze)) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " has no ", kill == CgroupKill::kKillFile ? "cgroup.kill (Linux >= 5.14)"
                                                       : "cgroup.freeze (Linux >= 5.2)"));
  }
  std::unique_ptr<ProcessCgroups> cg(
      new ProcessCgroups(dir, o.name, std::move(pfd), std::move(fd), kill, o.kill_timeout));

  // Can a child of this process join a group here? (Moving needs write access to cgroup.procs of
  // the common ancestor too, which mkdir alone does not show.)
  const std::string probe = absl::StrCat("probe-", ::getpid());
  auto procs = cg->Prepare(probe);
  if (!procs.ok()) return procs.status();
  const pid_t child = ::fork();
  if (child < 0) return ErrnoStatus(errno, "fork for the cgroup probe");
  if (child == 0) {
    char buf[24];
    int n = 0;
    for (pid_t p = ::getpid(); p > 0 && n < 20; p /= 10) buf[n++] = static_cast<char>('0' + p % 10);
    char out[24];
    for (int i = 0; i < n; ++i) out[i] = buf[n - 1 - i];
    _exit(::write(procs->get(), out, n) == n ? 0 : 1);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  procs = Fd();
  int killed = 0;
  absl::Status removed = cg->KillAndRemove(probe, &killed);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a child of this process cannot join a group under ", dir,
        " (moving a process needs write access to cgroup.procs of ", parent,
        "'s ancestors down from this process's own cgroup)"));
  }
  if (!removed.ok()) return removed;
  return cg;
}

absl::StatusOr<Fd> ProcessCgroups::Prepare(const std::string& leaf) const {
  if (!ValidName(leaf)) {
    return absl::InvalidArgumentError(absl::StrCat("cgroup '", leaf, "': not a plain name"));
  }
  const std::string path = absl::StrCat(dir_, "/", leaf);
  if (::mkdirat(fd_.get(), leaf.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus(errno, absl::StrCat("cannot make the cgroup ", path));
  }
  Fd d(::openat(fd_.get(), leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (d.get() < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  if (absl::Status s = CheckOwned(d.get(), path, /*root_ok=*/false); !s.ok()) return s;
  Fd procs(::openat(d.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
  if (procs.get() < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path, "/cgroup.procs"));
  return procs;
}

std::vector<pid_t> ProcessCgroups::Procs(const std::string& leaf) const {
  if (!ValidName(leaf)) return {};
  Fd d(::openat(fd_.get(), leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  return d.get() < 0 ? std::vector<pid_t>{} : ProcsAt(d.get());
}

std::vector<std::string> ProcessCgroups::Leaves() const { return SubgroupsAt(fd_.get()); }

absl::Status ProcessCgroups::KillAndRemove(const std::string& leaf, int* killed) const {
  *killed = 0;
  if (!ValidName(leaf)) {
    return absl::InvalidArgumentError(absl::StrCat("cgroup '", leaf, "': not a plain name"));
  }
  const std::string path = absl::StrCat(dir_, "/", leaf);
  Fd d(::openat(fd_.get(), leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (d.get() < 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  }
  std::vector<pid_t> before;
  CollectProcs(d.get(), 0, &before);
  *killed = static_cast<int>(before.size());
  const absl::Time deadline = absl::Now() + timeout_;
  for (;;) {
    if (!Populated(d.get())) break;
    switch (kill_) {
      case CgroupKill::kKillFile:
        (void)WriteAt(d.get(), "cgroup.kill", "1");
        break;
      case CgroupKill::kFreeze: {
        // Frozen, nothing forks between the read of cgroup.procs and the kills; a frozen process
        // still dies of SIGKILL.
        (void)WriteAt(d.get(), "cgroup.freeze", "1");
        for (int i = 0; i < 100 && !Frozen(d.get()); ++i) absl::SleepFor(absl::Milliseconds(2));
        SignalEach(d.get());
        (void)WriteAt(d.get(), "cgroup.freeze", "0");
        break;
      }
      case CgroupKill::kSignalEach:
      case CgroupKill::kAuto:
        SignalEach(d.get());
        break;
    }
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (Populated(d.get())) {
    std::vector<pid_t> left;
    CollectProcs(d.get(), 0, &left);
    return absl::DeadlineExceededError(absl::StrCat(
        "the cgroup ", path, " still holds ", left.size(), " process(es) ",
        absl::ToInt64Milliseconds(timeout_), " ms after they were killed; left in place"));
  }
  // Emptied groups can take a moment to become removable (EBUSY).
  for (;;) {
    const bool subs = RemoveSubgroups(d.get(), 0);
    if (subs && (::unlinkat(fd_.get(), leaf.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT)) {
      return absl::OkStatus();
    }
    const int err = errno;
    if (absl::Now() > deadline) return ErrnoStatus(err, absl::StrCat("cannot remove the cgroup ", path));
    absl::SleepFor(absl::Milliseconds(5));
  }
}

bool ProcessCgroups::RemoveIfEmpty() const {
  return ::unlinkat(parent_fd_.get(), name_.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT;
}

absl::Status ProcessCgroups::RemoveAll() const {
  absl::Status first;
  for (const std::string& leaf : Leaves()) {
    int killed = 0;
    absl::Status s = KillAndRemove(leaf, &killed);
    if (first.ok()) first = s;
  }
  // <dir> itself, through the parent's descriptor held since Open.
  if (::unlinkat(parent_fd_.get(), name_.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT && first.ok()) {
    first = ErrnoStatus(errno, absl::StrCat("cannot remove the cgroup ", dir_));
  }
  return first;
}

}  // namespace ember::daemon
