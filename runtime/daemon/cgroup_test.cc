// The attempt cgroups (cgroup.h): parsing of /proc's mountinfo and cgroup files against written-out
// samples, and, where this host lets the test make cgroup v2 groups (root with a writable cgroup2
// mount: CI), a worker spawned into a group whose descendant left its session and cleared its
// environment (`env -i setsid sleep`) is killed with the group by each kill method, the group is
// removed, and directories another user could write are refused.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <dirent.h>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/daemon/cgroup.h"
#include "runtime/daemon/process.h"

namespace ember::daemon {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string Tmp(const std::string& name) {
  const char* t = getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

TEST_CASE("the cgroup2 mount is found in mountinfo, escapes decoded") {
  // A hybrid host (this one's shape): v1 hierarchies and cgroup2 at .../unified.
  const char kHybrid[] =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:12 master:3 - cgroup2 cgroup2 rw\n";
  auto m = FindCgroup2Mount(kHybrid);
  REQUIRE(m.has_value());
  CHECK(m->mount_point == "/sys/fs/cgroup/unified");
  CHECK(m->root == "/");
  // A container's view: a namespaced subtree, a space in the mount point.
  auto c = FindCgroup2Mount("7 1 0:5 /kubepods/pod1 /sys/fs/my\\040cg rw - cgroup2 cgroup rw,nsdelegate\n");
  REQUIRE(c.has_value());
  CHECK(c->mount_point == "/sys/fs/my cg");
  CHECK(c->root == "/kubepods/pod1");
  // v1 only, or a cgroup2 named only as a source: none.
  CHECK_FALSE(FindCgroup2Mount("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup2 rw\n"));
  CHECK_FALSE(FindCgroup2Mount(""));
}

TEST_CASE("the v2 path is the 0:: line of /proc/<pid>/cgroup") {
  CHECK(Cgroup2PathOf("4:memory:/x\n0::/system.slice/emberd.service\n") ==
        std::optional<std::string>("/system.slice/emberd.service"));
  CHECK(Cgroup2PathOf("0::/\n") == std::optional<std::string>("/"));
  CHECK_FALSE(Cgroup2PathOf("4:memory:/x\n1:name=systemd:/\n"));
}

TEST_CASE("a leaf name is one plain path component") {
  CHECK(ProcessCgroups::LeafName("tiny-gpt-3f9a2c", 2) == "job-tiny-gpt-3f9a2c.a2");
  for (const char* bad : {"", "..", "a/b", ".x", "a b", "x\n"}) {
    INFO(bad);
    CHECK(ProcessCgroups::LeafName(bad, 0).empty());
  }
}

// Processes whose argv[1] is `marker` (not zombies): the sleeps, not the shell that started them.
std::vector<pid_t> WithMarker(const std::string& marker) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = static_cast<pid_t>(atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string cmd = Slurp(absl::StrCat("/proc/", pid, "/cmdline"));
    std::vector<std::string> argv = absl::StrSplit(cmd, '\0');
    auto info = ReadProcInfo(pid);
    if (argv.size() >= 2 && argv[1] == marker && info && info->state != 'Z' && info->state != 'X') {
      out.push_back(pid);
    }
  }
  ::closedir(d);
  return out;
}

// A group of this test's own, or nullptr (and a warning) where the host allows none.
std::unique_ptr<ProcessCgroups> OpenOwn(const std::string& suffix, CgroupKill kill) {
  ProcessCgroupsOptions o;
  o.name = absl::StrCat("cgroup-test-", ::getpid(), "-", suffix);
  o.kill = kill;
  auto cg = ProcessCgroups::Open(o);
  if (!cg.ok()) {
    WARN("no usable cgroup v2 here (" << cg.status().ToString() << "): not tested");
    return nullptr;
  }
  return std::move(*cg);
}

TEST_CASE("a worker's daemonised descendant without environment dies with its cgroup") {
  for (CgroupKill kill : {CgroupKill::kKillFile, CgroupKill::kFreeze, CgroupKill::kSignalEach}) {
    const int k = static_cast<int>(kill);
    INFO("kill method " << k);
    auto cg = OpenOwn(absl::StrCat("k", k), kill);
    if (cg == nullptr) {
      if (kill == CgroupKill::kKillFile) continue;  // an older kernel: the fallbacks still run
      return;
    }
    const std::string leaf = ProcessCgroups::LeafName(absl::StrCat("unit-", ::getpid()), k);
    auto procs = cg->Prepare(leaf);
    REQUIRE(procs.ok());
    CHECK_FALSE(cg->RemoveIfEmpty());  // a group is left under it
    // Unique per test process and method: parallel tests never see each other's sleeps.
    const std::string marker = absl::StrCat("1000.", ::getpid(), k);
    SpawnOptions so;
    so.argv = {"/bin/sh", "-c",
               absl::StrCat("/usr/bin/env -i /usr/bin/setsid /bin/sleep ", marker, " & sleep 30")};
    so.env = {{"PATH", "/usr/bin:/bin"}};
    so.log_path = Tmp(absl::StrCat("cgroup-", k, ".log"));
    so.cgroup_procs_fd = procs->get();
    auto pid = SpawnWorker(so);
    REQUIRE(pid.ok());
    std::vector<pid_t> escaped;
    for (int i = 0; i < 200 && escaped.empty(); ++i) {
      escaped = WithMarker(marker);
      if (escaped.empty()) absl::SleepFor(absl::Milliseconds(10));
    }
    REQUIRE(escaped.size() == 1);
    // The kernel's view, not the library's: the escaped sleep is in the group, in a session of
    // its own and without the environment.
    const std::string own = Slurp(absl::StrCat("/proc/", escaped[0], "/cgroup"));
    CHECK(absl::StrContains(own, absl::StrCat("/", cg->dir().substr(cg->dir().rfind('/') + 1), "/", leaf, "\n")));
    CHECK(::getsid(escaped[0]) == escaped[0]);
    CHECK(Slurp(absl::StrCat("/proc/", escaped[0], "/environ")).empty());
    const auto in_group = cg->Procs(leaf);
    CHECK(std::find(in_group.begin(), in_group.end(), escaped[0]) != in_group.end());
    CHECK(std::find(in_group.begin(), in_group.end(), *pid) != in_group.end());

    int killed = 0;
    absl::Status s = cg->KillAndRemove(leaf, &killed);
    CHECK(s.ok());
    CHECK(killed >= 3);  // sh, the sleep 30 and the escaped sleep
    int status = 0;
    CHECK(::waitpid(*pid, &status, 0) == *pid);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    CHECK(WithMarker(marker).empty());
    struct stat st;
    CHECK(::stat((cg->dir() + "/" + leaf).c_str(), &st) != 0);
    for (pid_t p : WithMarker(marker)) ::kill(p, SIGKILL);  // nothing outlives a failed check
    CHECK(::stat(cg->dir().c_str(), &st) == 0);
    if (kill == CgroupKill::kSignalEach) {
      CHECK(cg->RemoveIfEmpty());
      CHECK(::stat(cg->dir().c_str(), &st) != 0);
    }
    CHECK(cg->RemoveAll().ok());
    CHECK(::stat(cg->dir().c_str(), &st) != 0);
  }
}

TEST_CASE("cgroup directories another user could write are refused") {
  auto cg = OpenOwn("hostile", CgroupKill::kAuto);
  if (cg == nullptr) return;
  // A group that is writable by others (a script could move itself out, or plant groups).
  const std::string leaf = "job-hostile.a0";
  REQUIRE(cg->Prepare(leaf).ok());
  REQUIRE(::chmod((cg->dir() + "/" + leaf).c_str(), 0777) == 0);
  auto again = cg->Prepare(leaf);
  CHECK(absl::IsFailedPrecondition(again.status()));
  CHECK(absl::StrContains(again.status().message(), leaf));
  // The daemon's directory owned by someone else: Open refuses it.
  const std::string name = absl::StrCat("cgroup-test-", ::getpid(), "-other");
  ProcessCgroupsOptions o;
  o.name = name;
  auto mine = ProcessCgroups::Open(o);
  REQUIRE(mine.ok());
  const std::string dir = (*mine)->dir();
  REQUIRE((*mine)->RemoveAll().ok());
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
  auto theirs = ProcessCgroups::Open(o);
  CHECK(absl::IsFailedPrecondition(theirs.status()));
  CHECK(absl::StrContains(theirs.status().message(), dir));
  ::rmdir(dir.c_str());
  // A parent that is not on cgroup2 is refused.
  o.parent = Tmp("");
  auto not_cg = ProcessCgroups::Open(o);
  CHECK(absl::IsFailedPrecondition(not_cg.status()));
  CHECK(cg->RemoveAll().ok());
}

}  // namespace
}  // namespace ember::daemon
