// comm_bench: nccl-tests-style benchmark of the cpu backend, with Gloo (torch.distributed) and
// Open MPI measured in the same run on the same machine.
//
// The Gloo peer is PyTorch 2.15's (issue 30): gloo_peer.py runs under --python if given, else
// $EMBER_PEER_PYTHON, else the peers venv of deploy/peers-venv.sh (deploy/peers_venv.h); never
// Debian's /usr/bin/python3 (torch 1.13) as a silent fallback: with the venv missing, every tcp-vs-
// gloo target is not measured (met: false) with the reason. The tables, the meta and every gloo
// row name the torch version; both sides run one compute thread per rank (ours: the executor
// thread; Gloo: torch.set_num_threads(1), OMP_NUM_THREADS=1, checked in the peer).
//
//   bazel run -c opt //runtime/comm:comm_bench -- --ranks=2,4 [--json [--allow-missing-peers]]
//       [--rounds=3] [--quick]
//
// For every (ranks, transport shm|tcp, op, size) it prints time (us), algbw and busbw (GB/s) with
// the nccl-tests factors (all_reduce 2(n-1)/n; all_gather, reduce_scatter (n-1)/n). Size is the
// full buffer (all_reduce), the gathered output (all_gather) or the scattered input
// (reduce_scatter), f32. Correctness is checked once per size outside the timed loop; a wrong
// result or an error inside a timed loop fails the run. Each implementation's time is the median
// of 3 timed loops, max across ranks; the whole sweep runs --rounds times with the implementations
// interleaved (ember shm, ember tcp, gloo, mpi, ember shm, ...) and each cell is the median over
// rounds. One table per (op, ranks), bench/report.h format.
//
// Across hosts (issue 20): with --netns=NS0,NS1,... (one network namespace per rank, e.g. made by
// tests/multihost/veth_bench.sh) and --netns_hosts=ADDR0,ADDR1,..., rank r of ours and of Gloo
// runs in NS r (`ip netns exec`) and talks over ADDR r (ours: EMBER_COMM_HOST, a boot id per rank so
// no pair shares memory; Gloo: GLOO_SOCKET_IFNAME=eth0, its store at ADDR 0). The report is then
// "comm_veth_bench", TCP only, tcp-vs-gloo targets for every size >= 1 MiB, and the table also
// gives each side's CPU time per op (user + system of all its rank processes, summed over ranks):
// with every rank on one small machine, CPU, not the link, is what bounds busbw.
//
// One GPU (issue 17): --backend=nccl measures world size 1 on cuda:0 instead (comm_bench_nccl.h):
// all_reduce and all_gather up to 1 GiB (--quick: 64 MiB; --max_bytes overrides) beside
// device-to-device copy bandwidth from the same run, eager vs lazy communicator creation and each
// communicator's memory; report "comm_nccl_bench". Without a usable GPU it says SKIP on stderr and
// every target is not measured with the reason (exit 0; with --json 3 unless --allow-missing-peers;
// 1 when EMBER_EXPECT_GPUS is set and not 0, as in tests/gpu/run.sh check).
//
// Like for like (issue 11): shm targets are against Open MPI (shared memory, vader); TCP targets
// against Gloo (TCP), reduce_scatter included (torch 2.15's ProcessGroupGloo has
// reduce_scatter_tensor; torch 1.13's had none, and its column was an all_reduce reference).
// Loop lengths are the same rule on every side (ours, gloo_peer.py, mpi_peer.c): 2 warm-up calls,
// one probe call after a barrier, iterations = clamp(--loop_seconds / probe, 3, 5000), the MAX
// over ranks, 3 timed loops. TCP congestion control: our ranks run with
// EMBER_COMM_TCP_CONGESTION=system, so both TCP sides use the (namespace's) kernel default; the
// notes name it. Cells with more ranks than cores are oversubscribed on every side: their targets
// are marked informational.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/report.h"
#include "deploy/peers_venv.h"
#include "runtime/base/flags.h"
#include "runtime/comm/comm_bench_nccl.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/comm/process_group.h"

ABSL_FLAG(std::string, backend, "cpu",
          "cpu (ranks as processes, with Gloo and Open MPI) or nccl (world size 1 on cuda:0)");
