// Shared parts of the store benchmarks (store_bench, store_compat_bench): client child processes
// that run one op for a time window or pass a barrier, the parent side that forks them, releases
// them at once and collects their figures, and the Python peer runner. See store_bench_util.h.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
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
#include "deploy/peers_venv.h"
#include "runtime/base/json.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/client.h"
#include "runtime/store/store_bench_util.h"

ABSL_FLAG(double, seconds, 1.0, "measurement window per (op, clients) point and round");
ABSL_FLAG(int, rounds, 3, "interleaved rounds per point (median reported); --quick: 1");
ABSL_FLAG(int, window, 64, "requests in flight per client for the pipelined set");
ABSL_FLAG(int, add_window, 16, "adds in flight per client for add_pipelined (store::Pipeline)");
ABSL_FLAG(std::string, peer_script, "", "path to tcpstore_peer.py (found in runfiles if empty)");
ABSL_FLAG(bool, no_peer, false, "skip the TCPStore peer");
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

namespace ember::store::bench_util {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

namespace {

void SignalReadyAndWait() {
  char c = 'r';
  (void)!write(absl::GetFlag(FLAGS_ready_fd), &c, 1);
  (void)!read(absl::GetFlag(FLAGS_go_fd), &c, 1);  // returns 0 when the parent closes the pipe
}

// --- child: one client process running one op for a time window -------------------------------
ClientOptions ChildClientOptions() {
  ClientOptions o{.address = absl::GetFlag(FLAGS_addr)};
  o.use_unix_socket = absl::GetFlag(FLAGS_transport) == "unix";
  return o;
}

}  // namespace

void Die(const absl::Status& s) {
  std::fprintf(stderr, "store bench child: %s\n", s.ToString().c_str());
  std::_Exit(1);
}

void WriteOpsOutput(int64_t n, int64_t start, int64_t end, const std::vector<int64_t>& lats) {
  std::ofstream f(absl::GetFlag(FLAGS_out));
  f << n << " " << start << " " << end << " " << lats.size() << "\n";
  for (int64_t l : lats) f << l << "\n";
}

int TimedLoop(const std::function<absl::Status(int64_t i)>& op) {
  SignalReadyAndWait();
  std::vector<int64_t> lats;
  lats.reserve(200000);
  int64_t n = 0;
  const int64_t start = NowNs();
  const int64_t end_at = start + static_cast<int64_t>(absl::GetFlag(FLAGS_seconds) * 1e9);
  while (true) {
    const int64_t t0 = NowNs();
    if (t0 >= end_at) break;
    absl::Status s = op(n);
    if (!s.ok()) Die(s);
    if (lats.size() < 200000) lats.push_back(NowNs() - t0);
    ++n;
  }
  WriteOpsOutput(n, start, NowNs(), lats);
  return 0;
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
  const bool pipelined = op == "add_pipelined" || op == "set_pipelined";
  if (pipelined) SignalReadyAndWait();  // TimedLoop signals for the others
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
    return TimedLoop([&](int64_t i) -> absl::Status {
      if (op == "set") return c->Set(absl::StrCat("bench/set/", rank, "/", i % 100), val);
      if (op == "get") return c->Get(absl::StrCat("bench/get/", rank, "/", i % 100)).status();
      return c->Add(absl::StrCat("bench/add/", rank), 1).status();
    });
  }
  WriteOpsOutput(n, start, NowNs(), lats);
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
  return CollectOps(run.second);
}

absl::StatusOr<OpsResult> CollectOps(const std::vector<std::string>& outs) {
  int64_t ops = 0, start = INT64_MAX, end = 0;
  std::vector<int64_t> lats;
  for (const auto& path : outs) {
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

std::string PeerScript(const std::string& name) {
  if (!absl::GetFlag(FLAGS_peer_script).empty() && name == "tcpstore_peer.py") {
    return absl::GetFlag(FLAGS_peer_script);
  }
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  exe[n > 0 ? n : 0] = 0;
  std::vector<std::string> cands = {
      absl::StrCat(exe, ".runfiles/ember/runtime/store/", name), "runtime/store/" + name};
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    cands.push_back(absl::StrCat(ws, "/runtime/store/", name));
  }
  for (const auto& c : cands) {
    if (access(c.c_str(), R_OK) == 0) return c;
  }
  return "";
}

std::string PeerPython() { return deploy::PeerPython(); }

std::string PeerTorchLabel() {
  // Asked once per interpreter (EMBER_PEER_PYTHON may change between parts of one run).
  static absl::Mutex mu(absl::kConstInit);
  static auto* labels = new std::map<std::string, std::string>;
  const std::string py = PeerPython();
  absl::MutexLock lock(&mu);
  if (auto it = labels->find(py); it != labels->end()) return it->second;
  std::string version = deploy::PeerTorchVersion(py);
  if (version.empty()) version = "?";  // no torch there: the row says so
  return (*labels)[py] = absl::StrCat("torch ", version, " (", py, ")");
}

// Runs the peer script; returns its JSON object, or why there is none.
absl::StatusOr<json::Value> RunPeer(const std::string& args, const std::string& tmpdir,
                                    const std::string& name) {
  if (absl::GetFlag(FLAGS_no_peer)) return absl::UnavailableError("peer skipped (--no_peer)");
  std::string script = PeerScript(name);
  if (script.empty()) return absl::NotFoundError(name + " not found (--peer_script)");
  std::string err = tmpdir + "/peer.err";
  std::string cmd = absl::StrCat("OMP_NUM_THREADS=1 timeout 300 ", PeerPython(), " ", script, " ",
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
    return absl::UnavailableError(absl::StrCat(name, " ", args, " failed (wait status ",
                                               st, WEXITSTATUS(st) == 124 ? ", timed out" : "",
                                               "): ", err_text));
  }
  return json::Parse(out);
}

double Num(const json::Value& v, const char* key) {
  const json::Value& f = v.Get(key);
  return f.is_number() ? f.as_double() : std::nan("");
}


int RunChildRole() {
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "ops") return ChildOps();
  if (role == "barrier") return ChildBarrier();
  return -1;
}

}  // namespace ember::store::bench_util
