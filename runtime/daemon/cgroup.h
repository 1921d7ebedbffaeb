// A cgroup v2 per job attempt (issue 31): every process a rank starts, whatever it does to its
// session, parent or environment (`env -i setsid sleep 1000 &`), stays in the attempt's cgroup,
// and the attempt's end kills the whole cgroup.
//
// Layout: <parent>/<name>/<leaf>, where <parent> is configured or, by default, the subdirectory
// ember/ of this process's own cgroup v2 (found through /proc/self/mountinfo and
// /proc/self/cgroup); <name> is one daemon instance's directory (unique per work root and node,
// stable across a restart so a restarted daemon finds its adopted ranks' groups); <leaf> is one
// attempt's group (LeafName). SpawnWorker's child writes its own pid into the leaf's cgroup.procs
// before it switches user or execs (SpawnOptions::cgroup_procs_fd), so nothing it runs is ever
// outside the group.
//
// Threat model: the directories are created by this process (root for a root emberd), 0755, and
// checked to be owned by this user and writable by no one else; every path below the daemon's
// directory is opened with openat(O_NOFOLLOW) from a descriptor held since Open. A script run as
// another user (script_user) can neither leave its group (moving a process needs write access to
// cgroup.procs of the common ancestor), nor make child groups, nor freeze or thaw its own. A
// script run as emberd's own user can write the same files emberd can and so can leave the group;
// only a distinct script_user is contained against its will (docs/operations.md "A job's
// processes end with it").
//
// Killing: cgroup.kill (Linux >= 5.14: SIGKILL to every process of the group and its descendants,
// atomically against forks); else freeze the group (cgroup.freeze, >= 5.2), SIGKILL each pid in
// cgroup.procs, thaw; else SIGKILL each pid in cgroup.procs until it stays empty.
//
// Thread-compatible: one ProcessCgroups is used by the daemon's control thread (and Drain after it
// stopped); its methods do not share state beyond the descriptor of the daemon's directory.
#ifndef EMBER_RUNTIME_DAEMON_CGROUP_H_
#define EMBER_RUNTIME_DAEMON_CGROUP_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/daemon/job_files.h"

namespace ember::daemon {

// The first cgroup2 mount of a /proc/<pid>/mountinfo text: its mount point and the cgroup path
// it shows as its root (field 4; "/" unless a cgroup namespace or bind mount shows a subtree).
// Escaped characters in the mount point (\040 for a space) are decoded. nullopt when none.
struct Cgroup2Mount {
  std::string mount_point;
  std::string root;
};
std::optional<Cgroup2Mount> FindCgroup2Mount(absl::string_view mountinfo);

// The cgroup v2 path of a /proc/<pid>/cgroup text (its "0::<path>" line); nullopt when none.
std::optional<std::string> Cgroup2PathOf(absl::string_view proc_cgroup);

// This process's own cgroup v2 directory: the mount point joined with its path relative to the
// mount's root. NOT_FOUND when no cgroup2 is mounted (or this process's group is not below the
// mount's root), naming what is missing.
absl::StatusOr<std::string> OwnCgroup2Dir();

// How ProcessCgroups kills a group; kAuto takes the best the kernel has.
enum class CgroupKill { kAuto, kKillFile, kFreeze, kSignalEach };

struct ProcessCgroupsOptions {
  // The cgroup v2 directory under which the daemon's directory is made ("" = OwnCgroup2Dir() +
  // "/ember", created when missing). Must be on a cgroup2 file system, owned by this user or
  // root and writable by no other.
  std::string parent;
  // The daemon's own directory under `parent` (one path component: [A-Za-z0-9._-], not starting
  // with '.' and not "cgroup.*"); unique per daemon instance.
  std::string name;
  CgroupKill kill = CgroupKill::kAuto;  // tests force the fallbacks
  // How long KillAndRemove waits for a killed group to empty.
  absl::Duration kill_timeout = absl::Seconds(3);
};

class ProcessCgroups {
 public:
  // Makes (or takes over, after a restart) <parent>/<name> (0755) and checks that this process
  // can move a child into a group there (a forked probe joins a probe group and exits).
  // Errors name the directory: NOT_FOUND without a cgroup2 mount, FAILED_PRECONDITION for a
  // directory not on cgroup2, not this user's (or root's) or writable by others, PERMISSION_DENIED
  // or INTERNAL from errno when a directory cannot be made or the probe cannot join.
  static absl::StatusOr<std::unique_ptr<ProcessCgroups>> Open(const ProcessCgroupsOptions& options);

  const std::string& dir() const { return dir_; }  // <parent>/<name>
  CgroupKill kill_method() const { return kill_; }
  // "cgroup v2 <dir> (cgroup.kill)" / "(freeze, SIGKILL each, thaw)" / "(SIGKILL each)".
  std::string Describe() const;

  // The leaf name of a job attempt's group: "job-<job>.a<attempt>" (job ids are checked names:
  // spec_policy.h CheckJobId). "" when `job` cannot be one path component.
  static std::string LeafName(const std::string& job, int attempt);

  // Makes the group <dir>/<leaf> (0755; an existing one of this user is reused) and opens its
  // cgroup.procs for writing: the descriptor for SpawnOptions::cgroup_procs_fd. INVALID_ARGUMENT
  // for a bad leaf name, FAILED_PRECONDITION when the existing group is not this user's or is
  // writable by others, else from errno naming the directory.
  absl::StatusOr<Fd> Prepare(const std::string& leaf) const;

  // Kills every process of <dir>/<leaf> and of the groups below it, waits (at most kill_timeout)
  // until they are gone and removes the groups. OK (with *killed the number of processes it saw
  // there) also when the group does not exist; DEADLINE_EXCEEDED naming the group when processes
  // stay (the group is left, for a later call).
  absl::Status KillAndRemove(const std::string& leaf, int* killed) const;

  // The pids in <dir>/<leaf>/cgroup.procs (not those of groups below it); empty when none or
  // the group does not exist.
  std::vector<pid_t> Procs(const std::string& leaf) const;

  // The groups now under <dir>.
  std::vector<std::string> Leaves() const;

  // Kills and removes every group under <dir>, then <dir> itself (on Drain). The first error;
  // the rest is still tried.
  absl::Status RemoveAll() const;

  // Removes <dir> when no group is left under it (on Detach with no attempt running: the next
  // daemon makes it again). True when it is gone.
  bool RemoveIfEmpty() const;

 private:
  ProcessCgroups(std::string dir, std::string name, Fd parent_fd, Fd fd, CgroupKill kill,
                 absl::Duration timeout)
      : dir_(std::move(dir)), name_(std::move(name)), parent_fd_(std::move(parent_fd)),
        fd_(std::move(fd)), kill_(kill), timeout_(timeout) {}

  std::string dir_;
  std::string name_;
  Fd parent_fd_;  // <parent>, O_DIRECTORY|O_NOFOLLOW
  Fd fd_;         // <dir>, O_DIRECTORY|O_NOFOLLOW
  CgroupKill kill_;
  absl::Duration timeout_;
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_CGROUP_H_