ABSL_FLAG(std::string, ranks, "2,4", "rank counts");
ABSL_FLAG(std::string, transports, "shm,tcp", "shm and/or tcp");
ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter", "");
ABSL_FLAG(int64_t, min_bytes, 4096, "");
ABSL_FLAG(int64_t, max_bytes, 0, "largest size; 0: 64 MiB (cpu), 1 GiB (nccl; --quick 64 MiB)");
ABSL_FLAG(std::string, peers, "gloo,mpi", "peers to measure: gloo (torch), mpi (Open MPI)");
ABSL_FLAG(double, loop_seconds, 0.15, "target length of one timed loop; --quick: 0.02");
ABSL_FLAG(int, rounds, 3, "interleaved rounds of the whole sweep (median per cell); --quick: 1");
ABSL_FLAG(std::string, python, "",
          "python with torch for the Gloo peer (empty: $EMBER_PEER_PYTHON, else the torch 2.15 "
          "venv of deploy/peers-venv.sh; missing: the gloo targets are not measured)");
ABSL_FLAG(std::string, bench_dir, "runtime/comm/bench", "where gloo_peer.py and mpi_peer.c live");
ABSL_FLAG(std::string, netns, "", "comma-separated network namespace per rank (across hosts)");
ABSL_FLAG(std::string, netns_hosts, "", "with --netns: the address of each rank's namespace");
// Internal: worker mode.
ABSL_FLAG(int, worker_rank, -1, "");
ABSL_FLAG(int, worker_size, 0, "");
ABSL_FLAG(std::string, worker_dir, "", "");

namespace ember::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> Sizes() {
  std::vector<int64_t> s;
  for (int64_t b = absl::GetFlag(FLAGS_min_bytes); b <= absl::GetFlag(FLAGS_max_bytes); b *= 4) s.push_back(b);
  return s;
}

double BusFactor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

std::vector<std::string> NetnsList(const absl::Flag<std::string>& f) {
  return absl::StrSplit(absl::GetFlag(f), ',', absl::SkipEmpty());
}
bool AcrossHosts() { return !absl::GetFlag(FLAGS_netns).empty(); }

