// store_bench: ember-store vs PyTorch's TCPStore, side by side in one run.
//
//   bazel run -c opt //runtime/store:store_bench -- [--json] [--seconds=1.5] [--quick]
//
// For 1, 4 and 16 client processes: set/get/add ops/s with p50/p99 latency (each client one op in
// flight), plus pipelined acknowledged sets (a window of requests in flight per client). Then the
// time for 256 processes (one connection each) to connect and pass a barrier (Add, then Wait), and
// 1024 simulated ranks (64 processes x 16 connections). The TCPStore peer runs the same loops from
// the same number of processes (tcpstore_peer.py under Debian's /usr/bin/python3).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "runtime/base/flags.h"
#include "runtime/base/json.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

ABSL_FLAG(bool, json, false, "print one JSON object (with a targets array) instead of the table");
ABSL_FLAG(double, seconds, 1.5, "measurement window per (op, clients) point");
ABSL_FLAG(bool, quick, false, "smoke run: short windows, 64-process barrier, no 1024 ranks");
ABSL_FLAG(int, window, 64, "requests in flight per client for the pipelined set");
ABSL_FLAG(std::string, peer_script, "", "path to tcpstore_peer.py (found in runfiles if empty)");
ABSL_FLAG(bool, no_peer, false, "skip the TCPStore peer");
ABSL_FLAG(std::string, only, "", "run one part: 'ops' or 'barrier' (default: both)");
ABSL_FLAG(std::string, server, "", "benchmark this running ember-store (host:port) instead of an "
          "in-process one");
// Internal: child roles.
ABSL_FLAG(std::string, role, "", "internal: ops | barrier");
ABSL_FLAG(std::string, addr, "", "internal");
ABSL_FLAG(std::string, op, "", "internal");
ABSL_FLAG(int, rank, 0, "internal");
ABSL_FLAG(int, world, 0, "internal");
ABSL_FLAG(int, conns, 1, "internal: connections (simulated ranks) per process");
ABSL_FLAG(int, ready_fd, -1, "internal");
ABSL_FLAG(int, go_fd, -1, "internal");
ABSL_FLAG(std::string, out, "", "internal");

namespace ember::store {
namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void SignalReadyAndWait() {
  char c = 'r';
  (void)!write(absl::GetFlag(FLAGS_ready_fd), &c, 1);
  (void)!read(absl::GetFlag(FLAGS_go_fd), &c, 1);  // returns 0 when the parent closes the pipe
}

void Die(const absl::Status& s) {
  std::fprintf(stderr, "store_bench child: %s\n", s.ToString().c_str());
  std::_Exit(1);
}

// --- child: one client process running one op for a time window -------------------------------
int ChildOps() {
  auto c = Client::Connect({.address = absl::GetFlag(FLAGS_addr)});
  if (!c.ok()) Die(c.status());
  int rank = absl::GetFlag(FLAGS_rank);
  std::string op = absl::GetFlag(FLAGS_op);
  std::string val(16, 'x');
  for (int i = 0; i < 100; ++i) {
    absl::Status s = c->Set(absl::StrCat("bench/get/", rank, "/", i), val);
    if (!s.ok()) Die(s);
  }
  SignalReadyAndWait();
  std::vector<int64_t> lats;
  lats.reserve(200000);
  int64_t n = 0;
  int64_t start = NowNs();
  int64_t end_at = start + static_cast<int64_t>(absl::GetFlag(FLAGS_seconds) * 1e9);
  if (op == "set_pipelined") {
    const int window = absl::GetFlag(FLAGS_window);
    absl::Mutex mu;
    int inflight = 0;
    int64_t done = 0;
    absl::Status first_error;
    while (NowNs() < end_at) {
      {
        absl::MutexLock l(&mu);
        auto has_room = [&] { return inflight < window; };
        mu.Await(absl::Condition(&has_room));
        ++inflight;
      }
      int64_t t0 = NowNs();
      c->SetAsync(absl::StrCat("bench/set/", rank, "/", n % 100), val, [&, t0](absl::Status s) {
        int64_t t1 = NowNs();
        absl::MutexLock l(&mu);
        if (!s.ok() && first_error.ok()) first_error = s;
        if (lats.size() < 200000) lats.push_back(t1 - t0);
        --inflight;
        ++done;
      });
      ++n;
    }
    absl::MutexLock l(&mu);
    auto drained = [&] { return inflight == 0; };
    mu.Await(absl::Condition(&drained));
    if (!first_error.ok()) Die(first_error);
  } else {
    while (true) {
      int64_t t0 = NowNs();
      if (t0 >= end_at) break;
      absl::Status s;
      if (op == "set") {
        s = c->Set(absl::StrCat("bench/set/", rank, "/", n % 100), val);
      } else if (op == "get") {
        s = c->Get(absl::StrCat("bench/get/", rank, "/", n % 100)).status();
      } else {
        s = c->Add(absl::StrCat("bench/add/", rank), 1).status();
      }
      if (!s.ok()) Die(s);
      int64_t t1 = NowNs();
      if (lats.size() < 200000) lats.push_back(t1 - t0);
      ++n;
    }
  }
  int64_t end = NowNs();
  std::ofstream f(absl::GetFlag(FLAGS_out));
  f << n << " " << start << " " << end << " " << lats.size() << "\n";
  for (int64_t l : lats) f << l << "\n";
  return 0;
}

// --- child: `conns` simulated ranks connect and pass a barrier ----------------------------------
int ChildBarrier() {
  SignalReadyAndWait();
  int conns = absl::GetFlag(FLAGS_conns);
  int world = absl::GetFlag(FLAGS_world);
  std::vector<int64_t> connect_end(conns), barrier_end(conns);
  std::vector<std::thread> ts;
  std::atomic<bool> failed{false};
  for (int i = 0; i < conns; ++i) {
    ts.emplace_back([&, i] {
      ClientOptions o{.address = absl::GetFlag(FLAGS_addr)};
      o.connect_timeout = absl::Seconds(120);
      auto c = Client::Connect(o);
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
        failed = true;
        return;
      }
      connect_end[i] = NowNs();
      absl::Status s = c->Barrier("bench/barrier", world, absl::Seconds(120));
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        failed = true;
      }
      barrier_end[i] = NowNs();
    });
  }
  for (auto& t : ts) t.join();
  if (failed) return 1;
  std::ofstream f(absl::GetFlag(FLAGS_out));
  f << *std::max_element(connect_end.begin(), connect_end.end()) << " "
    << *std::max_element(barrier_end.begin(), barrier_end.end()) << "\n";
  return 0;
}

