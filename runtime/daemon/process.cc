#include "runtime/daemon/process.h"

#include "runtime/daemon/job_files.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/job/env.h"

namespace ember::daemon {

absl::StatusOr<pid_t> SpawnWorker(const SpawnOptions& o) {
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : o.env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> argv, envp;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string header = o.header.empty() ? "" : o.header + "\n";
  static const char kExecFailed[] = "ember: exec of the worker failed: ";

  const bool own_log = o.log_fd < 0;
  int log_fd = own_log ? ::open(o.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640)
                       : o.log_fd;
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open log ", o.log_path, ": ", strerror(errno)));
  }
  if (!header.empty()) (void)!::write(log_fd, header.data(), header.size());
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    if (own_log) ::close(log_fd);
    return absl::InternalError(absl::StrCat("fork for ", o.argv[0], ": ", strerror(err)));
  }
  if (pid == 0) {
    ::setsid();
    if (o.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(127);  // the parent died before prctl took effect
    }
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);  // the daemon blocks SIGTERM; workers must not
    signal(SIGPIPE, SIG_DFL);
    ::umask(027);  // what workers create (metrics, checkpoints) is 0640/0750 at most
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    if (o.cgroup_procs_fd >= 0) {  // before any descriptor is closed and before the user switch
      char digits[24];
      int n = 0;
      for (pid_t p = ::getpid(); p > 0 && n < 20; p /= 10) digits[n++] = static_cast<char>('0' + p % 10);
      char text[24];
      for (int i = 0; i < n; ++i) text[i] = digits[n - 1 - i];
      if (::write(o.cgroup_procs_fd, text, n) != n) {
        static const char kJoinFailed[] = "ember: cannot join the job's cgroup\n";
        (void)!::write(2, kJoinFailed, sizeof(kJoinFailed) - 1);
        _exit(127);
      }
    }
#ifdef SYS_close_range
    if (::syscall(SYS_close_range, 3, ~0U, 0) != 0)
#endif
      for (int fd = 3; fd < 4096; ++fd) ::close(fd);
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) _exit(127);
    if (o.switch_user) {
      static const char kSwitchFailed[] = "ember: cannot switch to the script user\n";
      if (::setgroups(1, &o.gid) != 0 || ::setgid(o.gid) != 0 || ::setuid(o.uid) != 0 ||
          ::setuid(0) == 0) {  // regaining root must fail
        (void)!::write(2, kSwitchFailed, sizeof(kSwitchFailed) - 1);
        _exit(127);
      }
    }
    ::execve(argv[0], argv.data(), envp.data());
    (void)!::write(2, kExecFailed, sizeof(kExecFailed) - 1);
    (void)!::write(2, argv[0], strlen(argv[0]));
    (void)!::write(2, "\n", 1);
    _exit(127);
  }
  if (own_log) ::close(log_fd);
  return pid;
}

bool SignalGroup(pid_t pgid, int sig) {
  if (pgid <= 1) return false;
  if (::killpg(pgid, sig) == 0) return true;
  // Just forked, setsid() not yet run: the group does not exist, the process does.
  return ::kill(pgid, sig) == 0;
}

bool TryReap(pid_t pid, int* exit_code, int* sig) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == 0) return false;
  if (r < 0) {  // not our child any more (already reaped): report it as gone
    *exit_code = -1;
    *sig = 0;
    return errno == ECHILD;
  }
  if (WIFEXITED(status)) {
    *exit_code = WEXITSTATUS(status);
    *sig = 0;
  } else if (WIFSIGNALED(status)) {
    *exit_code = -1;
    *sig = WTERMSIG(status);
  } else {
    return false;
  }
  return true;
}

int TryReapChild(pid_t pid, int* exit_code, int* sig) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == 0) return 0;
  if (r < 0) return -1;
  if (WIFEXITED(status)) {
    *exit_code = WEXITSTATUS(status);
    *sig = 0;
  } else if (WIFSIGNALED(status)) {
    *exit_code = -1;
    *sig = WTERMSIG(status);
  } else {
    return 0;
  }
  return 1;
}

std::optional<ProcInfo> ReadProcInfo(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  // "pid (comm) S ppid ..." — comm may contain spaces and ')', so parse after the last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
  // fields[0] is field 3 (state); starttime is field 22 -> fields[19].
  if (fields.size() < 20 || fields[0].empty()) return std::nullopt;
  ProcInfo info;
  info.state = fields[0][0];
  info.start_ticks = std::strtoll(fields[19].c_str(), nullptr, 10);
  return info;
}