// User + system CPU time of this process so far (every thread), microseconds.
double CpuMicros() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  auto us = [](const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

int Worker() {
  const int rank = absl::GetFlag(FLAGS_worker_rank), n = absl::GetFlag(FLAGS_worker_size);
  const std::string dir = absl::GetFlag(FLAGS_worker_dir);
  GroupOptions o;
  o.name = "bench";
  auto pgs = ProcessGroup::Create(MakeFileRendezvous(dir + "/rdzv"), rank, n, o);
  if (!pgs.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, pgs.status().ToString().c_str());
    return 2;
  }
  ProcessGroup& pg = **pgs;
  const int64_t max = absl::GetFlag(FLAGS_max_bytes);
  std::vector<float> in(max / 4), out(max / 4);
  std::ostringstream lines;
  int wrong = 0;
  for (const std::string& op : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_ops), ','))) {
    for (int64_t size : Sizes()) {
      size_t count = size / 4, per = count / n;
      auto run = [&]() -> absl::Status {
        if (op == "all_reduce") return pg.AllReduce(out.data(), count, DataType::kF32, ReduceOp::kSum)->Wait();
        if (op == "all_gather") return pg.AllGatherSingle(in.data(), out.data(), per, DataType::kF32)->Wait();
        return pg.ReduceScatterSingle(in.data(), out.data(), per, DataType::kF32, ReduceOp::kSum)->Wait();
      };
      // Correctness, outside the timed loop.
      for (size_t i = 0; i < count; ++i) in[i] = out[i] = static_cast<float>(rank + 1 + (i % 3));
      if (absl::Status s = run(); !s.ok()) {
        std::fprintf(stderr, "rank %d %s: %s\n", rank, op.c_str(), s.ToString().c_str());
        return 1;
      }
      size_t check = op == "all_reduce" ? count : op == "all_gather" ? per * n : per;
      for (size_t i = 0; i < check; ++i) {
        double want;
        size_t gi = op == "reduce_scatter" ? rank * per + i : i;
        if (op == "all_gather") want = static_cast<int>(i / per) + 1 + ((i % per) % 3);
        else want = n * (n + 1) / 2.0 + n * static_cast<double>(gi % 3);
        if (out[i] != want) {
          ++wrong;
          break;
        }
      }
      // Any error from here on fails the run: a timed loop with a failed collective in it
      // measures nothing.
      auto must = [&](const absl::Status& s, const char* what) {
        if (s.ok()) return;
        std::fprintf(stderr, "rank %d %s %s %lld bytes: %s\n", rank, what, op.c_str(),
                     static_cast<long long>(size), s.ToString().c_str());
        std::_Exit(1);
      };
      // Loop lengths as gloo_peer.py and mpi_peer.c: 2 warm-ups, a probe, iterations from it
      // (the MAX over ranks: every rank must run the same count).
      must(run(), "warm-up");
      must(run(), "warm-up");
      must(pg.Barrier()->Wait(), "barrier");
      auto t0 = Clock::now();
      must(run(), "probe");
      double one = std::chrono::duration<double>(Clock::now() - t0).count();
      double it_d =
          std::clamp(absl::GetFlag(FLAGS_loop_seconds) / std::max(one, 1e-7), 3.0, 5000.0);
      int64_t iters = static_cast<int64_t>(it_d);
      must(pg.AllReduce(&iters, 1, DataType::kI64, ReduceOp::kMax)->Wait(), "all_reduce of iters");
      std::vector<double> reps;
      double cpu_us = -CpuMicros();
      for (int k = 0; k < 3; ++k) {
        must(pg.Barrier()->Wait(), "barrier");
        auto t = Clock::now();
        for (int64_t i = 0; i < iters; ++i) must(run(), "timed loop");
        reps.push_back(std::chrono::duration<double>(Clock::now() - t).count() / iters);
      }
      cpu_us = (cpu_us + CpuMicros()) / (3 * iters);  // this process, per op (barriers included)
      std::sort(reps.begin(), reps.end());
      double med = reps[1];
      must(pg.AllReduce(&med, 1, DataType::kF64, ReduceOp::kMax)->Wait(), "all_reduce of times");
      must(pg.AllReduce(&cpu_us, 1, DataType::kF64, ReduceOp::kSum)->Wait(), "all_reduce of cpu");
      if (rank == 0) lines << op << " " << n << " " << size << " " << med * 1e6 << " " << cpu_us << "\n";
    }
  }
  int32_t w = wrong;
  if (absl::Status st = pg.AllReduce(&w, 1, DataType::kI32, ReduceOp::kSum)->Wait(); !st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
    return 1;
  }
  if (rank == 0) {
    std::ofstream f(dir + "/out.txt");
    f << lines.str() << "wrong " << w << "\n";
  }
  return 0;
}

// Runs `cmd` through the shell; stdout in *out. Returns the wait status.
int Run(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, k);
  return pclose(p);
}

std::string ReadTail(const std::string& path) {
  std::ifstream f(path);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  unlink(path.c_str());
  return s.size() > 300 ? "..." + s.substr(s.size() - 300) : s;
}

// Cell key: impl ("ember-shm", "ember-tcp", "gloo", "mpi"), op, ranks, bytes.
using Key = std::tuple<std::string, std::string, int, int64_t>;

// Parses "<impl> <op> <n> <bytes> <us> [<cpu us>]" lines into `cells` (one sample each; the CPU
// time per op, summed over ranks, under impl + " cpu").
void ParseLines(const std::string& text, const std::string& impl,
                std::map<Key, std::vector<double>>* cells) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 5 && f.size() != 6) continue;
    int n;
    int64_t bytes;
    double us, cpu;
    if (!absl::SimpleAtoi(f[2], &n) || !absl::SimpleAtoi(f[3], &bytes) ||
        !absl::SimpleAtod(f[4], &us)) {
      continue;
    }
    (*cells)[{impl, f[1], n, bytes}].push_back(us);
    if (f.size() == 6 && absl::SimpleAtod(f[5], &cpu)) (*cells)[{impl + " cpu", f[1], n, bytes}].push_back(cpu);
  }
}

