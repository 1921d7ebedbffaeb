// Unit tests of the daemon's parts: placement, spec path policy, processes, tokens (config in
// config_test.cc; the scheduler's restart, node-loss and retention decisions in scheduler_test.cc).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "runtime/base/auth.h"
#include "runtime/daemon/daemon.h"
#include "runtime/daemon/job_files.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/placement.h"
#include "runtime/store/reserved_keys.h"
#include "runtime/daemon/process.h"
#include "runtime/daemon/spec_policy.h"
#include "runtime/job/env.h"

namespace ember::daemon {
namespace {

std::string Tmp(const std::string& name) {
  const char* t = getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

TEST_CASE("gang placement uses as few nodes as possible and is all-or-nothing") {
  std::vector<NodeCapacity> nodes = {{"a", "A", {"cpu:0", "cpu:1"}},
                                     {"b", "B", {"cpu:0", "cpu:1", "cpu:2"}}};
  auto p = PlaceGang({3}, nodes);
  REQUIRE(p.has_value());
  REQUIRE(p->nodes_size() == 1);
  REQUIRE(p->nodes(0).node() == "b");
  p = PlaceGang({4}, nodes);
  REQUIRE(p.has_value());
  REQUIRE(p->nodes_size() == 2);
  REQUIRE(p->nodes(0).first_rank() == 0);
  REQUIRE(p->nodes(1).first_rank() == 3);
  REQUIRE(p->nodes(1).node_rank() == 1);
  REQUIRE_FALSE(PlaceGang({6}, nodes).has_value());
  p = PlaceGang({4, 2, 0}, nodes);  // exactly 2 nodes -> 2 each
  REQUIRE(p.has_value());
  REQUIRE(p->nodes(0).devices_size() == 2);
  REQUIRE(p->nodes(1).devices_size() == 2);
  REQUIRE_FALSE(PlaceGang({4, 0, 3}, nodes).has_value());  // 3 per node does not divide 4
  REQUIRE_FALSE(PlaceGang({0}, nodes).has_value());
}

TEST_CASE("spec paths and upload names stay inside the job directory") {
  spec::v1::JobSpec s;
  s.mutable_data()->set_path("data/tokens.bin");
  REQUIRE(CheckSpecPaths(s, {}).ok());
  s.mutable_data()->set_path("/datasets/x.bin");
  REQUIRE(absl::IsPermissionDenied(CheckSpecPaths(s, {})));
  REQUIRE(absl::StrContains(CheckSpecPaths(s, {}).message(), "none configured"));
  REQUIRE(CheckSpecPaths(s, {"/datasets"}).ok());
  REQUIRE(CheckSpecPaths(s, {"/datasets/"}).ok());
  absl::Status outside = CheckSpecPaths(s, {"/data", "/mnt/corpora"});
  REQUIRE(absl::IsPermissionDenied(outside));
  REQUIRE(absl::StrContains(outside.message(), "the data roots (/data, /mnt/corpora)"));
  s.mutable_data()->set_path("/datasets-evil/x.bin");  // a prefix of a root's name is not under it
  REQUIRE(absl::IsPermissionDenied(CheckSpecPaths(s, {"/datasets"})));
  s.mutable_data()->set_path("a/../../x");
  REQUIRE(absl::IsPermissionDenied(CheckSpecPaths(s, {"/datasets"})));
  REQUIRE(absl::StrContains(CheckSpecPaths(s, {}).message(), "data.path"));
  spec::v1::JobSpec hf;  // a Hugging Face directory to start from: the same rules
  hf.mutable_checkpoint()->set_init_from("/models/llama");
  REQUIRE(absl::StrContains(CheckSpecPaths(hf, {}).message(), "checkpoint.init_from"));
  REQUIRE(CheckSpecPaths(hf, {"/models"}).ok());
  REQUIRE(CheckUploadName("data/shakespeare.txt").ok());
  REQUIRE_FALSE(CheckUploadName("../x").ok());
  REQUIRE_FALSE(CheckUploadName("/etc/passwd").ok());
  REQUIRE_FALSE(CheckUploadName(".token").ok());
  REQUIRE_FALSE(CheckUploadName("a b").ok());
  REQUIRE_FALSE(CheckUploadName("../../../x/PWNED").ok());
  REQUIRE_FALSE(CheckUploadName("a//b").ok());
  REQUIRE_FALSE(CheckUploadName("a/./b").ok());
  REQUIRE_FALSE(CheckUploadName("a/").ok());
}

TEST_CASE("job ids read from the store are checked before they name a key or a directory") {
  CHECK(CheckJobId("tiny-gpt-3f9a2c").ok());
  CHECK(CheckJobId("a.b_c-1").ok());
  for (const char* bad : {"", ".", "..", "../x", "a/b", ".hidden", "-x", "a b", "x\n"}) {
    INFO(bad);
    CHECK(absl::IsInvalidArgument(CheckJobId(bad)));
  }
  CHECK_FALSE(CheckJobId(std::string(129, 'a')).ok());
  // Every key of the daemon lies in one of the key spaces a TCPStore prefix may never reach.
  for (const std::string& k : {keys::Node("n"), keys::Alloc("n", "cpu:0"), std::string(keys::kLeader),
                               keys::Submission("s"), keys::JobList("j"), keys::Active("j"),
                               keys::Record("j"), keys::SpecYaml("j"), keys::Fence("j"),
                               keys::File("j", "f"), keys::Stop("j", 1)}) {
    INFO(k);
    CHECK(std::any_of(std::begin(job::keys::kEmberdKeySpaces), std::end(job::keys::kEmberdKeySpaces),
                      [&](absl::string_view sp) { return absl::StartsWith(k, sp); }));
  }
  // ember-store refuses a --tcpstore-prefix by its own copy of the names (store sits below job).
  CHECK(std::vector<absl::string_view>(std::begin(job::keys::kEmberdKeySpaces),
                                       std::end(job::keys::kEmberdKeySpaces)) ==
        std::vector<absl::string_view>(std::begin(store::kReservedKeySpaces),
                                       std::end(store::kReservedKeySpaces)));
}

TEST_CASE("a spawned worker runs in its own process group and is killed with it") {
  std::string log = Tmp("proc.log");
  const std::string job = "unit-proc-job-" + std::to_string(getpid());  // unique per test process
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo hello; sleep 30 & wait"};
  o.env = {{"PATH", "/usr/bin:/bin"}, {ember::job::kEnvJobId, job}};
  o.log_path = log;
  o.header = "=== header ===";
  auto pid = SpawnWorker(o);
  REQUIRE(pid.ok());
  int code = 0, sig = 0;
  absl::SleepFor(absl::Milliseconds(200));  // the child has run setsid() by now
  REQUIRE(getpgid(*pid) == *pid);
  REQUIRE_FALSE(TryReap(*pid, &code, &sig));
  // The shell and its sleep (under load the fork of `sleep` can take a while: wait up to 10 s).
  for (int i = 0; i < 1000 && FindJobProcesses(job).size() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(FindJobProcesses(job).size() == 2);
  REQUIRE(SignalGroup(*pid, SIGKILL));
  for (int i = 0; i < 100 && !TryReap(*pid, &code, &sig); ++i) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(sig == SIGKILL);
  for (int i = 0; i < 100 && !FindJobProcesses(job).empty(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(FindJobProcesses(job).empty());
  auto lines = TailLines(log, 5);
  REQUIRE(lines.size() == 2);
  REQUIRE(lines[0] == "=== header ===");
  REQUIRE(lines[1] == "hello");
}

TEST_CASE("die_with_parent: the worker is killed when the thread that forked it ends") {
  for (bool die : {true, false}) {
    SpawnOptions o;
    o.argv = {"/bin/sleep", "30"};
    o.env = {{"PATH", "/usr/bin:/bin"}};
    o.log_path = Tmp("pdeath.log");
    o.die_with_parent = die;
    absl::StatusOr<pid_t> pid;
    std::thread forker([&] {
      pid = SpawnWorker(o);
      absl::SleepFor(absl::Milliseconds(300));  // the child has run prctl by now; then end
    });
    forker.join();
    REQUIRE(pid.ok());
    int code = 0, sig = 0;
    bool ended = false;
    for (int i = 0; i < 100 && !(ended = TryReap(*pid, &code, &sig)); ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    INFO("die_with_parent " << die);
    REQUIRE(ended == die);
    if (die) REQUIRE(sig == SIGKILL);
    if (!die) {
      REQUIRE(SignalGroup(*pid, SIGKILL));
      for (int i = 0; i < 100 && !TryReap(*pid, &code, &sig); ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
  }
}

TEST_CASE("exit codes are reported and an exec failure is 127") {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "exit 7"};
  o.log_path = Tmp("exit.log");
  auto pid = SpawnWorker(o);
  REQUIRE(pid.ok());
  int code = 0, sig = 0;
  for (int i = 0; i < 200 && !TryReap(*pid, &code, &sig); ++i) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(code == 7);
  REQUIRE(sig == 0);
  o.argv = {"/nonexistent/worker"};
  pid = SpawnWorker(o);
  REQUIRE(pid.ok());
  for (int i = 0; i < 200 && !TryReap(*pid, &code, &sig); ++i) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(code == 127);
  REQUIRE(absl::StrContains(TailLines(o.log_path, 1).at(0), "exec of the worker failed"));
}

TEST_CASE("logs rotate by copy-truncate, into a fresh 0640 file, never through a planted name") {
  const mode_t old_umask = ::umask(022);  // under which the copy used to be 0644
  const std::string dir = Tmp("rotdir");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string log = dir + "/rot.log";
  const std::string victim = Tmp("rot-victim");
  { std::ofstream(victim) << "precious\n"; }
  ::symlink(victim.c_str(), (log + ".1").c_str());  // planted: must be replaced, not written
  { std::ofstream(log) << std::string(2000, 'x') << "\n"; }
  auto d = OpenDirBelow(dir, "", false, /*own=*/true);
  REQUIRE(d.ok());
  const int live = ::open(log.c_str(), O_WRONLY | O_APPEND);  // a rank's descriptor
  REQUIRE(RotateLogIfLarger(d->get(), "rot.log", 1000, 2));
  REQUIRE(TailLines(log, 1).empty());
  REQUIRE(TailLines(log + ".1", 1).at(0).size() == 2000);
  struct stat st;
  REQUIRE(::lstat((log + ".1").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 0777) == 0640);
  CHECK(TailLines(victim, 5) == std::vector<std::string>{"precious"});
  REQUIRE(::write(live, "after\n", 6) == 6);  // the rank keeps writing into the live log
  CHECK(TailLines(log, 1) == std::vector<std::string>{"after"});
  ::close(live);
  REQUIRE_FALSE(RotateLogIfLarger(d->get(), "rot.log", 1000, 2));
  ::umask(old_umask);
}

TEST_CASE("job files: no symlink below the root is followed; own directories are checked") {
  const std::string root = Tmp("jf-root");
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/job/logs");
  ::chmod((root + "/job/logs").c_str(), 0750);
  const std::string victim = Tmp("jf-victim");
  { std::ofstream(victim) << "precious\n"; }
  // A symlinked directory component is refused, whatever it points at.
  ::symlink((root + "/job/logs").c_str(), (root + "/job/link").c_str());
  auto via_link = OpenFileBelow(root, "job/link/x.log", O_WRONLY | O_CREAT, 0640, false);
  CHECK(absl::IsFailedPrecondition(via_link.status()));
  // A symlinked file is refused, for reading and for writing.
  ::symlink(victim.c_str(), (root + "/job/logs/rank-0.log").c_str());
  CHECK_FALSE(OpenFileBelow(root, "job/logs/rank-0.log", O_WRONLY | O_APPEND, 0, true).ok());
  CHECK_FALSE(OpenFileBelow(root, "job/logs/rank-0.log", O_RDONLY, 0, true).ok());
  CHECK(TailOwnFile(root, "job/logs/rank-0.log", 5).empty());
  // A FIFO is refused at once (never blocks the reader).
  ::mkfifo((root + "/job/logs/fifo").c_str(), 0600);
  CHECK_FALSE(OpenFileBelow(root, "job/logs/fifo", O_RDONLY, 0, true).ok());
  // Writes replace a planted symlink instead of following it.
  REQUIRE(WriteFileBelow(root, "job/logs/rank-0.log", "mine\n", 0640, kNoGroup, true).ok());
  CHECK(TailLines(victim, 5) == std::vector<std::string>{"precious"});
  CHECK(TailLines(root + "/job/logs/rank-0.log", 5) == std::vector<std::string>{"mine"});
  // A group- or other-writable directory is not the daemon's own; MakeOwnDir moves it aside.
  ::chmod((root + "/job/logs").c_str(), 0777);
  CHECK(absl::IsFailedPrecondition(OpenDirBelow(root, "job/logs", false, true).status()));
  auto fresh = MakeOwnDir(root, "job/logs", kNoGroup);
  REQUIRE(fresh.ok());
  struct stat st;
  REQUIRE(::stat((root + "/job/logs").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0750);
  CHECK_FALSE(std::filesystem::exists(root + "/job/logs/rank-0.log"));
  CHECK(RelativeTo(root, root + "/job/logs/rank-0.log") == "job/logs/rank-0.log");
  CHECK(RelativeTo(root, "/elsewhere/x") == "");
}

TEST_CASE("process identity survives only with the same start time") {
  auto me = ReadProcInfo(getpid());
  REQUIRE(me.has_value());
  REQUIRE(me->start_ticks > 0);
  REQUIRE(ProcessAlive(getpid(), me->start_ticks));
  REQUIRE_FALSE(ProcessAlive(getpid(), me->start_ticks + 1));  // a reused pid
  pid_t child = fork();
  if (child == 0) _exit(0);
  absl::SleepFor(absl::Milliseconds(100));
  auto zombie = ReadProcInfo(child);
  REQUIRE(zombie.has_value());
  REQUIRE_FALSE(ProcessAlive(child, zombie->start_ticks));  // a zombie is not alive
  int code = 0, sig = 0;
  REQUIRE(TryReapChild(child, &code, &sig) == 1);
  REQUIRE(code == 0);
  REQUIRE(TryReapChild(child, &code, &sig) == -1);  // no longer our child
  REQUIRE_FALSE(ReadProcInfo(child).has_value());
}

}  // namespace
}  // namespace ember::daemon

namespace ember::daemon {

TEST_CASE("the interface holding an address (a script job's GLOO_SOCKET_IFNAME)") {
  CHECK(InterfaceOfAddress("127.0.0.1") == "lo");
  CHECK(InterfaceOfAddress("192.0.2.77") == "");  // TEST-NET-1: no interface of this host has it
  CHECK(InterfaceOfAddress("localhost") == "");   // literals only, no name resolution
  CHECK(InterfaceOfAddress("") == "");
}

TEST_CASE("a script job's MASTER_ADDR: the advertised host, never loopback across nodes") {
  CHECK(*ScriptMasterAddr("10.0.0.7", "10.0.0.7:29400", 2) == "10.0.0.7");
  CHECK(*ScriptMasterAddr("", "0.0.0.0:29400", 1) == "127.0.0.1");  // one node: loopback is fine
  CHECK(*ScriptMasterAddr("127.0.0.1", "127.0.0.1:29400", 1) == "127.0.0.1");
  for (const std::string host : {"", "127.0.0.1", "127.0.1.1", "localhost"}) {
    auto m = ScriptMasterAddr(host, "[::]:29400", 2);
    REQUIRE_FALSE(m.ok());
    CHECK(absl::IsFailedPrecondition(m.status()));
    CHECK(absl::StrContains(m.status().message(), "'[::]:29400'"));
    CHECK(absl::StrContains(m.status().message(), "advertise"));
  }
}

TEST_CASE("script jobs: who runs them (script_user, allow_root_scripts) and their environment") {
  // Not root: the daemon's own user; another user cannot be switched to.
  auto self = ScriptIdentityFor(1000, "", false);
  REQUIRE(self.ok());
  CHECK_FALSE(self->switch_user);
  auto other = ScriptIdentityFor(1000, "nobody", false);
  REQUIRE_FALSE(other.ok());
  CHECK(absl::IsFailedPrecondition(other.status()));
  CHECK(std::string(other.status().message()).find("script_user") != std::string::npos);
  // Root: refused unless allow_root_scripts, named in the message.
  auto root = ScriptIdentityFor(0, "nobody", false);
  REQUIRE_FALSE(root.ok());
  CHECK(std::string(root.status().message()).find("allow_root_scripts") != std::string::npos);
  auto as_root = ScriptIdentityFor(0, "", true);
  REQUIRE(as_root.ok());
  CHECK_FALSE(as_root->switch_user);
  CHECK(as_root->uid == 0);
  auto nobody = ScriptIdentityFor(0, "nobody", true);
  REQUIRE(nobody.ok());
  CHECK(nobody->switch_user);
  CHECK(nobody->uid == 65534);  // Debian's nobody
  CHECK(absl::IsNotFound(ScriptIdentityFor(0, "no-such-user-x", true).status()));

  spec::v1::JobSpec spec;
  spec.mutable_worker()->set_script("t.py");
  (*spec.mutable_worker()->mutable_env())["OMP_NUM_THREADS"] = "4";  // torchrun allows it too
  CHECK(CheckScriptEnv(spec).ok());
  (*spec.mutable_worker()->mutable_env())["MASTER_PORT"] = "1";
  auto s = CheckScriptEnv(spec);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(std::string(s.message()).find("worker.env.MASTER_PORT") != std::string::npos);
  // An absolute script must be under a data root, like data files.
  spec.mutable_worker()->clear_env();
  spec.mutable_worker()->set_script("/home/u/t.py");
  CHECK(absl::IsPermissionDenied(CheckSpecPaths(spec, {"/datasets"})));
  CHECK(CheckSpecPaths(spec, {"/home/u"}).ok());
}

}  // namespace ember::daemon