bool ProcessAlive(pid_t pid, int64_t start_ticks) {
  auto info = ReadProcInfo(pid);
  return info && info->start_ticks == start_ticks && info->state != 'Z' && info->state != 'X';
}

std::vector<std::string> TailLines(const std::string& path, int n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<std::string> out = TailLinesOfFd(fd, n);
  if (fd >= 0) ::close(fd);
  return out;
}

std::vector<pid_t> FindJobProcesses(const std::string& job_id) {
  std::vector<pid_t> out;
  std::string needle = absl::StrCat(job::kEnvJobId, "=", job_id);
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = static_cast<pid_t>(atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream f(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string env = ss.str();
    for (absl::string_view var : absl::StrSplit(env, '\0')) {
      if (var == needle) {
        // A zombie (exited, not yet reaped) is not a running worker.
        std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
        std::string line;
        std::getline(stat, line);
        size_t p = line.rfind(')');
        if (p != std::string::npos && p + 2 < line.size() && line[p + 2] == 'Z') break;
        out.push_back(pid);
        break;
      }
    }
  }
  ::closedir(d);
  return out;
}

namespace {

// The environment of `pid` as NUL-separated "K=V" strings ("" when unreadable), read without
// following anything but /proc itself.
std::string ReadEnviron(pid_t pid) {
  int fd = ::open(absl::StrCat("/proc/", pid, "/environ").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || out.size() > (1 << 20)) break;
    out.append(buf, n);
  }
  ::close(fd);
  return out;
}

}  // namespace

int KillAttemptProcesses(const std::string& job_id, int attempt, const std::vector<int>& ranks,
                         const std::vector<uid_t>& uids) {
  const std::string want_job = absl::StrCat(job::kEnvJobId, "=", job_id);
  const std::string want_attempt = absl::StrCat(job::kEnvAttempt, "=", attempt);
  const std::string rank_prefix = absl::StrCat(job::kEnvRank, "=");
  const pid_t self = ::getpid();
  int killed = 0;
  for (int round = 0; round < 50; ++round) {
    int found = 0;
    DIR* d = ::opendir("/proc");
    if (d == nullptr) break;
    while (dirent* e = ::readdir(d)) {
      const pid_t pid = static_cast<pid_t>(atoi(e->d_name));
      if (pid <= 1 || pid == self) continue;
      struct stat st;
      if (::stat(absl::StrCat("/proc/", pid).c_str(), &st) != 0) continue;
      if (std::find(uids.begin(), uids.end(), st.st_uid) == uids.end()) continue;
      auto info = ReadProcInfo(pid);
      if (!info || info->state == 'Z' || info->state == 'X') continue;
      bool job_ok = false, attempt_ok = false, rank_ok = false;
      for (absl::string_view var : absl::StrSplit(ReadEnviron(pid), '\0')) {
        if (var == want_job) job_ok = true;
        else if (var == want_attempt) attempt_ok = true;
        else if (absl::ConsumePrefix(&var, rank_prefix)) {
          int r = -1;
          rank_ok = absl::SimpleAtoi(var, &r) &&
                    std::find(ranks.begin(), ranks.end(), r) != ranks.end();
        }
      }
      if (job_ok && attempt_ok && rank_ok && ::kill(pid, SIGKILL) == 0) {
        ++found;
        ++killed;
      }
    }
    ::closedir(d);
    if (found == 0) break;
    ::usleep(20000);  // let the killed ones die; a fork racing the scan is found next round
  }
  return killed;
}

std::vector<pid_t> ChildrenOfSelf() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(absl::StrCat("/proc/self/task/", e->d_name, "/children"));
    pid_t pid = 0;
    while (f >> pid) {
      if (std::find(out.begin(), out.end(), pid) == out.end()) out.push_back(pid);
    }
  }
  ::closedir(d);
  return out;
}

int64_t ReadOomKillCount() {
  std::ifstream f("/proc/vmstat");
  std::string name;
  int64_t value = 0;
  while (f >> name >> value) {
    if (name == "oom_kill") return value;
  }
  return -1;
}


std::string InterfaceOfAddress(const std::string& ipv4) {
  in_addr want{};
  if (::inet_pton(AF_INET, ipv4.c_str(), &want) != 1) return "";
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string name;
  for (ifaddrs* i = all; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
      name = i->ifa_name;
    }
  }
  ::freeifaddrs(all);
  return name;
}

}  // namespace ember::daemon
