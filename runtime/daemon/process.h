// Worker processes: spawn in a new session (its own process group), signal the whole group, reap,
// find and kill every process of a job's attempt (daemonised ones too), and tail a log file.
//
// A worker writes stdout/stderr straight to its log file (O_APPEND), not through a pipe to the
// daemon, so a daemon restart does not break its output (issue 8 re-attaches). Rotation is
// copy-truncate for the same reason (job_files.h RotateLogIfLarger). Thread-compatible: callers
// serialize per worker.
#ifndef EMBER_RUNTIME_DAEMON_PROCESS_H_
#define EMBER_RUNTIME_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::daemon {

struct SpawnOptions {
  std::vector<std::string> argv;                          // argv[0] is the executable path
  std::vector<std::pair<std::string, std::string>> env;   // the complete environment
  std::string cwd;
  std::string log_path;      // stdout+stderr, appended (opened by path: only where no other
                             // user can write; see log_fd)
  // When >= 0: stdout+stderr go to this open file instead of log_path (borrowed: the caller
  // closes it). emberd opens job logs through job_files.h (no symlink is ever followed).
  int log_fd = -1;
  std::string header;        // written to the log before exec (one line)
  // The child gets SIGKILL when the forking *thread* ends (prctl PR_SET_PDEATHSIG), so a worker
  // never outlives a launcher killed by any signal. Fork from a thread that lives as long as the
  // workers should (emberd's control thread). For `run --standalone` only: emberd's workers must
  // survive a daemon restart.
  bool die_with_parent = false;
  // Run as uid/gid (groups: gid only) instead of the caller's user; needs root. The switch happens
  // after chdir(cwd), so cwd need only be reachable by the caller.
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
  // When >= 0: an open cgroup.procs (cgroup v2, cgroup.h ProcessCgroups::Prepare) the child writes
  // its own pid into right after fork, before it switches user or execs, so the worker and
  // everything it starts stay in that group. Borrowed: the caller closes it. The child exits 127
  // ("ember: cannot join the job's cgroup" in the log) when the write fails.
  int cgroup_procs_fd = -1;
};

// fork+exec in a new session: pid == pgid. Errors: INTERNAL naming the executable when fork fails;
// an exec failure shows up as exit code 127 with the reason in the log.
absl::StatusOr<pid_t> SpawnWorker(const SpawnOptions& options);

// Sends `sig` to the process group (ESRCH ignored). Returns false when no member is left.
bool SignalGroup(pid_t pgid, int sig);

// Non-blocking reap. Returns true when `pid` has ended; then exit_code (-1 if signalled) and
// signal (0 if exited) are set.
bool TryReap(pid_t pid, int* exit_code, int* signal);

// What /proc/<pid>/stat says about a process: its state letter ('R', 'S', 'Z', ...) and its start
// time in clock ticks since boot (constant for the life of a process, so (pid, start_ticks) names
// one process even after pid reuse). nullopt when there is no such process.
struct ProcInfo {
  char state = '?';
  int64_t start_ticks = 0;
};
std::optional<ProcInfo> ReadProcInfo(pid_t pid);

// True while the process `pid` started at `start_ticks` exists and is not a zombie (for workers a
// restarted daemon re-attached to: they are not its children, waitpid cannot tell).
bool ProcessAlive(pid_t pid, int64_t start_ticks);

// Like TryReap, but returns -1 (and sets nothing) when `pid` is not a child of this process,
// 1 when it ended, 0 while it runs.
int TryReapChild(pid_t pid, int* exit_code, int* signal);

// The last `n` lines of a file (at most 64 KiB read from the end).
std::vector<std::string> TailLines(const std::string& path, int n);

// How many processes the kernel's OOM killer has killed since boot (/proc/vmstat oom_kill; every
// memory cgroup's kills count too). -1 when unreadable (kernels before 4.13).
int64_t ReadOomKillCount();

// Processes whose environment has EMBER_JOB_ID=<job_id> (scans /proc; for tests and `nodes`).
std::vector<pid_t> FindJobProcesses(const std::string& job_id);

// Ends what is left of one job attempt's ranks on this node: every process (not this one) owned by
// one of `uids` whose environment (/proc/<pid>/environ, inherited by every descendant, whatever
// its session or parent: a double-forked, setsid'ed daemon too) has EMBER_JOB_ID=job_id,
// EMBER_ATTEMPT=attempt and an EMBER_RANK in `ranks` gets SIGKILL, scanning again until none is
// left (at most ~1 s). Returns how many it killed. A process that cleared its environment
// escapes this; emberd's attempt cgroups (cgroup.h) hold it where the host allows them
// (docs/operations.md "A job's processes end with it").
int KillAttemptProcesses(const std::string& job_id, int attempt, const std::vector<int>& ranks,
                         const std::vector<uid_t>& uids);

// The children of this process, of every thread (/proc/self/task/*/children; empty where the
// kernel lacks CONFIG_PROC_CHILDREN).
std::vector<pid_t> ChildrenOfSelf();

// The name of the local network interface that holds IPv4 address `ipv4` (getifaddrs), e.g. "lo"
// for 127.0.0.1; "" when no interface has it or `ipv4` is not a dotted IPv4 literal. A script
// job's ranks get it as GLOO_SOCKET_IFNAME (script_job.cc).
std::string InterfaceOfAddress(const std::string& ipv4);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_PROCESS_H_
