// comm_bench: nccl-tests-style benchmark of the cpu backend, with Gloo (torch.distributed) and
// Open MPI measured in the same run on the same machine.
//
//   bazel run -c opt //runtime/comm:comm_bench -- --ranks=2,4 --json=/tmp/comm.json
//
// For every (ranks, transport shm|tcp, op, size) it prints time (us), algbw and busbw (GB/s) with
// the nccl-tests factors (all_reduce 2(n-1)/n; all_gather, reduce_scatter (n-1)/n). Size is the
// full buffer (all_reduce), the gathered output (all_gather) or the scattered input
// (reduce_scatter), f32. Correctness is checked once per size outside the timed loop. Times are
// the median of 3 timed loops, max across ranks. --json writes the rows plus a `targets` array.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/comm/process_group.h"

ABSL_FLAG(std::string, ranks, "2,4", "rank counts");
ABSL_FLAG(std::string, transports, "shm,tcp", "shm and/or tcp");
ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter", "");
ABSL_FLAG(int64_t, min_bytes, 4096, "");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "");
ABSL_FLAG(std::string, peers, "gloo,mpi", "peers to measure: gloo (torch), mpi (Open MPI)");
ABSL_FLAG(std::string, json, "", "write results + targets here");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "python with torch for the Gloo peer");
ABSL_FLAG(std::string, bench_dir, "runtime/comm/bench", "where gloo_peer.py and mpi_peer.c live");
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
      run().IgnoreError();
      pg.Barrier()->Wait().IgnoreError();
      auto t0 = Clock::now();
      run().IgnoreError();
      double one = std::chrono::duration<double>(Clock::now() - t0).count();
      double it_d = std::clamp(0.15 / std::max(one, 1e-7), 3.0, 5000.0);
      int64_t iters = static_cast<int64_t>(it_d);
      pg.Broadcast(&iters, 1, DataType::kI64, 0)->Wait().IgnoreError();
      std::vector<double> reps;
      for (int k = 0; k < 3; ++k) {
        pg.Barrier()->Wait().IgnoreError();
        auto t = Clock::now();
        for (int64_t i = 0; i < iters; ++i) run().IgnoreError();
        reps.push_back(std::chrono::duration<double>(Clock::now() - t).count() / iters);
      }
      std::sort(reps.begin(), reps.end());
      double med = reps[1];
      pg.AllReduce(&med, 1, DataType::kF64, ReduceOp::kMax)->Wait().IgnoreError();
      if (rank == 0) lines << op << " " << n << " " << size << " " << med * 1e6 << "\n";
    }
  }
  int32_t w = wrong;
  pg.AllReduce(&w, 1, DataType::kI32, ReduceOp::kSum)->Wait().IgnoreError();
  if (rank == 0) {
    std::ofstream f(dir + "/out.txt");
    f << lines.str() << "wrong " << w << "\n";
  }
  return 0;
}

std::string Run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
  pclose(p);
  return out;
}

struct Row {
  std::string impl, op;
  int n;
  int64_t bytes;
  double us;
};

// Parses "<impl> <op> <n> <bytes> <us>" lines.
void ParseLines(const std::string& text, const std::string& impl_override, std::vector<Row>* rows) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 5) continue;
    Row r;
    r.impl = impl_override.empty() ? f[0] : impl_override;
    r.op = f[1];
    if (!absl::SimpleAtoi(f[2], &r.n) || !absl::SimpleAtoi(f[3], &r.bytes) || !absl::SimpleAtod(f[4], &r.us)) continue;
    rows->push_back(r);
  }
}