// One sweep of ours at `n` ranks over `tr`; appends samples. Any rank failing fails the run.
absl::Status RunEmber(const char* self, int n, absl::string_view tr,
                      std::map<Key, std::vector<double>>* cells, int* wrong_total) {
  std::string dir = absl::StrCat("/tmp/ember_comm_bench_", getpid(), "_", n, "_", tr);
  std::string ignored;
  Run("rm -rf " + dir + " && mkdir -p " + dir, &ignored);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      if (tr == "tcp") setenv(ember::comm::kEnvDisableShm, "1", 1);
      // Like for like with Gloo: the kernel's congestion control (the namespace's), not CUBIC
      // set per socket (tcp.cc), so both TCP sides run the same one.
      setenv(ember::comm::kEnvTcpCongestion, "system", 1);
      std::vector<std::string> a;
      if (AcrossHosts()) {  // rank r in namespace r, as host r (validated by Orchestrate)
        setenv(ember::comm::kEnvHost, NetnsList(FLAGS_netns_hosts)[r].c_str(), 1);
        setenv(ember::comm::kEnvBootId, absl::StrCat("comm-bench-host", r).c_str(), 1);
        a = {"ip", "netns", "exec", NetnsList(FLAGS_netns)[r]};
      }
      // Under `ip netns exec`, /proc/self/exe would name ip: pass this binary's real path.
      char exe[4096];
      const ssize_t len = readlink(self, exe, sizeof(exe) - 1);
      std::vector<std::string> own = {len > 0 ? std::string(exe, len) : std::string(self),
                                      absl::StrCat("--worker_rank=", r),
                                    absl::StrCat("--worker_size=", n), "--worker_dir=" + dir,
                                    "--ops=" + absl::GetFlag(FLAGS_ops),
                                    absl::StrCat("--min_bytes=", absl::GetFlag(FLAGS_min_bytes)),
                                    absl::StrCat("--max_bytes=", absl::GetFlag(FLAGS_max_bytes)),
                                    absl::StrCat("--loop_seconds=", absl::GetFlag(FLAGS_loop_seconds)),
                                    "--log_level=warn"};
      a.insert(a.end(), own.begin(), own.end());
      std::vector<char*> argv;
      for (auto& s : a) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  // A rank that fails leaves the others blocked in a collective: stop them.
  int failed_status = 0;
  for (size_t left = pids.size(); left > 0; --left) {
    int st = 0;
    pid_t p = wait(&st);
    if (p < 0) break;
    if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && failed_status == 0) {
      failed_status = st ? st : -1;
      for (pid_t q : pids) kill(q, SIGKILL);
    }
  }
  std::ifstream f(dir + "/out.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  Run("rm -rf " + dir, &ignored);
  if (failed_status != 0) {
    return absl::InternalError(absl::StrCat("ember-", tr, " at ", n, " ranks: a rank failed (wait "
                                            "status ", failed_status, "); see stderr"));
  }
  size_t w = text.find("wrong ");
  if (w == std::string::npos) {
    return absl::InternalError(absl::StrCat("ember-", tr, " at ", n, " ranks wrote no results"));
  }
  *wrong_total += std::atoi(text.c_str() + w + 6);
  std::string prefixed;
  for (absl::string_view line : absl::StrSplit(text, '\n'))
    if (!line.empty() && !absl::StartsWith(line, "wrong")) absl::StrAppend(&prefixed, "x ", line, "\n");
  ParseLines(prefixed, absl::StrCat("ember-", tr), cells);
  return absl::OkStatus();
}

// The shell command that runs gloo_peer.py (`peer`: python, script, n, sizes, ops) as n ranks, rank
// r in namespace r over eth0, its TCPStore at host 0:port; rank 0's stdout is the command's.
std::string GlooAcrossHosts(const std::string& peer, int n, int port, const std::string& err) {
  const std::vector<std::string> ns = NetnsList(FLAGS_netns), hosts = NetnsList(FLAGS_netns_hosts);
  std::string cmd = "pids=''; ";
  for (int r = n - 1; r >= 0; --r) {  // rank 0 (the store) last: the others retry until it is up
    absl::StrAppend(&cmd, "timeout 300 ip netns exec ", ns[r], " env GLOO_SOCKET_IFNAME=eth0 ",
                    "MASTER_ADDR=", hosts[0], " ", peer, " ", r, " tcp://", hosts[0], ":", port,
                    r == 0 ? "" : " >/dev/null", " 2>>", err, " & pids=\"$pids $!\"; ");
  }
  return absl::StrCat("sh -c '", cmd, "rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc'");
}

std::string SizeName(int64_t b) {
  return b >= (1 << 20) ? absl::StrCat(b >> 20, "MiB") : absl::StrCat(b >> 10, "KiB");
}

