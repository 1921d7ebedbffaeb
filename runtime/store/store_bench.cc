// store_bench: ember-store vs PyTorch's TCPStore, side by side in one run.
//
//   bazel run -c opt //runtime/store:store_bench -- [--json [--allow-missing-peers]] [--quick]
//       [--seconds=1] [--rounds=3] [--no_peer]
//
// For 1, 4 and 16 client processes: set/get/add ops/s with p50/p99 latency (each client one op in
// flight), plus pipelined adds (store::Pipeline, --add_window in flight per client, compared with
// TCPStore's one-at-a-time add: its client cannot pipeline) and pipelined acknowledged sets. Then
// the time for 256 processes (one connection each) to connect and pass a barrier (Add, then Wait),
// and 1024 simulated ranks (64 processes x 16 connections). The TCPStore peer runs the same loops
// from the same number of processes (tcpstore_peer.py under Debian's /usr/bin/python3).
//
// Like for like (issue 11): TCPStore speaks TCP, so every row that carries a TCPStore target runs
// our client over TCP loopback; the abstract-Unix-socket fast path appears in Ember-only rows.
// Each point runs --rounds times interleaved (ember tcp, tcpstore, ember unix, ember tcp, ...) and
// reports the medians, so both sides see the same machine load. Round trips per op are stated per
// row: TCPStore's get is wait + get (2), its barrier helper 4; `add` is one on both (the headline).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/base/json.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/client.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/server.h"

ABSL_FLAG(double, seconds, 1.0, "measurement window per (op, clients) point and round");
ABSL_FLAG(int, rounds, 3, "interleaved rounds per point (median reported); --quick: 1");
ABSL_FLAG(int, window, 64, "requests in flight per client for the pipelined set");
ABSL_FLAG(int, add_window, 16, "adds in flight per client for add_pipelined (store::Pipeline)");
ABSL_FLAG(std::string, peer_script, "", "path to tcpstore_peer.py (found in runfiles if empty)");
ABSL_FLAG(bool, no_peer, false, "skip the TCPStore peer");
ABSL_FLAG(std::string, only, "", "run one part: 'ops' or 'barrier' (default: both)");
ABSL_FLAG(std::vector<std::string>, ops, {},
          "ops rows to run (default all): add,add_pipelined,get,set,set_pipelined");
ABSL_FLAG(std::string, server, "", "benchmark this running ember-store (host:port) instead of an "
          "in-process one");
ABSL_FLAG(std::string, backend, "memory",
          "backend of the in-process server: 'memory' or 'etcd' (needs --etcd_endpoints)");
ABSL_FLAG(std::string, etcd_endpoints, "", "with --backend etcd: host:port,... of a running etcd");
// Internal: child roles.
ABSL_FLAG(std::string, role, "", "internal: ops | barrier");
ABSL_FLAG(std::string, addr, "", "internal");
ABSL_FLAG(std::string, op, "", "internal");
ABSL_FLAG(std::string, transport, "tcp", "internal: tcp | unix (client fast-path socket)");
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
ClientOptions ChildClientOptions() {
  ClientOptions o{.address = absl::GetFlag(FLAGS_addr)};
  o.use_unix_socket = absl::GetFlag(FLAGS_transport) == "unix";
  return o;
}

