// The NCCL checks for a 1-GPU machine (tests/gpu/run.sh check). World size 1 only: NCCL refuses
// two ranks on one GPU. Prints one line per check and "nccl_gpu_check: N failed"; exit 0 = all
// passed, 1 = a check failed, 2 = this binary was built without NCCL.
//
//   1. world size 1: every op x dtype (x reduce op) on nccl against the cpu backend's result
//   2. communicator creation time: nccl (eager, in Create) vs nccl-lazy (at the first collective)
//   3. CUDA graph capture of [memset, all_reduce] and three replays
//   4. an op held on the device past its timeout: the watchdog aborts, the process reports
//   5. several groups on one device, with per-communicator memory
// The benchmark figures (algbw vs device-to-device copy up to 1 GiB, creation times, memory) are
// comm_bench --backend=nccl's (runtime/comm/comm_bench_nccl.h), run next by tests/gpu/run.sh.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/rendezvous.h"

#ifdef EMBER_WITH_NCCL
#include <cuda_runtime.h>
#endif

namespace ember::comm {
namespace {

int g_failed = 0;

void Report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

#ifdef EMBER_WITH_NCCL
std::shared_ptr<Rendezvous> Rdzv() {
  char tmpl[] = "/tmp/nccl_gpu_check_XXXXXX";
  return MakeFileRendezvous(mkdtemp(tmpl));
}

GroupOptions Opts(const std::string& name, const std::string& backend) {
  GroupOptions o;
  o.name = name;
  o.backend = backend;
  o.device = backend == "cpu" ? "cpu" : "cuda:0";
  o.bootstrap_timeout = absl::Seconds(60);
  o.timeout = absl::Seconds(60);
  return o;
}

std::vector<char> Pattern(size_t bytes, int seed) {
  std::vector<char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<char>((i * 7 + seed * 13) % 5);  // small ints
  return v;
}

// Runs `op` on the cpu group with host buffers and on the nccl group with device buffers.
void CompareOp(ProcessGroup& cpu, ProcessGroup& gpu, const std::string& name, size_t in_bytes,
               size_t out_bytes, bool in_place,
               const std::function<std::shared_ptr<Work>(ProcessGroup&, void*, void*)>& op) {
  std::vector<char> in = Pattern(in_bytes, 1), cpu_out = in_place ? in : Pattern(out_bytes, 2);
  std::vector<char> cpu_in = in;
  absl::Status s = op(cpu, cpu_in.data(), in_place ? cpu_in.data() : cpu_out.data())->Wait();
  if (in_place) cpu_out = cpu_in;
  void *din = nullptr, *dout = nullptr;
  cudaMalloc(&din, std::max<size_t>(in_bytes, 1));
  cudaMalloc(&dout, std::max<size_t>(out_bytes, 1));
  cudaMemcpy(din, in.data(), in_bytes, cudaMemcpyHostToDevice);
  if (in_place) dout = din;
  absl::Status g = op(gpu, din, dout)->Wait(absl::Seconds(60), /*block_host=*/true);
  std::vector<char> got(out_bytes);
  cudaMemcpy(got.data(), dout, out_bytes, cudaMemcpyDeviceToHost);
  cudaFree(din);
  if (!in_place) cudaFree(dout);
  Report(s.ok() && g.ok() && got == cpu_out,
         absl::StrCat("ws1 ", name, s.ok() ? "" : " cpu: " + s.ToString(),
                      g.ok() ? "" : " nccl: " + g.ToString()));
}

void EveryOp() {
  auto rdzv = Rdzv();
  auto cpu = ProcessGroup::Create(rdzv, 0, 1, Opts("cpu", "cpu"));
  auto gpu = ProcessGroup::Create(rdzv, 0, 1, Opts("gpu", "nccl"));
  if (!cpu.ok() || !gpu.ok()) {
    Report(false, absl::StrCat("create groups: ", cpu.status().ToString(), " / ", gpu.status().ToString()));
    return;
  }
  const size_t n = 4099;
  for (DataType t : kAllDataTypes) {
    const size_t b = n * DTypeSize(t);
    for (ReduceOp r : kAllReduceOps) {
      CompareOp(**cpu, **gpu, absl::StrCat("all_reduce ", DTypeName(t), " ", ReduceOpName(r)), b, b,
                true, [&](ProcessGroup& pg, void* in, void*) { return pg.AllReduce(in, n, t, r); });
      CompareOp(**cpu, **gpu, absl::StrCat("reduce_scatter ", DTypeName(t), " ", ReduceOpName(r)), b,
                b, false, [&](ProcessGroup& pg, void* in, void* out) {
                  return pg.ReduceScatterSingle(in, out, n, t, r);
                });
    }
    CompareOp(**cpu, **gpu, absl::StrCat("broadcast ", DTypeName(t)), b, b, true,
              [&](ProcessGroup& pg, void* in, void*) { return pg.Broadcast(in, n, t, 0); });
    CompareOp(**cpu, **gpu, absl::StrCat("all_gather ", DTypeName(t)), b, b, false,
              [&](ProcessGroup& pg, void* in, void* out) { return pg.AllGatherSingle(in, out, n, t); });
    CompareOp(**cpu, **gpu, absl::StrCat("all_to_all ", DTypeName(t)), b, b, false,
              [&](ProcessGroup& pg, void* in, void* out) { return pg.AllToAllSingle(in, out, n, t); });
  }
  Report((*gpu)->Barrier()->Wait(absl::Seconds(60), true).ok(), "ws1 barrier");
  // Device times of one op, from its events.
  void* d = nullptr;
  cudaMalloc(&d, 1 << 20);
  auto w = (*gpu)->AllReduce(d, (1 << 20) / 4, DataType::kF32, ReduceOp::kSum);
  absl::Status s = w->Wait(absl::Seconds(60), true);
  int64_t t0 = 0, t1 = 0;
  bool times = w->device_events() && w->device_events()->TimesNs(&t0, &t1);
  Report(s.ok() && times && t1 >= t0, absl::StrCat("device times of a 1 MiB all_reduce: ", (t1 - t0) / 1000.0, " us"));
  cudaFree(d);
}

void CreationTime() {
  auto rdzv = Rdzv();
  for (const char* b : {"nccl", "nccl-lazy"}) {
    absl::Time t0 = absl::Now();
    auto pg = ProcessGroup::Create(rdzv, 0, 1, Opts(absl::StrCat("ct-", b), b));
    absl::Duration create = absl::Now() - t0;
    void* d = nullptr;
    cudaMalloc(&d, 4);
    t0 = absl::Now();
    absl::Status s = pg.ok() ? (*pg)->AllReduce(d, 1, DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(60), true)
                             : pg.status();
    absl::Duration first = absl::Now() - t0;
    cudaFree(d);
    Report(s.ok(), absl::StrCat("creation ", b, ": Create ", absl::FormatDuration(create),
                                ", first all_reduce ", absl::FormatDuration(first),
                                pg.ok() ? absl::StrCat(", comm memory ", (*pg)->CommMemoryBytes() >> 20, " MiB") : "",
                                s.ok() ? "" : " " + s.ToString()));
  }
}

void GraphCapture() {
  auto pg = ProcessGroup::Create(Rdzv(), 0, 1, Opts("graph", "nccl"));
  if (!pg.ok()) return Report(false, "graph: " + pg.status().ToString());
  const size_t n = 1 << 16;
  void* d = nullptr;
  cudaMalloc(&d, n);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  SetCurrentStream(s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  cudaMemsetAsync(d, 3, n, s);
  absl::Status st = (*pg)->AllReduce(d, n, DataType::kU8, ReduceOp::kSum)->Wait(absl::Seconds(60));
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  SetCurrentStream(nullptr);
  bool ok = st.ok() && e == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  for (int i = 0; ok && i < 3; ++i) {
    cudaMemset(d, 0, n);
    ok = cudaGraphLaunch(exec, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
    std::vector<unsigned char> h(n);
    cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost);
    ok = ok && h[0] == 3 && h[n - 1] == 3;
  }
  Report(ok, absl::StrCat("graph capture of all_reduce, 3 replays", st.ok() ? "" : " " + st.ToString(),
                          e == cudaSuccess ? "" : absl::StrCat(" ", cudaGetErrorString(e))));
  cudaFree(d);
}

void HostSleep(void*) { usleep(4 * 1000 * 1000); }

void InjectedTimeout() {
  GroupOptions o = Opts("timeout", "nccl");
  o.timeout = absl::Seconds(1);
  o.watchdog_period = absl::Milliseconds(50);
  auto pg = ProcessGroup::Create(Rdzv(), 0, 1, o);
  if (!pg.ok()) return Report(false, "timeout: " + pg.status().ToString());
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* d = nullptr;
  cudaMalloc(&d, 1024);
  SetCurrentStream(s);
  cudaLaunchHostFunc(s, &HostSleep, nullptr);  // holds the op on the device for 4 s
  absl::Time t0 = absl::Now();
  absl::Status enq = (*pg)->AllReduce(d, 256, DataType::kF32, ReduceOp::kSum)->Wait();
  SetCurrentStream(nullptr);
  absl::Status later;
  while (absl::Now() - t0 < absl::Seconds(10)) {
    later = (*pg)->Barrier()->Wait(absl::Seconds(5));
    if (!later.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  Report(enq.ok() && !later.ok(),
         absl::StrCat("injected device timeout: aborted after ", absl::FormatDuration(absl::Now() - t0),
                      ", then: ", later.ToString()));
  cudaStreamSynchronize(s);
}

void SeveralGroups() {
  auto rdzv = Rdzv();
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  bool ok = true;
  std::string mem;
  for (int i = 0; i < 3; ++i) {
    auto pg = ProcessGroup::Create(rdzv, 0, 1, Opts(absl::StrCat("multi", i), "nccl"));
    if (!pg.ok()) return Report(false, "several groups: " + pg.status().ToString());
    groups.push_back(std::move(*pg));
  }
  float* d = nullptr;
  cudaMalloc(&d, sizeof(float) * 1024);
  for (auto& g : groups) {
    std::vector<float> h(1024, 2.0f);
    cudaMemcpy(d, h.data(), sizeof(float) * 1024, cudaMemcpyHostToDevice);
    ok = ok && g->AllReduce(d, 1024, DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(60), true).ok();
    cudaMemcpy(h.data(), d, sizeof(float) * 1024, cudaMemcpyDeviceToHost);
    ok = ok && h[0] == 2.0f && h[1023] == 2.0f;
    absl::StrAppend(&mem, " ", g->CommMemoryBytes() >> 20, "MiB");
  }
  cudaFree(d);
  Report(ok, "3 groups on cuda:0; communicator memory:" + mem);
}

#endif

}  // namespace
}  // namespace ember::comm

int main() {
#ifndef EMBER_WITH_NCCL
  std::printf("nccl_gpu_check: built without NCCL (no CUDA toolkit at build time)\n");
  return 2;
#else
  using namespace ember::comm;
  EveryOp();
  CreationTime();
  GraphCapture();
  SeveralGroups();
  InjectedTimeout();  // last: it aborts every communicator of this process
  std::printf("nccl_gpu_check: %d failed\n", g_failed);
  std::fflush(stdout);
  _exit(g_failed ? 1 : 0);
#endif
}