// The kernel's TCP congestion control where the ranks run: this namespace's, or (--netns) each
// rank namespace's, comma-joined when they differ; "unknown" where it cannot be read.
std::string CongestionControl() {
  const std::string path = "/proc/sys/net/ipv4/tcp_congestion_control";
  std::vector<std::string> seen;
  auto add = [&](std::string v) {
    v = std::string(absl::StripAsciiWhitespace(v));
    if (v.empty()) v = "unknown";
    if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
  };
  if (AcrossHosts()) {
    for (const std::string& ns : NetnsList(FLAGS_netns)) {
      std::string out;
      Run(absl::StrCat("ip netns exec ", ns, " cat ", path, " 2>/dev/null"), &out);
      add(out);
    }
  } else {
    std::ifstream f(path);
    std::string v;
    std::getline(f, v);
    add(v);
  }
  return absl::StrJoin(seen, ",");
}

int Orchestrate(int argc, char** argv, const char* self) {
  bench::Report report(AcrossHosts() ? "comm_veth_bench" : "comm_bench", argc, argv);
  if (AcrossHosts()) {
    const size_t n = NetnsList(FLAGS_netns).size();
    if (n < 2 || NetnsList(FLAGS_netns_hosts).size() != n) {
      return report.Fail(absl::InvalidArgumentError(absl::StrCat(
          "--netns names ", n, " namespaces and --netns_hosts ", NetnsList(FLAGS_netns_hosts).size(),
          " addresses; give one of each per rank (at least 2)")));
    }
    absl::SetFlag(&FLAGS_ranks, absl::StrCat(n));
    absl::SetFlag(&FLAGS_transports, "tcp");
    absl::SetFlag(&FLAGS_peers, "gloo");
  }
  if (bench::Quick()) {
    absl::SetFlag(&FLAGS_ranks, "2");
    absl::SetFlag(&FLAGS_loop_seconds, 0.02);
    absl::SetFlag(&FLAGS_max_bytes, std::min<int64_t>(absl::GetFlag(FLAGS_max_bytes), 256 << 10));
    absl::SetFlag(&FLAGS_min_bytes, std::min<int64_t>(absl::GetFlag(FLAGS_min_bytes), 4096));
  }
  const int rounds = bench::Quick() ? 1 : std::max(1, absl::GetFlag(FLAGS_rounds));
  std::map<Key, std::vector<double>> cells;
  int wrong_total = 0;
  std::vector<int> rank_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int n;
    if (absl::SimpleAtoi(s, &n)) rank_counts.push_back(n);
  }
  const std::vector<std::string> transports = absl::StrSplit(absl::GetFlag(FLAGS_transports), ',');
  const std::vector<std::string> ops = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',');
  std::string sizes_csv = absl::StrJoin(Sizes(), ",");
  const std::string peers = absl::GetFlag(FLAGS_peers);
  // Why a peer has no figures (per peer and rank count); empty while it works.
  std::map<std::pair<std::string, int>, std::string> peer_error;
  for (int n : rank_counts) {
    if (peers.find("gloo") == std::string::npos) peer_error[{"gloo", n}] = "skipped (--peers)";
    if (peers.find("mpi") == std::string::npos) peer_error[{"mpi", n}] = "skipped (--peers)";
  }
  // The Gloo peer's interpreter (PyTorch 2.15; no fallback to Debian's 1.13) and its version.
  bool run_gloo = peers.find("gloo") != std::string::npos;
  std::string gloo_python, gloo_label = "PyTorch 2.15 (not run: see the reason)", missing;
  if (run_gloo) {
    gloo_python = absl::GetFlag(FLAGS_python);
    if (gloo_python.empty()) gloo_python = deploy::CurrentTorchPeerPython(&missing);
    if (!gloo_python.empty()) {
      const std::string version = deploy::PeerTorchVersion(gloo_python);
      if (version.empty()) {
        missing = absl::StrCat("the Gloo peer's interpreter ", gloo_python, " cannot import torch; "
                               "run deploy/peers-venv.sh or fix EMBER_PEER_PYTHON / --python");
      } else {
        gloo_label = absl::StrCat("torch ", version, " (", gloo_python, ")");
      }
    }
    if (!missing.empty()) {
      std::fprintf(stderr, "gloo peer unavailable: %s\n", missing.c_str());
      for (int n : rank_counts) peer_error[{"gloo", n}] = missing;
      run_gloo = false;
    }
  }
  if (peers.find("gloo") != std::string::npos) {
    report.SetMeta("gloo_peer", json::Value::Str(run_gloo ? gloo_label : "none: " + missing));
  }
  std::string mpi_bin;
  if (peers.find("mpi") != std::string::npos) {
    mpi_bin = absl::StrCat("/tmp/ember_mpi_peer_", getpid());
    std::string cc;
    int st = Run(absl::StrCat("mpicc -O2 -o ", mpi_bin, " ", absl::GetFlag(FLAGS_bench_dir),
                              "/mpi_peer.c 2>&1"), &cc);
    if (st != 0) {
      std::fprintf(stderr, "mpi peer unavailable: %s\n", cc.c_str());
      for (int n : rank_counts) peer_error[{"mpi", n}] = "mpicc failed: " + cc.substr(0, 200);
      mpi_bin.clear();
    }
  }
  const std::string err = absl::StrCat("/tmp/ember_comm_bench_peer_", getpid(), ".err");
  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  for (int round = 0; round < rounds; ++round) {
    for (int n : rank_counts) {
      for (const std::string& tr : transports) {
        if (absl::Status s = RunEmber(self, n, tr, &cells, &wrong_total); !s.ok()) {
          return report.Fail(s);
        }
      }
      if (run_gloo) {
        std::string out;
        const std::string peer = absl::StrCat("env COMM_BENCH_LOOP_SECONDS=",
                                              absl::GetFlag(FLAGS_loop_seconds), " ",
                                              gloo_python, " ",
                                              absl::GetFlag(FLAGS_bench_dir), "/gloo_peer.py ", n,
                                              " ", sizes_csv, " ", absl::GetFlag(FLAGS_ops));
        int st = Run(AcrossHosts() ? GlooAcrossHosts(peer, n, 29600 + 10 * round, err)
                                   : absl::StrCat("timeout 300 ", peer, " 2>", err),
                     &out);
        std::string tail = ReadTail(err);
        if (st != 0) {
          peer_error[{"gloo", n}] = absl::StrCat("gloo_peer.py at ", n, " ranks failed (wait status ",
                                                 st, WEXITSTATUS(st) == 124 ? ", timed out" : "",
                                                 "): ", tail);
          std::fprintf(stderr, "%s\n", peer_error[{"gloo", n}].c_str());
        } else {
          ParseLines(out, "gloo", &cells);
        }
      }
      if (!mpi_bin.empty()) {
        std::string out;
        int st = Run(absl::StrCat("timeout 300 mpirun --allow-run-as-root --oversubscribe -np ", n,
                                  " --mca btl self,vader ", mpi_bin, " ",
                                  absl::GetFlag(FLAGS_max_bytes), " ",
                                  absl::GetFlag(FLAGS_min_bytes), " ",
                                  absl::GetFlag(FLAGS_loop_seconds), " 2>", err),
                     &out);
        std::string tail = ReadTail(err);
        if (st != 0) {
          peer_error[{"mpi", n}] = absl::StrCat("mpirun at ", n, " ranks failed (wait status ", st,
                                                WEXITSTATUS(st) == 124 ? ", timed out" : "", "): ",
                                                tail);
          std::fprintf(stderr, "%s\n", peer_error[{"mpi", n}].c_str());
        } else {
          ParseLines(out, "mpi", &cells);
        }
      }
    }
  }
  if (!mpi_bin.empty()) unlink(mpi_bin.c_str());
  const bench::LoadAverage load_end = bench::ReadLoadAverage();
  if (wrong_total > 0) {
    return report.Fail(absl::DataLossError(absl::StrCat(
        wrong_total, " wrong collective results (checked outside the timed loops)")));
  }

  auto us = [&](const std::string& impl, const std::string& op, int n,
                int64_t b) -> std::optional<double> {
    auto it = cells.find({impl, op, n, b});
    if (it == cells.end() || it->second.empty()) return std::nullopt;
    return bench::Median(it->second);
  };
  auto bus = [&](const std::string& impl, const std::string& op, int n,
                 int64_t b) -> std::optional<double> {
    auto t = us(impl, op, n, b);
    if (!t) return std::nullopt;
    return b / (*t * 1e-6) / 1e9 * BusFactor(op, n);
  };
  report.SetMeta("rounds", json::Value::Int(rounds));
  report.SetMeta("dtype", json::Value::Str("f32"));
  const std::string cc = CongestionControl();
  report.SetMeta("tcp_congestion_control", json::Value::Str(cc));
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const std::string loops = absl::StrCat(
      "loop lengths on both: 2 warm-up calls, iterations = clamp(", absl::GetFlag(FLAGS_loop_seconds),
      " s / one probe call, 3, 5000), the MAX over ranks, median of 3 timed loops");
  const std::string threads =
      "threads: one compute thread per rank on both (ours: the executor thread; gloo: "
      "torch.set_num_threads(1), OMP_NUM_THREADS=1, checked in gloo_peer.py)";
  const std::vector<std::string> impls =
      AcrossHosts() ? std::vector<std::string>{"ember-tcp", "gloo"}
                    : std::vector<std::string>{"ember-shm", "ember-tcp", "mpi", "gloo"};
  const bool algbw = AcrossHosts();  // nccl-tests' full set of columns: time, algbw, busbw
  for (const std::string& op : ops) {
    for (int n : rank_counts) {
      std::vector<std::string> cols = {"size(B)"};
      for (const std::string& impl : impls) {
        const std::string& label = impl;
        cols.push_back(label + " us");
        if (algbw) cols.push_back(label + " algbw GB/s");
        cols.push_back(label + " busbw GB/s");
      }
      if (AcrossHosts()) {
        for (const std::string& impl : impls) cols.push_back(impl + " cpu ms/op");
      }
      bench::Table& t = report.AddTable(
          absl::StrCat(op, ", ", n, " ranks, f32: time = median over ", rounds,
                       " interleaved rounds of (median of 3 loops, max over ranks)"),
          cols);
      t.SetLoad(load_begin, load_end);  // the whole interleaved sweep
      t.AddNote(absl::StrCat("busbw = algbw x ", op == "all_reduce" ? "2(n-1)/n" : "(n-1)/n",
                             AcrossHosts()
                                 ? "; algbw = size / time; one rank per network namespace, TCP "
                                   "over veth pairs and a bridge (no netem), ember and gloo "
                                   "interleaved on the same links; cpu ms/op = user + system "
                                   "time of all rank processes per op, summed over ranks (median "
                                   "over rounds): both sides share this machine's cores, so a "
                                   "side's busbw is at most about size x cores / cpu"
                                 : "; ember-shm and mpi (vader) use shared memory, ember-tcp and "
                                   "gloo TCP loopback"));
      t.AddNote(absl::StrCat("every side: ", loops, "; TCP congestion control ", cc, " (the "
                             "kernel's default; ember's ranks run with "
                             "EMBER_COMM_TCP_CONGESTION=system, so they do not set CUBIC)",
                             n > cores ? absl::StrCat("; ", n, " ranks on ", cores, " cores: "
                                                      "oversubscribed on every side, targets "
                                                      "informational")
                                       : ""));
      if (std::find(impls.begin(), impls.end(), "gloo") != impls.end()) {
        t.AddNote(absl::StrCat("gloo: ", run_gloo ? gloo_label : "not run", "; ", threads));
      }
      for (int64_t b : Sizes()) {
        std::vector<bench::Cell> row = {b};
        for (const std::string& impl : impls) {
          const std::string& src_op = op;
          row.push_back(us(impl, src_op, n, b));
          if (algbw) {
            auto tm = us(impl, src_op, n, b);
            row.push_back(tm ? std::optional<double>(b / (*tm * 1e-6) / 1e9) : std::nullopt);
          }
          row.push_back(bus(impl, src_op, n, b));
        }
        if (AcrossHosts()) {
          for (const std::string& impl : impls) {
            auto cpu = us(impl + " cpu", op, n, b);
            row.push_back(cpu ? std::optional<double>(*cpu / 1e3) : std::nullopt);
          }
        }
        t.AddRow(std::move(row));
      }
      for (const char* peer : {"gloo", "mpi"}) {
        if (std::find(impls.begin(), impls.end(), peer) == impls.end()) continue;
        auto e = peer_error.find({peer, n});
        if (e != peer_error.end()) t.AddNote(absl::StrCat(peer, " not measured: ", e->second));
      }
    }
  }

  // Targets (issues 3 and 11), like for like: shm vs Open MPI (shared memory both), TCP vs Gloo
  // (TCP both; reduce_scatter is torch 2.15 Gloo's reduce_scatter_tensor). What both sides ran is
  // in each note.
  // Cells with more ranks than cores: every side is oversubscribed, the peer too.
  auto informational = [&](int n) -> std::string {
    if (n <= cores) return "";
    return absl::StrCat("informational: ", n, " ranks on ", cores, " cores, every side "
                        "oversubscribed (the peer too: mpirun --oversubscribe, gloo ranks as "
                        "processes), so it measures the scheduler as much as the transport; ");
  };
  auto tcp_note = [&](int n) {
    return absl::StrCat(informational(n), "compared: ",
                        AcrossHosts() ? "TCP over veth (one rank per network namespace)"
                                      : "TCP loopback",
                        " on both; ", n, " rank processes on both; congestion control ", cc,
                        " on both (the kernel's default", AcrossHosts() ? " in each namespace" : "",
                        "; ember's ranks run with EMBER_COMM_TCP_CONGESTION=system); gloo: ",
                        gloo_label, "; ", threads, "; ", loops);
  };
  auto shm_note = [&](int n) {
    return absl::StrCat(informational(n), "compared: shared memory on both (ember shm, Open MPI "
                        "vader); ", n, " rank processes on both; ", loops);
  };
  auto reason = [&](const char* peer, int n) {
    auto e = peer_error.find({peer, n});
    return e != peer_error.end() ? e->second
                                 : absl::StrCat(peer, " printed no figure for this cell");
  };
  for (int n : rank_counts) {
    for (const std::string& op : ops) {
      for (int64_t b : Sizes()) {
        if (b < (AcrossHosts() ? (1 << 20) : (256 << 10))) continue;
        std::string cell = absl::StrCat(op, " busbw ", n, "r ", SizeName(b));
        if (auto shm = bus("ember-shm", op, n, b)) {
          report.AddTarget(bench::Target::VsPeer(cell + " shm vs mpi", *shm, bus("mpi", op, n, b),
                                                 1.0, bench::kHigherIsBetter, "GB/s",
                                                 reason("mpi", n), shm_note(n)));
        }
        if (auto tcp = bus("ember-tcp", op, n, b)) {
          report.AddTarget(bench::Target::VsPeer(cell + " tcp vs gloo", *tcp,
                                                 bus("gloo", op, n, b), 2.0,
                                                 bench::kHigherIsBetter, "GB/s",
                                                 reason("gloo", n), tcp_note(n)));
        }
      }
    }
    if (auto lat = us("ember-shm", "all_reduce", n, 4096)) {
      report.AddTarget(bench::Target::VsPeer(
          absl::StrCat("all_reduce 4KiB latency ", n, "r shm vs mpi"), *lat,
          us("mpi", "all_reduce", n, 4096), 3.0, bench::kLowerIsBetter, "us", reason("mpi", n),
          shm_note(n)));
    }
  }
  return report.Finish();
}

