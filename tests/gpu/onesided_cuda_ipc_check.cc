// The one-sided layer's CUDA IPC backend (runtime/onesided/cuda_ipc.h) on a GPU machine: two
// processes on one device (tests/gpu/run.sh check). The owner cudaMallocs a region, fills it with a
// pattern and exports it at an unaligned offset into its allocation; the peer opens the export and
//   1. puts bytes into it (cudaMemcpyAsync on its stream, completion by the done callback): the
//      owner sees exactly those bytes at exactly that place, the rest untouched;
//   2. captures a put in a CUDA graph and launches it 3 times after refilling its source with a new
//      value each time: the owner sees each value;
//   3. gets the whole region back and compares it with what the owner must hold.
// The agent-level paths (descriptor exchange through the store) need UCX and the store, which the GPU
// machine lacks; cuda_ipc_test covers their refusal here. One PASS/FAIL line per check; exit 0 = all
// passed, 1 = a check failed, 2 = built without CUDA.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "runtime/onesided/cuda_ipc.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ember::onesided {
namespace {

#ifdef EMBER_WITH_CUDA
constexpr size_t kBytes = (8 << 20) + 13;  // the exported region
constexpr size_t kOffset = 1000;           // of the region in the owner's allocation
constexpr size_t kPutAt = 4099, kPutLen = (1 << 20) + 7;
constexpr size_t kGraphLen = 65536;

int g_failed = 0;
void Report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

bool Ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::printf("FAIL %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

char PatternA(size_t i) { return static_cast<char>(i * 131 + 7); }
char PatternB(size_t i) { return static_cast<char>(i * 17 + 3); }

// Length-prefixed messages over a pipe.
void Send(int fd, const std::string& m) {
  const uint64_t n = m.size();
  if (write(fd, &n, 8) != 8 || write(fd, m.data(), n) != static_cast<ssize_t>(n)) _exit(3);
}
std::string Recv(int fd) {
  uint64_t n = 0;
  if (read(fd, &n, 8) != 8) return "";
  std::string m(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, m.data() + got, n - got);
    if (k <= 0) return "";
    got += k;
  }
  return m;
}

std::vector<char> DeviceToHost(const void* p, size_t n) {
  std::vector<char> h(n);
  Ok(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  return h;
}

int Owner(int to_peer, int from_peer) {
  if (!Ok(cudaSetDevice(0), "cudaSetDevice(0)")) return 1;
  char* alloc = nullptr;
  if (!Ok(cudaMalloc(reinterpret_cast<void**>(&alloc), kOffset + kBytes), "cudaMalloc")) return 1;
  char* region = alloc + kOffset;
  std::vector<char> a(kBytes);
  for (size_t i = 0; i < kBytes; ++i) a[i] = PatternA(i);
  Ok(cudaMemcpy(region, a.data(), kBytes, cudaMemcpyHostToDevice), "fill");
  auto exported = cuda_ipc::Export(region, kBytes);
  Report(exported.ok(), "owner: export " + (exported.ok() ? std::string("ok") : exported.status().ToString()));
  Send(to_peer, exported.ok() ? *exported : "");
  if (!exported.ok()) return 1;
  std::vector<char> expect = a;
  for (std::string m; !(m = Recv(from_peer)).empty() && m != "bye";) {
    if (m == "put") {
      for (size_t i = 0; i < kPutLen; ++i) expect[kPutAt + i] = PatternB(i);
    } else if (m.rfind("graph ", 0) == 0) {
      std::memset(expect.data(), std::stoi(m.substr(6)), kGraphLen);
    }
    const std::vector<char> have = DeviceToHost(region, kBytes);
    size_t first_bad = kBytes;
    for (size_t i = 0; i < kBytes && first_bad == kBytes; ++i)
      if (have[i] != expect[i]) first_bad = i;
    Report(first_bad == kBytes, "owner: memory after peer's " + m +
                                    (first_bad == kBytes ? "" : " differs at byte " + std::to_string(first_bad)));
    Send(to_peer, "checked");
  }
  cudaFree(alloc);
  return g_failed == 0 ? 0 : 1;
}

bool WaitFlag(const std::atomic<bool>& f) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!f.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return f.load();
}

int Peer(int to_owner, int from_owner) {
  const std::string exported = Recv(from_owner);
  if (exported.empty()) return 1;
  if (!Ok(cudaSetDevice(0), "cudaSetDevice(0)")) return 1;
  auto m = cuda_ipc::Mapping::Open(exported, kBytes);
  Report(m.ok(), "peer: open " + (m.ok() ? std::string("ok") : m.status().ToString()));
  if (!m.ok()) return 1;
  char* remote = static_cast<char*>((*m)->ptr());
  cudaStream_t stream;
  Ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  char* local = nullptr;
  Ok(cudaMalloc(reinterpret_cast<void**>(&local), kBytes), "cudaMalloc");
  std::vector<char> b(kPutLen);
  for (size_t i = 0; i < kPutLen; ++i) b[i] = PatternB(i);
  Ok(cudaMemcpy(local, b.data(), kPutLen, cudaMemcpyHostToDevice), "fill");

  // 1. put, completion through the callback
  std::atomic<bool> done{false};
  auto q = cuda_ipc::CopyAsync({{remote + kPutAt, local, kPutLen}}, stream, [&] { done = true; });
  Report(q.ok() && !*q, "peer: put enqueued (not captured)");
  Report(WaitFlag(done), "peer: put's done callback ran");
  Send(to_owner, "put");
  if (Recv(from_owner) != "checked") return 1;

  // 2. graph capture of a put, 3 launches
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  bool called = false;
  auto cq = cuda_ipc::CopyAsync({{remote, local, kGraphLen}}, stream, [&] { called = true; });
  const bool ended = Ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  Report(cq.ok() && *cq && ended, "peer: put captured in a graph");
  size_t nodes = 0;
  if (graph != nullptr) cudaGraphGetNodes(graph, nullptr, &nodes);
  Report(nodes == 1, "peer: the graph holds one copy node (" + std::to_string(nodes) + ")");
  if (graph == nullptr || !Ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate")) return 1;
  for (int r = 1; r <= 3; ++r) {
    Ok(cudaMemsetAsync(local, r, kGraphLen, stream), "memset");
    Ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    Ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    Send(to_owner, "graph " + std::to_string(r));
    if (Recv(from_owner) != "checked") return 1;
  }
  Report(!called, "peer: a captured transfer drops its done callback");

  // 3. get the whole region back
  std::vector<char> expect(kBytes);
  for (size_t i = 0; i < kBytes; ++i) expect[i] = PatternA(i);
  for (size_t i = 0; i < kPutLen; ++i) expect[kPutAt + i] = PatternB(i);
  std::memset(expect.data(), 3, kGraphLen);
  std::atomic<bool> got{false};
  auto g = cuda_ipc::CopyAsync({{local, remote, kBytes}}, stream, [&] { got = true; });
  Report(g.ok() && WaitFlag(got), "peer: get completed");
  Report(DeviceToHost(local, kBytes) == expect, "peer: get returns the owner's memory byte for byte");
  // A get into host memory (cudaMemcpyDefault) of an unaligned slice.
  std::vector<char> host(kPutLen);
  std::atomic<bool> got2{false};
  auto h = cuda_ipc::CopyAsync({{host.data(), remote + kPutAt, kPutLen}}, stream, [&] { got2 = true; });
  Report(h.ok() && WaitFlag(got2) && host == b, "peer: get into host memory at an unaligned offset");
  Send(to_owner, "bye");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(local);
  m->reset();
  return g_failed == 0 ? 0 : 1;
}
#endif  // EMBER_WITH_CUDA

int Main() {
#ifndef EMBER_WITH_CUDA
  std::printf("onesided_cuda_ipc_check: built without CUDA\n");
  return 2;
#else
  // Fork before any CUDA call: a CUDA context does not survive fork.
  int to_peer[2], to_owner[2];
  if (pipe(to_peer) != 0 || pipe(to_owner) != 0) return 1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(to_peer[1]);
    close(to_owner[0]);
    _exit(Peer(to_owner[1], to_peer[0]));
  }
  close(to_peer[0]);
  close(to_owner[1]);
  const int owner = Owner(to_peer[1], to_owner[0]);
  close(to_peer[1]);
  int st = 0;
  waitpid(pid, &st, 0);
  const bool peer_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  std::printf("onesided_cuda_ipc_check: owner %s, peer %s\n", owner == 0 ? "passed" : "FAILED",
              peer_ok ? "passed" : "FAILED");
  return owner == 0 && peer_ok ? 0 : 1;
#endif
}

}  // namespace
}  // namespace ember::onesided

int main() { return ember::onesided::Main(); }
