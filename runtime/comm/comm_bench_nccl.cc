#include "runtime/comm/comm_bench_nccl.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/base/devices.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/rendezvous.h"

#ifdef EMBER_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace ember::comm {
namespace {

constexpr double kGoal = 0.8;                          // algbw / copy bandwidth
constexpr int64_t kTargetMinBytes = int64_t{64} << 20;  // targets at and above this size
const char* const kOps[] = {"all_reduce", "all_gather"};

const std::vector<std::string> kColumns = {"size(B)",      "count",          "time us",
                                           "algbw GB/s",   "busbw GB/s",     "d2d copy us",
                                           "d2d copy GB/s", "algbw / copy"};

struct Cellset {
  double op_s, copy_s;
};
// (op, bytes) -> measured seconds per op and per copy of the same bytes.
using Results = std::map<std::pair<std::string, int64_t>, Cellset>;

std::string OpTitle(const std::string& op) {
  return op == "all_reduce"
             ? "nccl all_reduce, world size 1 on cuda:0, f32 in place, ReduceOp avg"
             : "nccl all_gather, world size 1 on cuda:0, f32 out of place";
}

void AddOpNotes(bench::Table& t, const std::string& op) {
  t.AddNote("algbw = size / time; busbw = algbw x 2(n-1)/n (all_reduce) or (n-1)/n (all_gather), "
            "0 at n = 1 by definition; d2d copy = cudaMemcpyAsync device-to-device of the same "
            "bytes, timed in the same run (size / time, the same convention as algbw), so algbw / "
            "copy = copy time / op time. Time: median of 3 event-timed loops on one stream");
  if (op == "all_reduce") {
    t.AddNote("ReduceOp avg, not sum: at one rank NCCL skips an in-place sum (nothing to add), so "
              "its time is only the launch; avg still makes one in-place pass over the buffer "
              "(a pre-multiply by 1/n), comparable with a copy. The check (result == input) "
              "catches corruption, not a skipped pass");
  } else {
    t.AddNote("the output is poisoned (0xFF bytes) before the checked run");
  }
}

void AddTargets(bench::Report& report, const std::vector<int64_t>& sizes, const Results& results,
                const std::string& reason, const std::string& device) {
  for (const char* op : kOps) {
    for (int64_t b : sizes) {
      if (b < kTargetMinBytes) continue;
      const std::string name = absl::StrCat("nccl ws1 ", op, " algbw ", b >> 20, "MiB vs d2d copy");
      auto it = results.find({op, b});
      if (it == results.end()) {
        report.AddTarget(bench::Target::VsPeer(name, std::numeric_limits<double>::quiet_NaN(),
                                               std::nullopt, kGoal, bench::kHigherIsBetter, "GB/s",
                                               reason));
        continue;
      }
      report.AddTarget(bench::Target::VsPeer(
          name, b / it->second.op_s / 1e9, b / it->second.copy_s / 1e9, kGoal,
          bench::kHigherIsBetter, "GB/s", "",
          absl::StrCat("peer: cudaMemcpy D2D of the same bytes on ", device, ", same run")));
    }
  }
}

#ifdef EMBER_WITH_NCCL

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// A fresh directory for a file rendezvous, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/comm_bench_nccl_XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

GroupOptions Opts(const std::string& name, const std::string& backend) {
  GroupOptions o;
  o.name = name;
  o.backend = backend;
  o.device = "cuda:0";
  o.bootstrap_timeout = absl::Seconds(120);
  o.timeout = absl::Seconds(120);
  return o;
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

// Seconds per call of `f` (which enqueues on stream s): a warm-up, a probe that sizes the loops to
// ~loop_seconds, then the median of 3 event-timed loops. Any failed call fails the measurement.
absl::StatusOr<double> TimeLoops(cudaStream_t s, double loop_seconds,
                                 const std::function<absl::Status()>& f) {
  Events ev;
  auto loop = [&](int64_t iters) -> absl::StatusOr<double> {
    RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.a, s), "cudaEventRecord"));
    for (int64_t i = 0; i < iters; ++i) RETURN_IF_ERROR(f());
    RETURN_IF_ERROR(Cuda(cudaEventRecord(ev.b, s), "cudaEventRecord"));
    RETURN_IF_ERROR(Cuda(cudaEventSynchronize(ev.b), "cudaEventSynchronize"));
    float ms = 0;
    RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime"));
    return ms / 1e3 / iters;
  };
  RETURN_IF_ERROR(f());
  ASSIGN_OR_RETURN(double probe, loop(1));
  const int64_t iters =
      static_cast<int64_t>(std::clamp(loop_seconds / std::max(probe, 1e-7), 3.0, 2000.0));
  std::vector<double> reps;
  for (int k = 0; k < 3; ++k) {
    ASSIGN_OR_RETURN(double t, loop(iters));
    reps.push_back(t);
  }
  return bench::Median(reps);
}