int ChildOps() {
  auto c = Client::Connect(ChildClientOptions());
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
  if (op == "add_pipelined") {
    // The same adds as `add`, --add_window of them in flight on the client's one connection.
    // Guards lats: callbacks usually run on this thread, on expiry on the client's timer thread.
    absl::Mutex mu;
    Pipeline p(*c, absl::GetFlag(FLAGS_add_window));
    const std::string key = absl::StrCat("bench/add/", rank);
    while (true) {
      int64_t t0 = NowNs();
      if (t0 >= end_at) break;
      p.Add(key, 1, [&, t0](const absl::StatusOr<int64_t>&) {
        int64_t t1 = NowNs();
        absl::MutexLock l(&mu);
        if (lats.size() < 200000) lats.push_back(t1 - t0);
      });
      ++n;
    }
    absl::Status s = p.Drain();  // every started add has finished: n counts completed ops
    if (!s.ok()) Die(s);
  } else if (op == "set_pipelined") {
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
      ClientOptions o = ChildClientOptions();
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
  double total() const { return connect_s + barrier_s; }
};

// Spawns `n` children of this binary with `args`; waits for all to be ready, releases them at once.
// Returns the go time (monotonic ns) and the per-child output file paths. Any child failing fails
// the call (an error inside a timed loop fails the run).
absl::StatusOr<std::pair<int64_t, std::vector<std::string>>> SpawnAndRun(
    int n, const std::vector<std::string>& args, const std::string& tmpdir) {
  int ready[2], go[2];
  if (pipe(ready) != 0 || pipe(go) != 0) return absl::InternalError("pipe failed");
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
  bool died = false;
  while (got < n) {
    ssize_t k = read(ready[0], buf, std::min<int>(sizeof(buf), n - got));
    if (k <= 0) {
      died = true;
      break;
    }
    got += static_cast<int>(k);
  }
  int64_t go_time = NowNs();
  close(go[1]);
  int failed = 0, last_status = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ++failed;
      last_status = st;
    }
  }
  close(ready[0]);
  if (died || failed > 0) {
    return absl::InternalError(absl::StrCat(failed, " of ", n, " client processes failed (",
                                            args[0], ", last wait status ", last_status,
                                            "); their errors are on stderr"));
  }
  return std::make_pair(go_time, outs);
}

absl::StatusOr<OpsResult> RunEmberOps(const std::string& addr, const std::string& transport,
                                      const std::string& op, int clients,
                                      const std::string& tmpdir) {
  const std::vector<std::string> args = {
      "--role=ops", "--addr=" + addr, "--op=" + op, "--transport=" + transport,
      absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds)),
      absl::StrCat("--window=", absl::GetFlag(FLAGS_window))};
  ASSIGN_OR_RETURN(auto run, SpawnAndRun(clients, args, tmpdir));
  int64_t ops = 0, start = INT64_MAX, end = 0;
  std::vector<int64_t> lats;
  for (const auto& path : run.second) {
    std::ifstream f(path);
    int64_t n, s, e, k;
    if (!(f >> n >> s >> e >> k)) return absl::InternalError("unreadable client output " + path);
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
  return OpsResult{ops / ((end - start) / 1e9), pct(0.5), pct(0.99)};
}