int NcclMain(int argc, char** argv) {
  bench::Report report("comm_nccl_bench", argc, argv);
  if (absl::GetFlag(FLAGS_max_bytes) <= 0) {
    absl::SetFlag(&FLAGS_max_bytes, bench::Quick() ? int64_t{64} << 20 : int64_t{1} << 30);
  }
  NcclBenchOptions o;
  o.sizes = Sizes();
  o.loop_seconds = bench::Quick() ? 0.02 : absl::GetFlag(FLAGS_loop_seconds);
  if (const std::string why = NcclBenchUnavailableReason(); !why.empty()) {
    const char* expect = std::getenv("EMBER_EXPECT_GPUS");
    if (expect != nullptr && std::string(expect) != "0") {
      return report.Fail(absl::FailedPreconditionError("EMBER_EXPECT_GPUS is set, but " + why));
    }
    std::fprintf(stderr, "SKIP comm_bench --backend=nccl: %s\n", why.c_str());
  }
  if (absl::Status s = RunNcclBench(o, report); !s.ok()) return report.Fail(s);
  return report.Finish();
}

}  // namespace
}  // namespace ember::comm

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "comm_bench");
  if (absl::GetFlag(FLAGS_worker_rank) >= 0) return ember::comm::Worker();
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "nccl") return ember::comm::NcclMain(argc, argv);
  if (backend != "cpu") {
    std::fprintf(stderr, "comm_bench: --backend=%s: use cpu or nccl\n", backend.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_bytes) <= 0) absl::SetFlag(&FLAGS_max_bytes, int64_t{64} << 20);
  return ember::comm::Orchestrate(argc, argv, "/proc/self/exe");
}