int Orchestrate(const char* self) {
  std::vector<Row> rows;
  int wrong_total = 0;
  std::vector<int> rank_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int n;
    if (absl::SimpleAtoi(s, &n)) rank_counts.push_back(n);
  }
  std::string sizes_csv = absl::StrJoin(Sizes(), ",");
  std::string peers = absl::GetFlag(FLAGS_peers);
  std::string mpi_bin;
  if (peers.find("mpi") != std::string::npos) {
    mpi_bin = absl::StrCat("/tmp/ember_mpi_peer_", getpid());
    std::string cc = Run(absl::StrCat("mpicc -O2 -o ", mpi_bin, " ", absl::GetFlag(FLAGS_bench_dir),
                                      "/mpi_peer.c 2>&1 && echo OK"));
    if (cc.find("OK") == std::string::npos) {
      std::fprintf(stderr, "mpi peer unavailable: %s\n", cc.c_str());
      mpi_bin.clear();
    }
  }
  for (int n : rank_counts) {
    for (absl::string_view tr : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',')) {
      std::string dir = absl::StrCat("/tmp/ember_comm_bench_", getpid(), "_", n, "_", tr);
      Run("rm -rf " + dir + " && mkdir -p " + dir);
      std::vector<pid_t> pids;
      for (int r = 0; r < n; ++r) {
        pid_t pid = fork();
        if (pid == 0) {
          if (tr == "tcp") setenv("EMBER_COMM_DISABLE_SHM", "1", 1);
          std::vector<std::string> a = {self, absl::StrCat("--worker_rank=", r),
                                        absl::StrCat("--worker_size=", n), "--worker_dir=" + dir,
                                        "--ops=" + absl::GetFlag(FLAGS_ops),
                                        absl::StrCat("--min_bytes=", absl::GetFlag(FLAGS_min_bytes)),
                                        absl::StrCat("--max_bytes=", absl::GetFlag(FLAGS_max_bytes))};
          std::vector<char*> argv;
          for (auto& s : a) argv.push_back(const_cast<char*>(s.c_str()));
          argv.push_back(nullptr);
          execv(self, argv.data());
          _exit(127);
        }
        pids.push_back(pid);
      }
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      std::ifstream f(dir + "/out.txt");
      std::stringstream ss;
      ss << f.rdbuf();
      std::string text = ss.str();
      size_t w = text.find("wrong ");
      if (w != std::string::npos) wrong_total += std::atoi(text.c_str() + w + 6);
      std::string prefixed;
      for (absl::string_view line : absl::StrSplit(text, '\n'))
        if (!line.empty() && !absl::StartsWith(line, "wrong")) absl::StrAppend(&prefixed, "x ", line, "\n");
      ParseLines(prefixed, absl::StrCat("ember-", tr), &rows);
      Run("rm -rf " + dir);
    }
    if (peers.find("gloo") != std::string::npos) {
      std::string out = Run(absl::StrCat("timeout 300 ", absl::GetFlag(FLAGS_python), " ",
                                         absl::GetFlag(FLAGS_bench_dir), "/gloo_peer.py ", n, " ",
                                         sizes_csv, " ", absl::GetFlag(FLAGS_ops), " 2>/dev/null"));
      ParseLines(out, "gloo", &rows);
    }
    if (!mpi_bin.empty()) {
      std::string out = Run(absl::StrCat("timeout 300 mpirun --allow-run-as-root --oversubscribe -np ", n,
                                         " --mca btl self,vader ", mpi_bin, " ",
                                         absl::GetFlag(FLAGS_max_bytes), " ",
                                         absl::GetFlag(FLAGS_min_bytes), " 2>/dev/null"));
      ParseLines(out, "mpi", &rows);
    }
  }
  if (!mpi_bin.empty()) unlink(mpi_bin.c_str());

  // Table.
  std::map<std::tuple<std::string, std::string, int, int64_t>, double> t;
  std::vector<std::string> impls;
  for (const Row& r : rows) {
    t[{r.impl, r.op, r.n, r.bytes}] = r.us;
    if (std::find(impls.begin(), impls.end(), r.impl) == impls.end()) impls.push_back(r.impl);
  }
  auto bus = [&](const std::string& impl, const std::string& op, int n, int64_t b) -> double {
    auto it = t.find({impl, op, n, b});
    if (it == t.end()) return -1;
    return b / (it->second * 1e-6) / 1e9 * BusFactor(op, n);
  };
  std::printf("# comm_bench: f32, sizes %s..%s bytes; time = median of 3 loops (max over ranks)\n",
              absl::StrCat(absl::GetFlag(FLAGS_min_bytes)).c_str(), absl::StrCat(absl::GetFlag(FLAGS_max_bytes)).c_str());
  std::printf("%-14s %-15s %5s %10s %11s %10s %10s\n", "impl", "op", "ranks", "size(B)", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)");
  for (const Row& r : rows) {
    double alg = r.bytes / (r.us * 1e-6) / 1e9;
    std::printf("%-14s %-15s %5d %10lld %11.1f %10.2f %10.2f\n", r.impl.c_str(), r.op.c_str(), r.n,
                static_cast<long long>(r.bytes), r.us, alg, alg * BusFactor(r.op, r.n));
  }
  std::printf("# wrong results: %d\n", wrong_total);

  // Targets from the issue.
  struct Target {
    std::string name;
    double value;
    double peer;  // < 0: null
    double goal;
    bool higher;
    std::string unit;
  };
  std::vector<Target> targets;
  for (int n : rank_counts) {
    for (const std::string op : {"all_reduce", "all_gather", "reduce_scatter"}) {
      for (int64_t b : Sizes()) {
        if (b < (256 << 10)) continue;
        std::string sz = b >= (1 << 20) ? absl::StrCat(b >> 20, "MiB") : absl::StrCat(b >> 10, "KiB");
        double shm = bus("ember-shm", op, n, b), tcp = bus("ember-tcp", op, n, b);
        double gloo = bus("gloo", op, n, b), mpi = bus("mpi", op, n, b);
        if (shm > 0 && gloo > 0)
          targets.push_back({absl::StrCat(op, " busbw ", n, "r ", sz, " shm vs gloo"), shm, gloo, 2.0, true, "GB/s"});
        if (shm > 0 && mpi > 0)
          targets.push_back({absl::StrCat(op, " busbw ", n, "r ", sz, " shm vs mpi"), shm, mpi, 1.0, true, "GB/s"});
        if (tcp > 0 && gloo > 0 && b >= (4 << 20))
          targets.push_back({absl::StrCat(op, " busbw ", n, "r ", sz, " tcp vs gloo"), tcp, gloo, 2.0, true, "GB/s"});
      }
    }
    auto lat = t.find({"ember-shm", "all_reduce", n, 4096});
    auto mlat = t.find({"mpi", "all_reduce", n, 4096});
    if (lat != t.end() && mlat != t.end())
      targets.push_back({absl::StrCat("all_reduce 4KiB latency ", n, "r shm vs mpi"), lat->second,
                         mlat->second, 3.0, false, "us"});
  }
  int met = 0;
  for (const Target& g : targets) {
    double ratio = g.value / g.peer;
    bool ok = g.higher ? ratio >= g.goal : ratio <= g.goal;
    met += ok;
    std::printf("target %-45s %9.2f vs %9.2f %s (ratio %.2f, goal %s%.1f) %s\n", g.name.c_str(),
                g.value, g.peer, g.unit.c_str(), ratio, g.higher ? ">=" : "<=", g.goal,
                ok ? "MET" : "MISSED");
  }
  std::printf("# targets met: %d / %zu\n", met, targets.size());
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::string j = "{\n  \"benchmark\": \"comm_bench\",\n  \"wrong_results\": " + std::to_string(wrong_total) + ",\n  \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      double alg = r.bytes / (r.us * 1e-6) / 1e9;
      absl::StrAppend(&j, i ? "," : "", "\n    {\"impl\": \"", r.impl, "\", \"op\": \"", r.op,
                      "\", \"ranks\": ", r.n, ", \"bytes\": ", r.bytes, ", \"time_us\": ",
                      absl::StrFormat("%.3f", r.us), ", \"algbw_gbps\": ", absl::StrFormat("%.4f", alg),
                      ", \"busbw_gbps\": ", absl::StrFormat("%.4f", alg * BusFactor(r.op, r.n)), "}");
    }
    absl::StrAppend(&j, "\n  ],\n  \"targets\": [");
    for (size_t i = 0; i < targets.size(); ++i) {
      const Target& g = targets[i];
      absl::StrAppend(&j, i ? "," : "", "\n    {\"name\": \"", g.name, "\", \"value\": ",
                      absl::StrFormat("%.4f", g.value), ", \"peer\": ",
                      g.peer < 0 ? std::string("null") : absl::StrFormat("%.4f", g.peer),
                      ", \"goal\": ", g.goal, ", \"higher_is_better\": ", g.higher ? "true" : "false",
                      ", \"unit\": \"", g.unit, "\"}");
    }
    absl::StrAppend(&j, "\n  ]\n}\n");
    std::ofstream(absl::GetFlag(FLAGS_json)) << j;
  }
  return wrong_total ? 1 : 0;
}

}  // namespace
}  // namespace ember::comm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_worker_rank) >= 0) return ember::comm::Worker();
  return ember::comm::Orchestrate("/proc/self/exe");
}
