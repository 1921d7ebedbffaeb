// A script job against the files and processes of the daemon that runs it (issue 31), through a
// real daemon in this process and real Python scripts (Debian's /usr/bin/python3, no torch):
//   * run as root with script_user nobody (the documented set-up; CI runs as root), a script
//     that replaces its log with a symlink to a root file, swaps logs/ for a directory of its
//     own, or plants a symlink where rotation writes, gets nothing written to (or read from) the
//     root file, and rotated logs are 0640 regular files;
//   * a daemonised descendant of a rank (fork, setsid, fork) is gone within seconds of the job's
//     end, success or cancel (any user); with reap_orphans also one that cleared its environment;
//   * where the host allows cgroup v2 groups (root: CI), one that cleared its environment and left
//     the session (`env -i setsid sleep &`) ends with the job under emberd too (its attempt's
//     cgroup), and the script cannot leave that cgroup; across a daemon restart the successor keeps
//     the re-attached attempt's group and still ends it;
//   * a warm standby still works with the daemon's .ember/.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "launcher/client.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/cgroup.h"
#include "runtime/daemon/daemon.h"
#include "runtime/daemon/process.h"

namespace ember {
namespace {

namespace fs = std::filesystem;
namespace v1 = jobs::v1;

constexpr char kSecret[] = "root-only-secret\n";

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A work root that `nobody` can traverse (the test's own TEST_TMPDIR may sit under /root, 0700).
struct Scratch {
  Scratch() {
    char t[] = "/tmp/script-files-XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    dir = t;
    ::chmod(dir.c_str(), 0755);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string dir;
};

struct Node {
  std::unique_ptr<daemon::Daemon> daemon;
  std::unique_ptr<Client> client;
  std::string work_root;
};

// One node hosting its store, two CPU slots; as root, scripts run as nobody.
Node Start(const std::string& root, int64_t log_max_bytes = 64 << 20, int log_keep = 3,
           bool reap_orphans = false) {
  daemon::DaemonOptions o;
  o.node_name = "files";
  o.host_store = true;
  o.work_root = root + "/jobs";
  o.worker_binary = "/bin/false";
  o.inventory.cpu_slots = 2;
  o.inventory.cuda_devices = 0;
  o.workers_die_with_daemon = true;
  o.auth_token = base::GenerateToken();
  o.heartbeat = absl::Milliseconds(100);  // log rotation runs on the heartbeat
  o.log_max_bytes = log_max_bytes;
  o.log_keep = log_keep;
  o.reap_orphans = reap_orphans;
  o.restart_backoff = absl::Milliseconds(100);
  if (::geteuid() == 0) {
    o.allow_root_scripts = true;
    o.script_user = "nobody";
  }
  Node n;
  n.work_root = o.work_root;
  const std::string token = o.auth_token;
  auto d = daemon::Daemon::Start(o);
  REQUIRE(d.ok());
  n.daemon = std::move(*d);
  ClientOptions co;
  co.address = n.daemon->address();
  co.token = token;
  auto c = Client::Connect(co);
  REQUIRE(c.ok());
  n.client = std::make_unique<Client>(std::move(*c));
  return n;
}

std::string ScriptSpec(const std::string& name, int max_restarts,
                       const std::vector<std::string>& args, bool warm_standby = false) {
  std::string a;
  for (const auto& s : args) a += absl::StrCat(a.empty() ? "" : ", ", "\"", s, "\"");
  return absl::StrCat("name: ", name, "\nworker:\n  script: s.py\n  python: /usr/bin/python3\n",
                      warm_standby ? "  warm_standby: true\n  preload: [json]\n"
                                   : "  warm_standby: false\n",
                      "  args: [", a, "]\n",
                      "parallelism:\n  world_size: 1\nresources:\n  device_type: cpu\n",
                      "max_restarts: ", max_restarts, "\n");
}

v1::Job RunToEnd(Node& n, const std::string& spec, const std::string& script) {
  auto r = n.client->Submit(spec, "", {{"s.py", script}});
  REQUIRE(r.ok());
  auto done = n.client->Wait(r->job().id(), absl::Seconds(60));
  REQUIRE(done.ok());
  return *done;
}

// A root-only file next to the work root: what the script aims at.
std::string Secret(const std::string& root) {
  const std::string path = root + "/secret";
  { std::ofstream(path) << kSecret; }
  ::chmod(path.c_str(), 0600);
  return path;
}

void CheckSecretUnchanged(const std::string& path) {
  struct stat st;
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(st.st_uid == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(Slurp(path) == kSecret);
}

constexpr char kLogAttack[] = R"PY(import os, sys
secret = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"attempt {attempt} output", flush=True)
if attempt == 0:
    try:  # the log itself
        os.unlink("logs/rank-0.log")
        os.symlink(secret, "logs/rank-0.log")
        print("replaced logs/rank-0.log", flush=True)
    except OSError as e:
        print(f"cannot replace logs/rank-0.log: {e}", flush=True)
    # logs/ itself: the job directory is the script's, so it can move it and make its own
    os.rename("logs", "logs.mine")
    os.mkdir("logs")
    os.symlink(secret, "logs/rank-0.log")
    # uploads/ too (its own, empty): attempt 1 must get the daemon's, with this script, again
    os.rename("uploads", "uploads.mine")
    os.mkdir("uploads")
    sys.exit(3)  # a failure: the daemon reads the log's last lines, then restarts the job
)PY";

TEST_CASE("a script cannot point its log at a root file (write on restart, read on failure)") {
  if (::geteuid() != 0) {
    WARN("not root: scripts run as the daemon's own user, no boundary to test");
    return;
  }
  Scratch s;
  const std::string secret = Secret(s.dir);
  Node n = Start(s.dir);
  v1::Job done = RunToEnd(n, ScriptSpec("log-attack", 1, {secret}), kLogAttack);
  INFO(done.DebugString());
  CheckSecretUnchanged(secret);
  CHECK_FALSE(absl::StrContains(done.DebugString(), "root-only-secret"));  // not read either
  CHECK(done.state() == v1::SUCCEEDED);
  REQUIRE(done.attempts_size() == 2);
  const std::string logs = done.job_dir() + "/logs";
  struct stat st;
  REQUIRE(::lstat(logs.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK(st.st_uid == 0);  // the daemon's, not the script's
  CHECK((st.st_mode & 022) == 0);
  CHECK(absl::StrContains(Slurp(logs + "/rank-0.log"), "attempt 1 output"));
  bool aside = false;
  for (const auto& e : fs::directory_iterator(done.job_dir())) {
    aside = aside || absl::StartsWith(e.path().filename().string(), "logs.untrusted-");
  }
  CHECK(aside);  // the script's logs/ was moved aside, not used
}

constexpr char kRotationAttack[] = R"PY(import os, sys, time
secret = sys.argv[1]
try:
    os.symlink(secret, "logs/rank-0.log.1")
    print("planted logs/rank-0.log.1", flush=True)
except OSError as e:
    print(f"cannot plant logs/rank-0.log.1: {e}", flush=True)
for i in range(100):
    print("line %03d " % i + "x" * 90, flush=True)
time.sleep(1.5)  # the heartbeat (100 ms here) rotates the log past 4 KiB
)PY";

TEST_CASE("log rotation never follows a planted rank-0.log.1; rotated logs are 0640") {
  if (::geteuid() != 0) {
    WARN("not root: scripts run as the daemon's own user, no boundary to test");
    return;
  }
  const mode_t old_umask = ::umask(022);  // the common default, under which rotated logs were 0644
  Scratch s;
  const std::string secret = Secret(s.dir);
  // log_keep 1: rank-0.log.1 is the rotation's only target (with more, the shift moves a
  // planted name up before the copy is written).
  Node n = Start(s.dir, /*log_max_bytes=*/4096, /*log_keep=*/1);
  v1::Job done = RunToEnd(n, ScriptSpec("rotation-attack", 0, {secret}), kRotationAttack);
  INFO(done.DebugString());
  CheckSecretUnchanged(secret);
  CHECK(done.state() == v1::SUCCEEDED);
  const std::string rotated = done.job_dir() + "/logs/rank-0.log.1";
  struct stat st;
  REQUIRE(::lstat(rotated.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 0777) == 0640);
  CHECK(absl::StrContains(Slurp(rotated), "line 0"));
  ::umask(old_umask);
}

constexpr char kDaemonise[] = R"PY(import os, sys, time
pidfile = "daemon.pid"  # in the job directory, the script's working directory
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(600)
        os._exit(0)
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
print("daemonised", open(pidfile).read(), flush=True)
if sys.argv[1:] == ["wait"]:
    time.sleep(600)  # until cancelled
)PY";

// True once `pid` has ended (gone, or a zombie nobody reaped yet), waiting up to 5 s; kills it
// when it has not, so that nothing outlives the test.
bool EndsSoon(pid_t pid) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    auto info = daemon::ReadProcInfo(pid);
    if (!info || info->state == 'Z' || info->state == 'X') return true;
    if (absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  return false;
}

TEST_CASE("a daemonised descendant of a script (fork, setsid, fork) ends with its job") {
  Scratch s;
  Node n = Start(s.dir);
  // The job succeeds while its descendant sleeps on.
  v1::Job done = RunToEnd(n, ScriptSpec("daemonise", 0, {}), kDaemonise);
  INFO(done.DebugString());
  REQUIRE(done.state() == v1::SUCCEEDED);
  const pid_t pid = std::atoi(Slurp(done.job_dir() + "/daemon.pid").c_str());
  REQUIRE(pid > 1);
  CHECK(EndsSoon(pid));
  // The job is cancelled while both run.
  auto r = n.client->Submit(ScriptSpec("daemonise-cancel", 0, {"wait"}), "", {{"s.py", kDaemonise}});
  REQUIRE(r.ok());
  const std::string pidfile = absl::StrCat(n.work_root, "/", r->job().id(), "/daemon.pid");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!fs::exists(pidfile) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  REQUIRE(fs::exists(pidfile));
  absl::SleepFor(absl::Milliseconds(50));  // renamed into place whole; read it now
  const pid_t pid2 = std::atoi(Slurp(pidfile).c_str());
  REQUIRE(pid2 > 1);
  REQUIRE(n.client->Cancel(r->job().id()).ok());
  auto cancelled = n.client->Wait(r->job().id(), absl::Seconds(30));
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::CANCELLED);
  CHECK(EndsSoon(pid2));
}

// The same, but the daemonised process clears its environment (exec with env {}): no
// EMBER_JOB_ID to find it by. With reap_orphans (emberctl run --standalone) the daemon is its
// subreaper and kills it when the ranks have all exited.
constexpr char kDaemoniseNoEnv[] = R"PY(import os, sys, time
pidfile = "daemon.pid"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        os.execve("/bin/sleep", ["sleep", "600"], {})
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
time.sleep(0.2)  # exec'd by now
)PY";

TEST_CASE("with reap_orphans, a daemonised descendant that cleared its environment ends too") {
  Scratch s;
  Node n = Start(s.dir, 64 << 20, 3, /*reap_orphans=*/true);
  v1::Job done = RunToEnd(n, ScriptSpec("daemonise-noenv", 0, {}), kDaemoniseNoEnv);
  INFO(done.DebugString());
  REQUIRE(done.state() == v1::SUCCEEDED);
  const pid_t pid = std::atoi(Slurp(done.job_dir() + "/daemon.pid").c_str());
  REQUIRE(pid > 1);
  CHECK(EndsSoon(pid));
}

// A descendant that leaves the session and clears its environment (`env -i setsid sleep &`), the
// one the sweep by environment cannot find: with a cgroup v2 per attempt (process_cgroup: auto)
// it dies with the attempt. The script also tries to leave its cgroup (write its pid into an
// ancestor's cgroup.procs) and to make a group of its own: as script_user nobody both are refused.
constexpr char kCgroupEscape[] = R"PY(import os, sys, time
marker = sys.argv[1]
path = [l[3:] for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0]
mount = None
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[f.index("-") + 1] == "cgroup2":
        mount = f[4]
        break
print("cgroup:", path, "mount:", mount, flush=True)
if mount and os.getuid() != 0:
    moved = []
    anc = path
    while anc not in ("", "/"):
        anc = anc.rsplit("/", 1)[0]
        try:
            with open(mount + (anc or "") + "/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            moved.append(anc or "/")
        except OSError:
            pass
    try:
        os.mkdir(mount + path + "/mine")
        moved.append("mkdir")
    except OSError:
        pass
    print("escape:", "moved to " + ",".join(moved) if moved else "refused", flush=True)
os.system("/usr/bin/env -i /usr/bin/setsid /bin/sleep %s &" % marker)
deadline = time.time() + 10
while time.time() < deadline:
    found = False
    for p in os.listdir("/proc"):
        try:
            argv = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1] == marker.encode():
            print("escaped sleep", p, flush=True)
            found = True
    if found:
        break
    time.sleep(0.02)
)PY";