// Copies `count` floats of `dev` back and compares them with `want` (bitwise).
absl::Status Check(cudaStream_t s, const std::string& what, const float* dev,
                   const std::vector<float>& want, size_t count, std::vector<float>& scratch) {
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
  RETURN_IF_ERROR(Cuda(cudaMemcpy(scratch.data(), dev, count * 4, cudaMemcpyDeviceToHost),
                       "cudaMemcpy(D2H)"));
  for (size_t i = 0; i < count; ++i) {
    if (scratch[i] != want[i]) {
      return absl::DataLossError(absl::StrCat(what, ": element ", i, " of ", count, " is ",
                                              scratch[i], ", want ", want[i]));
    }
  }
  return absl::OkStatus();
}

// Eager vs lazy communicator creation, two rounds; rows of `t`.
absl::Status Creation(bench::Table& t) {
  float* d = nullptr;
  RETURN_IF_ERROR(Cuda(cudaMalloc(&d, 16), "cudaMalloc(16)"));
  absl::Status st;
  for (int round = 1; round <= 2 && st.ok(); ++round) {
    for (const char* backend : {"nccl", "nccl-lazy"}) {
      TempDir dir;
      const absl::Time t0 = absl::Now();
      auto pg = ProcessGroup::Create(MakeFileRendezvous(dir.path()), 0, 1,
                                     Opts(absl::StrCat("create-", backend, "-", round), backend));
      const double create_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
      if (!pg.ok()) {
        st = absl::Status(pg.status().code(),
                          absl::StrCat("creating a ", backend, " group: ", pg.status().message()));
        break;
      }
      const absl::Time t1 = absl::Now();
      st = (*pg)->AllReduce(d, 1, DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(120), true);
      const double first_ms = absl::ToDoubleMilliseconds(absl::Now() - t1);
      if (!st.ok()) break;
      t.AddRow({round, backend, create_ms, first_ms, create_ms + first_ms,
                static_cast<double>((*pg)->CommMemoryBytes()) / (1 << 20)});
    }
  }
  cudaFree(d);
  return st;
}

absl::Status Sweep(const NcclBenchOptions& o, bench::Report& report, Results& results) {
  TempDir dir;
  auto pg = ProcessGroup::Create(MakeFileRendezvous(dir.path()), 0, 1, Opts("bench", "nccl"));
  if (!pg.ok()) return pg.status();
  cudaStream_t s = nullptr;
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  SetCurrentStream(s);
  const int64_t max_bytes = o.sizes.back();
  const size_t max_count = static_cast<size_t>(max_bytes / 4);
  void *a = nullptr, *b = nullptr;
  absl::Status st = Cuda(cudaMalloc(&a, max_bytes), "cudaMalloc(input)");
  if (st.ok()) st = Cuda(cudaMalloc(&b, max_bytes), "cudaMalloc(output)");
  std::vector<float> want(st.ok() ? max_count : 0), scratch(want.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>((i * 7) % 251 + 1);
  auto* af = static_cast<float*>(a);
  auto* bf = static_cast<float*>(b);
  for (int64_t bytes : o.sizes) {
    if (!st.ok()) break;
    const size_t n = static_cast<size_t>(bytes / 4);
    const std::string size = absl::StrCat(bytes, " bytes");
    auto all_reduce = [&] { return (*pg)->AllReduce(a, n, DataType::kF32, ReduceOp::kAvg)->Wait(); };
    auto all_gather = [&] { return (*pg)->AllGatherSingle(a, b, n, DataType::kF32)->Wait(); };
    auto copy = [&] {
      return Cuda(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync(D2D)");
    };
    auto run = [&]() -> absl::Status {
      RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a, want.data(), bytes, cudaMemcpyHostToDevice, s),
                           "cudaMemcpyAsync(H2D)"));
      RETURN_IF_ERROR(all_reduce());
      RETURN_IF_ERROR(Check(s, "all_reduce " + size + " before timing", af, want, n, scratch));
      ASSIGN_OR_RETURN(double ar, TimeLoops(s, o.loop_seconds, all_reduce));
      RETURN_IF_ERROR(Check(s, "all_reduce " + size + " after the timed loops", af, want, n, scratch));
      RETURN_IF_ERROR(Cuda(cudaMemsetAsync(b, 0xFF, bytes, s), "cudaMemsetAsync"));
      RETURN_IF_ERROR(all_gather());
      RETURN_IF_ERROR(Check(s, "all_gather " + size + " before timing", bf, want, n, scratch));
      ASSIGN_OR_RETURN(double ag, TimeLoops(s, o.loop_seconds, all_gather));
      RETURN_IF_ERROR(Check(s, "all_gather " + size + " after the timed loops", bf, want, n, scratch));
      ASSIGN_OR_RETURN(double cp, TimeLoops(s, o.loop_seconds, copy));
      results[{"all_reduce", bytes}] = {ar, cp};
      results[{"all_gather", bytes}] = {ag, cp};
      return absl::OkStatus();
    };
    st = run();
  }
  report.SetMeta("bench_group_comm_memory_bytes",
                 json::Value::Int(static_cast<int64_t>((*pg)->CommMemoryBytes())));
  SetCurrentStream(nullptr);
  cudaStreamSynchronize(s);
  cudaFree(a);
  cudaFree(b);
  cudaStreamDestroy(s);
  return st;
}