absl::StatusOr<BarrierResult> RunEmberBarrier(const std::string& addr, int procs, int conns,
                                              const std::string& tmpdir) {
  const std::vector<std::string> args = {"--role=barrier", "--addr=" + addr, "--transport=tcp",
                                         absl::StrCat("--world=", procs * conns),
                                         absl::StrCat("--conns=", conns)};
  ASSIGN_OR_RETURN(auto run, SpawnAndRun(procs, args, tmpdir));
  int64_t connect_end = 0, barrier_end = 0;
  for (const auto& path : run.second) {
    std::ifstream f(path);
    int64_t c, b;
    if (!(f >> c >> b)) return absl::InternalError("unreadable client output " + path);
    connect_end = std::max(connect_end, c);
    barrier_end = std::max(barrier_end, b);
    unlink(path.c_str());
  }
  return BarrierResult{(connect_end - run.first) / 1e9, (barrier_end - connect_end) / 1e9};
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

// Runs the peer script; returns its JSON object, or why there is none.
absl::StatusOr<json::Value> RunPeer(const std::string& args, const std::string& tmpdir) {
  if (absl::GetFlag(FLAGS_no_peer)) return absl::UnavailableError("peer skipped (--no_peer)");
  std::string script = PeerScript();
  if (script.empty()) return absl::NotFoundError("tcpstore_peer.py not found (--peer_script)");
  std::string err = tmpdir + "/peer.err";
  std::string cmd = absl::StrCat("OMP_NUM_THREADS=1 timeout 300 /usr/bin/python3 ", script, " ",
                                 args, " 2>", err);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return absl::InternalError("popen failed");
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  int st = pclose(p);
  std::ifstream ef(err);
  std::string err_text((std::istreambuf_iterator<char>(ef)), {});
  unlink(err.c_str());
  if (st != 0) {
    if (err_text.size() > 300) err_text = "..." + err_text.substr(err_text.size() - 300);
    return absl::UnavailableError(absl::StrCat("tcpstore_peer.py ", args, " failed (wait status ",
                                               st, WEXITSTATUS(st) == 124 ? ", timed out" : "",
                                               "): ", err_text));
  }
  return json::Parse(out);
}

double Num(const json::Value& v, const char* key) {
  const json::Value& f = v.Get(key);
  return f.is_number() ? f.as_double() : std::nan("");
}

int Parent(int argc, char** argv) {
  bench::Report report("store_bench", argc, argv);
  const bool quick = bench::Quick();
  if (quick) absl::SetFlag(&FLAGS_seconds, std::min(absl::GetFlag(FLAGS_seconds), 0.2));
  const int rounds = quick ? 1 : std::max(1, absl::GetFlag(FLAGS_rounds));
  char tmpl[] = "/tmp/store-bench-XXXXXX";
  std::string tmpdir = mkdtemp(tmpl);
  std::unique_ptr<StoreServer> server;
  std::string addr = absl::GetFlag(FLAGS_server);
  if (addr.empty()) {
    StoreServerOptions opts{.address = "127.0.0.1:0"};
    if (absl::GetFlag(FLAGS_backend) == "etcd") {
      EtcdOptions e;
      e.endpoints = absl::StrSplit(absl::GetFlag(FLAGS_etcd_endpoints), ',', absl::SkipEmpty());
      if (e.endpoints.empty()) {
        return report.Fail(absl::InvalidArgumentError("--backend etcd needs --etcd_endpoints"));
      }
      e.prefix = absl::StrCat("/ember-bench/", getpid(), "/");
      opts.make_backend = [e](const BackendOptions& b, base::Clock*) {
        return NewEtcdBackend(e, b);
      };
    } else if (absl::GetFlag(FLAGS_backend) != "memory") {
      return report.Fail(absl::InvalidArgumentError("--backend is 'memory' or 'etcd'"));
    }
    report.SetMeta("backend", json::Value::Str(absl::GetFlag(FLAGS_backend)));
    auto started = StoreServer::Start(std::move(opts));
    if (!started.ok()) return report.Fail(started.status());
    server = std::move(*started);
    addr = server->address();
  }
  report.SetMeta("seconds_per_point", json::Value::Double(absl::GetFlag(FLAGS_seconds)));
  report.SetMeta("rounds", json::Value::Int(rounds));
  report.SetMeta("peer", json::Value::Str("PyTorch TCPStore (/usr/bin/python3 tcpstore_peer.py)"));

  bench::Table& table = report.AddTable(
      absl::StrCat("ops: ", absl::GetFlag(FLAGS_seconds), " s per point, median of ", rounds,
                   " interleaved rounds (ember tcp, tcpstore, ember unix)"),
      {"op", "transport", "clients", "RTT/op ember", "ember ops/s", "p50 us", "p99 us",
       "RTT/op tcpstore", "tcpstore ops/s", "p50 us", "p99 us", "ratio"});
  table.AddNote("transport: tcp = TCP loopback (the TCPStore comparison); unix = our abstract "
                "Unix socket fast path (Ember only, no target)");
  table.AddNote("RTT/op: round trips per call. TCPStore get = wait + get (2); its set is not "
                "acknowledged (0: no reply awaited); add is 1 on both (the headline)");
  table.AddNote(absl::StrCat(
      "add (pipelined): the same adds over TCP, ", absl::GetFlag(FLAGS_add_window),
      " in flight per client (store::Pipeline, --add_window; sent in frames of up to that many; "
      "p50/p99 from Add() to its answer, time queued in the window included); its tcpstore "
      "column is TCPStore's one-at-a-time add, because TCPStore's client cannot pipeline (it "
      "waits for each answer)"));
  table.AddNote("set (acked, pipelined): --window acknowledged sets in flight per client; its "
                "tcpstore column is TCPStore's own (unacknowledged) set");
  std::vector<int> client_counts = quick ? std::vector<int>{1, 4} : std::vector<int>{1, 4, 16};
  std::vector<std::string> ops = {"add", "add_pipelined", "get", "set", "set_pipelined"};
  if (!absl::GetFlag(FLAGS_ops).empty()) {
    for (const std::string& op : absl::GetFlag(FLAGS_ops)) {
      if (std::find(ops.begin(), ops.end(), op) == ops.end()) {
        return report.Fail(absl::InvalidArgumentError(absl::StrCat(
            "--ops: unknown op '", op, "'; choose from add,add_pipelined,get,set,set_pipelined")));
      }
    }
    ops = absl::GetFlag(FLAGS_ops);
  }
  if (absl::GetFlag(FLAGS_only) == "barrier") ops.clear();
  auto rtt = [](const std::string& op, bool tcpstore) -> std::string {
    if (op == "add_pipelined") {
      return tcpstore ? "1" : absl::StrCat("1, pipelined (", absl::GetFlag(FLAGS_add_window),
                                           " in flight)");
    }
    if (op == "get") return tcpstore ? "2" : "1";
    if (op == "set") return tcpstore ? "0 (no reply)" : "1";
    if (op == "set_pipelined") return tcpstore ? "0 (no reply)" : "1, pipelined";
    return "1";
  };
  for (const std::string& op : ops) {
    for (int n : client_counts) {
      std::vector<OpsResult> tcp, uds, peer;
      std::string peer_error;
      std::string peer_op = op == "set_pipelined" ? "set" : op == "add_pipelined" ? "add" : op;
      for (int r = 0; r < rounds; ++r) {
        auto e = RunEmberOps(addr, "tcp", op, n, tmpdir);
        if (!e.ok()) return report.Fail(e.status());
        tcp.push_back(*e);
        auto pj = RunPeer(absl::StrCat("ops --op ", peer_op, " --clients ", n, " --seconds ",
                                       absl::GetFlag(FLAGS_seconds)),
                          tmpdir);
        if (pj.ok() && Num(*pj, "ops_per_s") > 0) {
          peer.push_back({Num(*pj, "ops_per_s"), Num(*pj, "p50_us"), Num(*pj, "p99_us")});
        } else {
          peer_error = pj.ok() ? "peer printed no ops_per_s" : std::string(pj.status().message());
          std::fprintf(stderr, "store_bench: %s\n", peer_error.c_str());
        }
        auto u = RunEmberOps(addr, "unix", op, n, tmpdir);
        if (!u.ok()) return report.Fail(u.status());
        uds.push_back(*u);
      }
      auto med = [](const std::vector<OpsResult>& v, double OpsResult::*f) -> std::optional<double> {
        if (v.empty()) return std::nullopt;
        std::vector<double> x;
        for (const auto& r : v) x.push_back(r.*f);
        return bench::Median(x);
      };
      const std::string label = op == "set_pipelined"   ? "set (acked, pipelined)"
                                : op == "add_pipelined" ? "add (pipelined)"
                                                        : op;
      std::optional<double> e_ops = med(tcp, &OpsResult::ops_per_s);
      std::optional<double> p_ops = med(peer, &OpsResult::ops_per_s);
      std::optional<double> ratio;
      if (p_ops) ratio = *e_ops / *p_ops;
      table.AddRow({label, "tcp", n, rtt(op, false), e_ops, med(tcp, &OpsResult::p50_us),
                    med(tcp, &OpsResult::p99_us), rtt(op, true), p_ops,
                    med(peer, &OpsResult::p50_us), med(peer, &OpsResult::p99_us), ratio});
      table.AddRow({label, "unix", n, rtt(op, false), med(uds, &OpsResult::ops_per_s),
                    med(uds, &OpsResult::p50_us), med(uds, &OpsResult::p99_us), bench::Cell(),
                    bench::Cell(), bench::Cell(), bench::Cell(), bench::Cell()});
      if ((op == "get" || op == "add") && n >= 4) {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat(op, "_ops_per_s_", n, "_clients_tcp"), *e_ops, p_ops, 2.0,
            bench::kHigherIsBetter, "ops/s", peer_error,
            op == "add" ? "TCP loopback on both; 1 round trip per op and one op in flight on both"
                        : "TCP loopback on both; ember get 1 round trip, TCPStore get 2 (wait + get)"));
      }
      if (op == "add_pipelined" && n >= 4) {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat("add_pipelined_ops_per_s_", n, "_clients_tcp"), *e_ops, p_ops, 2.0,
            bench::kHigherIsBetter, "ops/s", peer_error,
            absl::StrCat("headline: the same adds over TCP loopback on both; ember pipelined (",
                         absl::GetFlag(FLAGS_add_window), " in flight per client), TCPStore one "
                         "at a time because its client cannot pipeline")));
      }
      if (op == "set_pipelined" && n == client_counts.back()) {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat("acked_pipelined_set_vs_unacked_tcpstore_set_", n, "_clients_tcp"),
            *e_ops, p_ops, 1.0, bench::kHigherIsBetter, "ops/s", peer_error,
            "TCP loopback on both; ours acknowledged with a window in flight, TCPStore's set "
            "awaits no reply"));
      }
    }
  }
  int procs = quick ? 16 : 256;
  if (absl::GetFlag(FLAGS_only) != "ops") {
    bench::Table& bt = report.AddTable(
        absl::StrCat("connect + barrier over TCP loopback: median of ", rounds,
                     " interleaved rounds (ember, tcpstore)"),
        {"who", "processes x connections", "RTT/barrier", "connect s", "barrier s", "total s"});
    bt.AddNote("RTT/barrier: ember Barrier = add + wait (the last arrival adds a set); the "
               "TCPStore helper (tcpstore_peer.py) = add + wait + add + wait (+ set)");
    std::vector<double> ec, eb, pc, pbar;
    std::string peer_error;
    for (int r = 0; r < rounds; ++r) {
      auto e = RunEmberBarrier(addr, procs, 1, tmpdir);
      if (!e.ok()) return report.Fail(e.status());
      ec.push_back(e->connect_s);
      eb.push_back(e->barrier_s);
      auto pj = RunPeer(absl::StrCat("barrier --clients ", procs), tmpdir);
      if (pj.ok() && Num(*pj, "connect_s") > 0) {
        pc.push_back(Num(*pj, "connect_s"));
        pbar.push_back(Num(*pj, "barrier_s"));
      } else {
        peer_error = pj.ok() ? "peer printed no connect_s" : std::string(pj.status().message());
        std::fprintf(stderr, "store_bench: %s\n", peer_error.c_str());
      }
    }
    const double e_total = bench::Median(ec) + bench::Median(eb);
    bt.AddRow({"ember", absl::StrCat(procs, " x 1"), "2 (+1 last)", bench::Median(ec),
               bench::Median(eb), e_total});
    std::optional<double> p_total;
    if (!pc.empty()) p_total = bench::Median(pc) + bench::Median(pbar);
    bt.AddRow({"tcpstore", absl::StrCat(procs, " x 1"), "4 (+1 last)",
               pc.empty() ? bench::Cell() : bench::Cell(bench::Median(pc)),
               pbar.empty() ? bench::Cell() : bench::Cell(bench::Median(pbar)), p_total});
    report.AddTarget(bench::Target::VsPeer(
        absl::StrCat("connect_plus_barrier_", procs, "_processes_tcp"), e_total, p_total, 0.5,
        bench::kLowerIsBetter, "s", peer_error, "TCP loopback on both"));
    if (!quick) {
      auto e1k = RunEmberBarrier(addr, 64, 16, tmpdir);
      if (!e1k.ok()) return report.Fail(e1k.status());
      bt.AddRow({"ember", "64 x 16 (1024 ranks)", "2 (+1 last)", e1k->connect_s, e1k->barrier_s,
                 e1k->total()});
      report.AddTarget(bench::Target::Absolute("connect_plus_barrier_1024_simulated_ranks_tcp",
                                               e1k->total(), 1.0, bench::kLowerIsBetter, "s",
                                               "one run, TCP loopback"));
    }
  }
  rmdir(tmpdir.c_str());
  return report.Finish();
}

}  // namespace
}  // namespace ember::store

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "store_bench");
  signal(SIGPIPE, SIG_IGN);
  std::string role = absl::GetFlag(FLAGS_role);
  if (role == "ops") return ember::store::ChildOps();
  if (role == "barrier") return ember::store::ChildBarrier();
  return ember::store::Parent(argc, argv);
}