// Processes whose argv[1] is `marker` (the sleep; not the shell that started it), not zombies.
std::vector<pid_t> WithMarker(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const pid_t pid = std::atoi(e.path().filename().c_str());
    if (pid <= 0) continue;
    const std::string cmd = Slurp(e.path().string() + "/cmdline");
    const size_t a1 = cmd.find('\0');
    if (a1 == std::string::npos || cmd.compare(a1 + 1, marker.size() + 1, marker + '\0') != 0) {
      continue;
    }
    auto info = daemon::ReadProcInfo(pid);
    if (info && info->state != 'Z' && info->state != 'X') out.push_back(pid);
  }
  return out;
}

TEST_CASE("a descendant that cleared its environment and left the session ends with its job") {
  // Whether this host lets a process make cgroup v2 groups and move children into them (root
  // with a writable cgroup2, as in CI), asked independently of the daemon.
  daemon::ProcessCgroupsOptions probe;
  probe.name = absl::StrCat("script-files-test-", ::getpid());
  auto host = daemon::ProcessCgroups::Open(probe);
  const bool cgroups_here = host.ok();
  if (host.ok()) CHECK((*host)->RemoveAll().ok());
  Scratch s;
  const std::string marker = absl::StrCat("1000.", ::getpid());  // unique per test process
  std::string cgroup_line;
  std::string log;
  {
    Node n = Start(s.dir);
    v1::Job done = RunToEnd(n, ScriptSpec("cgroup-escape", 0, {marker}), kCgroupEscape);
    INFO(done.DebugString());
    REQUIRE(done.state() == v1::SUCCEEDED);
    log = Slurp(done.job_dir() + "/logs/rank-0.log");
    INFO(log);
    REQUIRE(absl::StrContains(log, "escaped sleep"));  // it was running when the script ended
    if (!cgroups_here) {
      WARN("no usable cgroup v2 here (" << host.status().ToString()
                                        << "): the escape is not contained, not tested");
      for (pid_t p : WithMarker(marker)) ::kill(p, SIGKILL);
      return;
    }
    // The rank ran in the attempt's group under the daemon's directory.
    const size_t at = log.find("cgroup: ");
    REQUIRE(at != std::string::npos);
    cgroup_line = log.substr(at, log.find('\n', at) - at);
    CHECK(absl::StrContains(cgroup_line, absl::StrCat("/ember/emberd-")));
    CHECK(absl::StrContains(cgroup_line, absl::StrCat("/job-", done.id(), ".a0 ")));
    if (::geteuid() == 0) CHECK(absl::StrContains(log, "escape: refused"));  // as nobody
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = WithMarker(marker).empty();
      if (!gone) absl::SleepFor(absl::Milliseconds(50));
    }
    CHECK(gone);
    for (pid_t p : WithMarker(marker)) ::kill(p, SIGKILL);  // nothing outlives a failed check
    // The attempt's group is removed with it.
    const std::string path = cgroup_line.substr(strlen("cgroup: "), cgroup_line.find(" mount: ") - strlen("cgroup: "));
    const std::string mount = cgroup_line.substr(cgroup_line.find(" mount: ") + strlen(" mount: "));
    CHECK_FALSE(fs::exists(mount + path));
    // The daemon's directory stays while it runs; Drain (the destructor) removes it.
    cgroup_line = mount + path.substr(0, path.rfind('/'));
    CHECK(fs::exists(cgroup_line));
  }
  CHECK_FALSE(fs::exists(cgroup_line));
}