// --- parent ------------------------------------------------------------------------------------
struct OpsResult {
  double ops_per_s = 0, p50_us = 0, p99_us = 0;
};
struct BarrierResult {
  double connect_s = 0, barrier_s = 0;
};

// Spawns `n` children of this binary with `args`; waits for all to be ready, releases them at once.
// Returns the go time (monotonic ns) and the per-child output file paths.
std::pair<int64_t, std::vector<std::string>> SpawnAndRun(int n, const std::vector<std::string>& args,
                                                         const std::string& tmpdir) {
  int ready[2], go[2];
  if (pipe(ready) != 0 || pipe(go) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (int r = 0; r < n; ++r) {
    std::string out = absl::StrCat(tmpdir, "/child-", r);
    outs.push_back(out);
    pid_t pid = fork();
    if (pid == 0) {
      close(go[1]);
      close(ready[0]);
      std::vector<std::string> a = {"/proc/self/exe"};
      a.insert(a.end(), args.begin(), args.end());
      a.push_back(absl::StrCat("--rank=", r));
      a.push_back(absl::StrCat("--ready_fd=", ready[1]));
      a.push_back(absl::StrCat("--go_fd=", go[0]));
      a.push_back("--out=" + out);
      a.push_back("--log_level=warn");
      std::vector<char*> argv;
      for (auto& s : a) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  close(ready[1]);
  close(go[0]);
  int got = 0;
  char buf[1024];
  while (got < n) {
    ssize_t k = read(ready[0], buf, std::min<int>(sizeof(buf), n - got));
    if (k <= 0) {
      std::fprintf(stderr, "store_bench: a child died before it was ready\n");
      std::exit(1);
    }
    got += static_cast<int>(k);
  }
  int64_t go_time = NowNs();
  close(go[1]);
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr, "store_bench: a child failed (status %d)\n", st);
      std::exit(1);
    }
  }
  close(ready[0]);
  return {go_time, outs};
}

