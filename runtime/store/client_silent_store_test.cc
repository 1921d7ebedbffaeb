// A silent store: the real ember-store process is SIGSTOPped, so its connections stay open (the
// kernel still ACKs, no RST, no FIN) and no request is answered, as across a cut link. Every call
// must still return by its deadline (+ kMargin) with DEADLINE_EXCEEDED or UNAVAILABLE naming the
// store's address and the deadline; once the store runs again (SIGCONT) a new call must get its
// own, correct answer on a fresh connection. Each transport: the abstract Unix socket, the fast
// path's TCP socket, the gRPC Session stream. Loopback only; every wait is bounded.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/store/client.h"
#include "runtime/store/store_process_test_util.h"

namespace ember::store {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(1);
// kServerSlack (250 ms) for held calls plus room for a loaded CI machine; the old client took 5 s more.
constexpr absl::Duration kMargin = absl::Seconds(1);

// A running ember-store (in memory, no auth) on a free loopback port; SIGKILLed at the end.
class StoreProcess {
 public:
  StoreProcess() {
    char tmpl[] = "/tmp/ember-store-silent-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    const std::string port_file = dir_ + "/port";
    pid_ = testing::SpawnChild({testing::StoreBinary(), "--listen=127.0.0.1:0",
                                "--port-file=" + port_file, "--log_level=warn",
                                "--insecure-no-auth"});
    port_ = testing::WaitPort(port_file);
  }
  ~StoreProcess() {
    kill(pid_, SIGKILL);
    kill(pid_, SIGCONT);
    waitpid(pid_, nullptr, 0);
    (void)!system(("rm -rf '" + dir_ + "'").c_str());
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  // SIGSTOP, then waits (up to 5 s) until every thread of the store is stopped: kill() returns
  // before they are, and a request could still be answered meanwhile.
  void Stop() {
    REQUIRE(kill(pid_, SIGSTOP) == 0);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!AllStopped()) {
      REQUIRE(absl::Now() < give_up);
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  void Resume() { REQUIRE(kill(pid_, SIGCONT) == 0); }

 private:
  // Whether every /proc/<pid>/task/<tid>/stat says state T (stopped).
  bool AllStopped() const {
    const std::string tasks = absl::StrCat("/proc/", pid_, "/task");
    DIR* d = opendir(tasks.c_str());
    if (d == nullptr) return false;
    bool all = true;
    int n = 0;
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(absl::StrCat(tasks, "/", e->d_name, "/stat"));
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');  // "tid (comm) S ..."
      if (paren == std::string::npos || paren + 2 >= stat.size()) continue;  // thread gone
      ++n;
      if (stat[paren + 2] != 'T') all = false;
    }
    closedir(d);
    return all && n > 0;
  }

  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// Local ports of this host's ESTABLISHED loopback TCP connections to `remote_port`
// (/proc/net/tcp: "sl local rem st ...", addresses as HEXIP:HEXPORT, state 01 = ESTABLISHED).
std::set<int> EstablishedTo(int remote_port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  std::set<int> out;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string sl, local, rem, st;
    in >> sl >> local >> rem >> st;
    if (st != "01") continue;
    if (std::stoi(rem.substr(rem.find(':') + 1), nullptr, 16) != remote_port) continue;
    out.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
  }
  return out;
}

struct Timed {
  absl::Status status;
  absl::Duration took;
};

Timed Time(const std::function<absl::Status()>& call) {
  const absl::Time t0 = absl::Now();
  absl::Status s = call();
  return {s, absl::Now() - t0};
}

// One call on the silent store: it ends by its deadline + kMargin, with a status that says it was
// not answered and names the store and the deadline.
void CheckSilent(const std::string& what, const std::string& address,
                 const std::function<absl::Status()>& call) {
  const Timed t = Time(call);
  INFO(what << " -> " << t.status.ToString() << " after " << absl::FormatDuration(t.took));
  fprintf(stderr, "silent store: %s returned after %s: %s\n", what.c_str(),
          absl::FormatDuration(t.took).c_str(), t.status.ToString().c_str());
  CHECK((absl::IsDeadlineExceeded(t.status) || absl::IsUnavailable(t.status)));
  CHECK(t.took >= kDeadline - absl::Milliseconds(5));
  CHECK(t.took < kDeadline + kMargin);
  CHECK(t.status.message().find(address) != std::string::npos);
  CHECK(t.status.message().find(absl::FormatDuration(kDeadline)) != std::string::npos);
}

TEST_CASE("every call on a silent store returns by its deadline; the next one after it resumes "
          "gets its own answer") {
  const int transport = GENERATE(0, 1, 2);
  const char* names[] = {"unix", "tcp", "grpc stream"};
  INFO("transport: " << names[transport]);
  StoreProcess store;
  ClientOptions o;
  o.address = store.address();
  o.use_unix_socket = transport == 0;
  o.use_fast_path = transport != 2;
  auto connected = Client::Connect(o);
  REQUIRE(connected.ok());
  Client c = *connected;
  const CallOptions d{.timeout = kDeadline};
  REQUIRE(c.Set("k", "v1", d).ok());
  REQUIRE(c.Set("other", "v2", d).ok());
  REQUIRE(*c.Get("k", d) == "v1");
  const std::set<int> before = EstablishedTo(store.port() + 1);  // the fast path's TCP port
  if (transport == 1) REQUIRE(!before.empty());

  store.Stop();
  const std::string& a = store.address();
  // First, on the open connection, a value larger than the socket buffers: the caller blocks in
  // send() until the deadline drops the connection.
  const std::string big(8 << 20, 'b');
  CheckSilent("Set(8 MiB)", a, [&] { return c.Set("big", big, d); });
  CheckSilent("Get", a, [&] { return c.Get("k", d).status(); });
  CheckSilent("Set", a, [&] { return c.Set("k3", "v3", d); });
  CheckSilent("Get(wait)", a, [&] {
    return c.Get("absent", {.wait = true, .timeout = kDeadline}).status();
  });
  CheckSilent("Wait", a, [&] { return c.Wait({"absent"}, kDeadline); });
  CheckSilent("Add", a, [&] { return c.Add("n", 1, d).status(); });
  CheckSilent("MultiGet(wait)", a, [&] {
    return c.MultiGet({"k", "absent"}, {.wait = true, .timeout = kDeadline}).status();
  });
  // A new client's Connect gives up at connect_timeout, though its dial (dial_timeout 5 s) is
  // still waiting for the store's hello: the dial is abandoned, not waited for.
  CheckSilent("Connect", a, [&] {
    ClientOptions fresh = o;
    fresh.connect_timeout = kDeadline;
    return Client::Connect(fresh).status();
  });

  store.Resume();
  // The first answer after the resume is this call's own (not the late reply to Get("k") above),
  // within a reconnect's time.
  const absl::Time t0 = absl::Now();
  auto v = c.Get("other", {.timeout = absl::Seconds(10)});
  const absl::Duration took = absl::Now() - t0;
  fprintf(stderr, "after SIGCONT: Get took %s\n", absl::FormatDuration(took).c_str());
  REQUIRE(v.ok());
  CHECK(*v == "v2");
  CHECK(*c.Get("k", d) == "v1");
  REQUIRE(c.Set("k4", "v4", d).ok());
  CHECK(*c.Get("k4", d) == "v4");
  if (transport == 1) {
    // The silent connection was dropped and a fresh one dialled.
    const std::set<int> after = EstablishedTo(store.port() + 1);
    INFO("client ports before " << before.size() << ", after " << after.size());
    for (int p : before) CHECK(after.count(p) == 0);
  }
}

}  // namespace
}  // namespace ember::store