// A script that starts the escaping sleep, then waits to be cancelled.
constexpr char kEscapeAndWait[] = R"PY(import os, sys, time
os.system("/usr/bin/env -i /usr/bin/setsid /bin/sleep %s &" % sys.argv[1])
print("started", flush=True)
time.sleep(600)
)PY";

// The daemon restarts (Detach, a new one with the same work root, node and durable store): the
// successor keeps the group of the attempt it re-attached to (the job keeps running, the escaped
// sleep with it) and kills the whole group when the job is cancelled.
TEST_CASE("after a daemon restart the re-attached attempt's cgroup still ends its escaped process") {
  daemon::ProcessCgroupsOptions probe;
  probe.name = absl::StrCat("script-files-test-r", ::getpid());
  auto host = daemon::ProcessCgroups::Open(probe);
  if (!host.ok()) {
    WARN("no usable cgroup v2 here (" << host.status().ToString() << "): not tested");
    return;
  }
  CHECK((*host)->RemoveAll().ok());
  Scratch s;
  const std::string marker = absl::StrCat("1000.", ::getpid(), "9");
  daemon::DaemonOptions o;
  o.node_name = "restart";
  o.host_store = true;
  o.store_data_dir = s.dir + "/store";
  o.work_root = s.dir + "/jobs";
  o.worker_binary = "/bin/false";
  o.inventory.cpu_slots = 1;
  o.inventory.cuda_devices = 0;
  o.auth_token = base::GenerateToken();
  o.lease_ttl = absl::Seconds(30);  // the restart must not lose the node
  if (::geteuid() == 0) {
    o.allow_root_scripts = true;
    o.script_user = "nobody";
  }
  auto connect = [&](daemon::Daemon& d) {
    ClientOptions co;
    co.address = d.address();
    co.token = o.auth_token;
    auto c = Client::Connect(co);
    REQUIRE(c.ok());
    return std::move(*c);
  };
  auto first = daemon::Daemon::Start(o);
  REQUIRE(first.ok());
  std::string id;
  {
    Client c = connect(**first);
    auto r = c.Submit(ScriptSpec("cgroup-restart", 0, {marker}), "", {{"s.py", kEscapeAndWait}});
    REQUIRE(r.ok());
    id = r->job().id();
  }
  bool started = false;
  for (int i = 0; i < 600 && !started; ++i) {
    started = WithMarker(marker).size() == 1;
    if (!started) absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(started);
  (*first)->Detach();  // workers keep running
  first->reset();
  o.store_listen = "127.0.0.1:0";
  auto second = daemon::Daemon::Start(o);
  REQUIRE(second.ok());
  Client c = connect(**second);
  absl::SleepFor(absl::Seconds(1));  // a few supervision passes of the successor
  auto running = c.Get(id);
  REQUIRE(running.ok());
  CHECK(running->state() == v1::RUNNING);
  CHECK(WithMarker(marker).size() == 1);  // not swept as a stale group
  REQUIRE(c.Cancel(id).ok());
  auto cancelled = c.Wait(id, absl::Seconds(30));
  REQUIRE(cancelled.ok());
  CHECK(cancelled->state() == v1::CANCELLED);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = WithMarker(marker).empty();
    if (!gone) absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(gone);
  for (pid_t p : WithMarker(marker)) ::kill(p, SIGKILL);
}

// A configured parent that is no cgroup v2 directory stops the start, naming it (auto falls back
// to the sweep instead; the operator who names a directory wants it used).
TEST_CASE("a process_cgroup that is not a usable cgroup v2 directory fails the start, naming it") {
  Scratch s;
  daemon::DaemonOptions o;
  o.node_name = "badcg";
  o.host_store = true;
  o.work_root = s.dir + "/jobs";
  o.worker_binary = "/bin/false";
  o.inventory.cpu_slots = 1;
  o.inventory.cuda_devices = 0;
  o.auth_token = base::GenerateToken();
  o.process_cgroup = s.dir;  // a tmpfs/ext4 directory, not cgroup2
  auto d = daemon::Daemon::Start(o);
  REQUIRE_FALSE(d.ok());
  INFO(d.status().ToString());
  CHECK(absl::StrContains(d.status().message(), "process_cgroup"));
  CHECK(absl::StrContains(d.status().message(), s.dir));
}

constexpr char kStandby[] = R"PY(import os, sys, time
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"attempt {attempt} as uid {os.getuid()}", flush=True)
if attempt == 0:
    time.sleep(4)  # the warm standby for attempt 1 starts 3 s into attempt 0
    sys.exit(1)
)PY";

// The warm standby's shim and go file live in .ember/, now the daemon's (group: the script's):
// the script's user must still read them, and attempt 1 must take the standby over.
TEST_CASE("a warm standby runs as the script user from the daemon's .ember directory") {
  Scratch s;
  Node n = Start(s.dir);
  v1::Job done = RunToEnd(n, ScriptSpec("standby", 1, {}, /*warm_standby=*/true), kStandby);
  INFO(done.DebugString());
  CHECK(done.state() == v1::SUCCEEDED);
  const std::string log = Slurp(done.job_dir() + "/logs/rank-0.log");
  INFO(log);
  CHECK(absl::StrContains(log, "(warm standby)"));
  CHECK(absl::StrContains(log, "attempt 1 as uid"));
  struct stat st;
  REQUIRE(::lstat((done.job_dir() + "/.ember").c_str(), &st) == 0);
  CHECK(st.st_uid == ::geteuid());
  CHECK((st.st_mode & 0777) == 0750);
}

}  // namespace
}  // namespace ember