OpsResult RunEmberOps(const std::string& addr, const std::string& op, int clients,
                      const std::string& tmpdir) {
  auto [go, outs] = SpawnAndRun(
      clients,
      {"--role=ops", "--addr=" + addr, "--op=" + op,
       absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds)),
       absl::StrCat("--window=", absl::GetFlag(FLAGS_window))},
      tmpdir);
  int64_t ops = 0, start = INT64_MAX, end = 0;
  std::vector<int64_t> lats;
  for (const auto& path : outs) {
    std::ifstream f(path);
    int64_t n, s, e, k;
    f >> n >> s >> e >> k;
    ops += n;
    start = std::min(start, s);
    end = std::max(end, e);
    for (int64_t i = 0, l; i < k && f >> l; ++i) lats.push_back(l);
    unlink(path.c_str());
  }
  std::sort(lats.begin(), lats.end());
  auto pct = [&](double q) {
    return lats.empty() ? 0.0 : lats[std::min(lats.size() - 1, size_t(q * lats.size()))] / 1e3;
  };
  return {ops / ((end - start) / 1e9), pct(0.5), pct(0.99)};
}

BarrierResult RunEmberBarrier(const std::string& addr, int procs, int conns,
                              const std::string& tmpdir) {
  auto [go, outs] = SpawnAndRun(procs,
                                {"--role=barrier", "--addr=" + addr,
                                 absl::StrCat("--world=", procs * conns),
                                 absl::StrCat("--conns=", conns)},
                                tmpdir);
  int64_t connect_end = 0, barrier_end = 0;
  for (const auto& path : outs) {
    std::ifstream f(path);
    int64_t c, b;
    f >> c >> b;
    connect_end = std::max(connect_end, c);
    barrier_end = std::max(barrier_end, b);
    unlink(path.c_str());
  }
  return {(connect_end - go) / 1e9, (barrier_end - connect_end) / 1e9};
}

std::string PeerScript() {
  if (!absl::GetFlag(FLAGS_peer_script).empty()) return absl::GetFlag(FLAGS_peer_script);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  exe[n > 0 ? n : 0] = 0;
  std::vector<std::string> cands = {
      absl::StrCat(exe, ".runfiles/ember/runtime/store/tcpstore_peer.py"),
      "runtime/store/tcpstore_peer.py"};
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    cands.push_back(absl::StrCat(ws, "/runtime/store/tcpstore_peer.py"));
  }
  for (const auto& c : cands) {
    if (access(c.c_str(), R_OK) == 0) return c;
  }
  return "";
}

