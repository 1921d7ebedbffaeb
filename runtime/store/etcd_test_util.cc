// EtcdTestCluster: see etcd_test_util.h.
#include "runtime/store/etcd_test_util.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/store/store_process_test_util.h"

namespace ember::store::testing {
namespace {

std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace

std::string EtcdTestCluster::Etcdctl(int member, const std::string& args) const {
  return Run(absl::StrCat("ETCDCTL_API=3 timeout 10 /usr/bin/etcdctl --endpoints=127.0.0.1:",
                          members_[member].client_port, " ", args, " 2>&1"));
}

EtcdTestCluster::EtcdTestCluster(int members) {
  std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "";
  if (base.empty()) base = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  // A test that crashed left its dirs (tmpfs is memory): remove those whose process is gone.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    int pid = 0;
    if (std::sscanf(name.c_str(), "ember-etcd-%d-", &pid) == 1 && pid > 0 &&
        kill(pid, 0) != 0 && errno == ESRCH) {
      std::filesystem::remove_all(e.path(), ec);
    }
  }
  std::string templ = absl::StrCat(base, "/ember-etcd-", getpid(), "-XXXXXX");
  REQUIRE(mkdtemp(templ.data()) != nullptr);
  root_ = templ;
  // A port FreePort found free can be taken by another test's connection before etcd binds it
  // (CI runs many tests at once): a cluster that is not healthy in time is started again on fresh
  // ports, up to 3 times, and the members' log tails are printed before giving up.
  bool healthy = false;
  for (int start = 0; start < 3 && !healthy; ++start) {
    StopAll();
    members_.clear();
    std::vector<std::string> peers;
    for (int i = 0; i < members; ++i) {
      Member m;
      m.client_port = FreePort();
      m.peer_port = FreePort();
      m.dir = absl::StrCat(root_, "/s", start, "-m", i);
      peers.push_back(absl::StrCat("m", i, "=http://127.0.0.1:", m.peer_port));
      members_.push_back(m);
    }
    initial_cluster_ = absl::StrJoin(peers, ",");
    for (int i = 0; i < members; ++i) Spawn(i);
    healthy = WaitHealthy(20);
    if (!healthy) {
      for (int i = 0; i < members; ++i) {
        std::fprintf(stderr, "etcd member m%d (client port %d, peer port %d) not healthy after 20 s "
                     "(start %d of 3); last log lines:\n%s\n", i, members_[i].client_port,
                     members_[i].peer_port, start + 1,
                     Run(absl::StrCat("tail -n 5 ", root_, "/m", i, ".log 2>&1")).c_str());
      }
    }
  }
  REQUIRE(healthy);
}

void EtcdTestCluster::StopAll() {
  for (Member& m : members_) {
    if (m.pid > 0) {
      kill(m.pid, SIGKILL);
      waitpid(m.pid, nullptr, 0);
      m.pid = -1;
    }
  }
}

EtcdTestCluster::~EtcdTestCluster() {
  StopAll();
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

void EtcdTestCluster::Spawn(int i) {
  Member& m = members_[i];
  const std::string name = absl::StrCat("m", i);
  const std::string client = absl::StrCat("http://127.0.0.1:", m.client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> args = {
      "/usr/bin/etcd", "--name", name, "--data-dir", m.dir,
      "--listen-client-urls", client, "--advertise-client-urls", client,
      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
      "--initial-cluster", initial_cluster_, "--initial-cluster-state", "new",
      "--initial-cluster-token", absl::StrCat("ember-test-", getpid()),
      "--logger", "zap", "--log-outputs", absl::StrCat(root_, "/", name, ".log")};
  pid_t pid = SpawnChild(std::move(args), "/dev/null");  // etcd logs to --log-outputs
  m.pid = pid;
}

std::vector<std::string> EtcdTestCluster::endpoints() const {
  std::vector<std::string> out;
  for (const Member& m : members_) out.push_back(absl::StrCat("127.0.0.1:", m.client_port));
  return out;
}

void EtcdTestCluster::Kill(int i) {
  REQUIRE(members_[i].pid > 0);
  REQUIRE(kill(members_[i].pid, SIGKILL) == 0);
  waitpid(members_[i].pid, nullptr, 0);
  members_[i].pid = -1;
}

void EtcdTestCluster::Restart(int i) {
  REQUIRE(members_[i].pid < 0);
  Spawn(i);
}

bool EtcdTestCluster::WaitHealthy(double timeout_s) const {
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  std::vector<std::string> live;
  for (const Member& m : members_) {
    if (m.pid > 0) live.push_back(absl::StrCat("127.0.0.1:", m.client_port));
  }
  const std::string cmd = absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=",
                                       absl::StrJoin(live, ","),
                                       " --command-timeout=2s endpoint health >/dev/null 2>&1");
  while (absl::Now() < deadline) {
    if (std::system(cmd.c_str()) == 0) return true;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return false;
}

int EtcdTestCluster::Leader() const {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i].pid < 0) continue;
    // simple format: endpoint, id, version, db size, is leader, is learner, term, index, ...
    const std::string out = Run(absl::StrCat(
        "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=127.0.0.1:", members_[i].client_port,
        " --command-timeout=2s endpoint status -w simple 2>/dev/null"));
    std::vector<std::string> fields = absl::StrSplit(out, ", ");
    if (fields.size() > 4 && fields[4] == "true") return static_cast<int>(i);
  }
  return -1;
}

}  // namespace ember::store::testing