#endif  // EMBER_WITH_NCCL

}  // namespace

std::string NcclBenchUnavailableReason() {
#ifndef EMBER_WITH_NCCL
  return "built without NCCL (no CUDA toolkit with NCCL at build time)";
#else
  std::string why;
  if (base::CudaDeviceCount(&why) == 0) return absl::StrCat("no CUDA device (", why, ")");
  return "";
#endif
}

absl::Status RunNcclBench(const NcclBenchOptions& o, bench::Report& report) {
  report.SetMeta("backend", json::Value::Str("nccl"));
  report.SetMeta("world_size", json::Value::Int(1));
  report.SetMeta("dtype", json::Value::Str("f32"));
  const std::string reason = NcclBenchUnavailableReason();
  Results results;
  std::string device = "none";
  std::vector<std::string> create_cols = {"round", "backend", "Create ms", "first all_reduce ms",
                                          "total ms", "comm memory MiB"};
  if (!reason.empty() || o.sizes.empty()) {
    const std::string why = reason.empty() ? "no sizes given" : reason;
    for (const char* op : kOps) {
      bench::Table& t = report.AddTable(OpTitle(op), kColumns);
      t.AddNote("not measured: " + why);
    }
    report.AddTable("communicator creation: eager (nccl) vs lazy (nccl-lazy)", create_cols)
        .AddNote("not measured: " + why);
    report.SetMeta("device", json::Value::Str(device));
    report.SetMeta("unavailable", json::Value::Str(why));
    AddTargets(report, o.sizes, results, why, device);
    return absl::OkStatus();
  }
#ifdef EMBER_WITH_NCCL
  RETURN_IF_ERROR(Cuda(cudaSetDevice(0), "cudaSetDevice(0)"));
  RETURN_IF_ERROR(Cuda(cudaFree(nullptr), "creating the CUDA context"));  // not in creation times
  cudaDeviceProp prop;
  RETURN_IF_ERROR(Cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties"));
  device = prop.name;
  int nccl_version = 0, runtime = 0, driver = 0;
  ncclGetVersion(&nccl_version);
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  report.SetMeta("device", json::Value::Str(device));
  report.SetMeta("compute_capability", json::Value::Str(absl::StrCat(prop.major, ".", prop.minor)));
  report.SetMeta("nccl_version", json::Value::Int(nccl_version));
  report.SetMeta("cuda_runtime_version", json::Value::Int(runtime));
  report.SetMeta("cuda_driver_version", json::Value::Int(driver));

  bench::Table& create = report.AddTable(
      absl::StrCat("communicator creation on ", device, ": eager (nccl) vs lazy (nccl-lazy)"),
      create_cols);
  create.AddNote("nccl runs ncclCommInitRankConfig in ProcessGroup::Create; nccl-lazy at the first "
                 "collective. Round 1 also pays NCCL's one-time process setup; round 2 is the "
                 "steady cost. comm memory: what the backend reports (the drop in free device "
                 "memory across the communicator's init; NCCL's buffers live outside any allocator)");
  RETURN_IF_ERROR(Creation(create));

  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  RETURN_IF_ERROR(Sweep(o, report, results));
  const bench::LoadAverage load_end = bench::ReadLoadAverage();
  for (const char* op : kOps) {
    bench::Table& t = report.AddTable(absl::StrCat(OpTitle(op), " (", device, ")"), kColumns);
    t.SetLoad(load_begin, load_end);
    AddOpNotes(t, op);
    for (int64_t b : o.sizes) {
      const Cellset& c = results.at({op, b});
      const double algbw = b / c.op_s / 1e9, copy = b / c.copy_s / 1e9;
      t.AddRow({b, b / 4, c.op_s * 1e6, algbw, 0.0, c.copy_s * 1e6, copy, algbw / copy});
    }
  }
  AddTargets(report, o.sizes, results, "", device);
  return absl::OkStatus();
#else
  return absl::InternalError("unreachable: no NCCL in this build");
#endif
}

}  // namespace ember::comm