// Runs the peer script; returns its JSON line ("" on failure).
std::string RunPeer(const std::string& args) {
  std::string script = PeerScript();
  if (script.empty() || absl::GetFlag(FLAGS_no_peer)) return "";
  std::string cmd = absl::StrCat("OMP_NUM_THREADS=1 timeout 300 /usr/bin/python3 ", script, " ",
                                 args, " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  pclose(p);
  return out;
}

// A number from the peer's JSON line; 0 when the peer did not run or the key is missing.
double JsonNum(const std::string& text, const std::string& key) {
  auto v = json::Parse(text);
  if (!v.ok()) return 0;
  const json::Value& f = v->Get(key);
  return f.is_number() ? f.as_double() : 0;
}

struct Target {
  std::string name;
  double value;
  double peer;  // <= 0: null
  double goal;
  bool higher_is_better;
  std::string unit;
};

int Parent() {
  bool quick = absl::GetFlag(FLAGS_quick);
  bool json = absl::GetFlag(FLAGS_json);
  if (quick) absl::SetFlag(&FLAGS_seconds, std::min(absl::GetFlag(FLAGS_seconds), 0.5));
  char tmpl[] = "/tmp/store-bench-XXXXXX";
  std::string tmpdir = mkdtemp(tmpl);
  std::unique_ptr<StoreServer> server;
  std::string addr = absl::GetFlag(FLAGS_server);
  if (addr.empty()) {
    auto started = StoreServer::Start({.address = "127.0.0.1:0"});
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
      return 1;
    }
    server = std::move(*started);
    addr = server->address();
  }
  std::vector<Target> targets;
  std::string table;
  absl::StrAppendFormat(&table, "%-22s %8s | %12s %9s %9s | %12s %9s %9s | %7s\n", "op", "clients",
                        "ember ops/s", "p50 us", "p99 us", "tcpstore/s", "p50 us", "p99 us",
                        "ratio");
  std::vector<int> client_counts = {1, 4, 16};
  std::vector<std::string> ops = {"set", "get", "add", "set_pipelined"};
  if (absl::GetFlag(FLAGS_only) == "barrier") ops.clear();
  for (const std::string& op : ops) {
    for (int n : client_counts) {
      OpsResult e = RunEmberOps(addr, op, n, tmpdir);
      std::string peer_op = op == "set_pipelined" ? "set" : op;
      std::string pj = RunPeer(absl::StrCat("ops --op ", peer_op, " --clients ", n, " --seconds ",
                                            absl::GetFlag(FLAGS_seconds)));
      OpsResult p{JsonNum(pj, "ops_per_s"), JsonNum(pj, "p50_us"), JsonNum(pj, "p99_us")};
      double ratio = p.ops_per_s > 0 ? e.ops_per_s / p.ops_per_s : 0;
      absl::StrAppendFormat(&table, "%-22s %8d | %12.0f %9.1f %9.1f | %12.0f %9.1f %9.1f | %6.2fx\n",
                            op == "set_pipelined" ? "set (acked, pipelined)" : op, n, e.ops_per_s,
                            e.p50_us, e.p99_us, p.ops_per_s, p.p50_us, p.p99_us, ratio);
      if ((op == "get" || op == "add") && n >= 4) {
        targets.push_back({absl::StrCat(op, "_ops_per_s_", n, "_clients"), e.ops_per_s,
                           p.ops_per_s, 2.0, true, "ops/s"});
      }
      if (op == "set_pipelined" && n == 16) {
        targets.push_back({"acked_pipelined_set_vs_unacked_tcpstore_set_16_clients", e.ops_per_s,
                           p.ops_per_s, 1.0, true, "ops/s"});
      }
    }
  }
  int procs = quick ? 64 : 256;
  if (absl::GetFlag(FLAGS_only) == "ops") procs = 0;
  BarrierResult eb;
  std::string pj;
  if (procs > 0) {
    eb = RunEmberBarrier(addr, procs, 1, tmpdir);
    pj = RunPeer(absl::StrCat("barrier --clients ", procs));
  }
  BarrierResult pb{JsonNum(pj, "connect_s"), JsonNum(pj, "barrier_s")};
  absl::StrAppendFormat(&table, "\n%-34s | %10s %10s %10s\n", "connect + barrier", "connect s",
                        "barrier s", "total s");
  absl::StrAppendFormat(&table, "%-34s | %10.3f %10.3f %10.3f\n",
                        absl::StrCat("ember, ", procs, " processes"), eb.connect_s, eb.barrier_s,
                        eb.connect_s + eb.barrier_s);
  absl::StrAppendFormat(&table, "%-34s | %10.3f %10.3f %10.3f\n",
                        absl::StrCat("tcpstore, ", procs, " processes"), pb.connect_s, pb.barrier_s,
                        pb.connect_s + pb.barrier_s);
  if (procs > 0) {
    targets.push_back({absl::StrCat("connect_plus_barrier_", procs, "_processes"),
                       eb.connect_s + eb.barrier_s, pb.connect_s + pb.barrier_s, 0.5, false, "s"});
  }
  if (!quick && procs > 0) {
    BarrierResult e1k = RunEmberBarrier(addr, 64, 16, tmpdir);
    absl::StrAppendFormat(&table, "%-34s | %10.3f %10.3f %10.3f\n",
                          "ember, 1024 ranks (64 proc x 16)", e1k.connect_s, e1k.barrier_s,
                          e1k.connect_s + e1k.barrier_s);
    targets.push_back({"connect_plus_barrier_1024_simulated_ranks", e1k.connect_s + e1k.barrier_s,
                       -1, 1.0, false, "s"});
  }
  rmdir(tmpdir.c_str());
  if (!json) {
    std::printf("%s\n", table.c_str());
    for (const auto& t : targets) {
      bool met = t.peer > 0 ? (t.higher_is_better ? t.value / t.peer >= t.goal
                                                  : t.value / t.peer <= t.goal)
                            : (t.higher_is_better ? t.value >= t.goal : t.value <= t.goal);
      std::printf("target %-58s %s\n", t.name.c_str(), met ? "MET" : "MISSED");
    }
    return 0;
  }
  std::string out = "{\"benchmark\":\"store_bench\",\"targets\":[";
  for (size_t i = 0; i < targets.size(); ++i) {
    const Target& t = targets[i];
    absl::StrAppendFormat(&out,
                          "%s{\"name\":\"%s\",\"value\":%.6g,\"peer\":%s,\"goal\":%g,"
                          "\"higher_is_better\":%s,\"unit\":\"%s\"}",
                          i ? "," : "", t.name, t.value,
                          t.peer > 0 ? absl::StrFormat("%.6g", t.peer) : "null", t.goal,
                          t.higher_is_better ? "true" : "false", t.unit);
  }
  out += "]}";
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace ember::store

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "store_bench");
  signal(SIGPIPE, SIG_IGN);
  std::string role = absl::GetFlag(FLAGS_role);
  if (role == "ops") return ember::store::ChildOps();
  if (role == "barrier") return ember::store::ChildBarrier();
  return ember::store::Parent();
}
