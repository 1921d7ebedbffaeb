// Tests of the CUDA interpreter itself: each check (two-order race detection, the launch limit,
// warp masks naming exited lanes, barriers not reached by every thread, bounds) catches a kernel
// written to trip it, and correct kernels pass.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/cuda/interp/cuda_interp.h"
#include "kernels/cuda/interp/include/cublasLt.h"

namespace {

// Block-wide sum through shared memory; `sync` false drops the barrier between the writes and
// the reads (a race).
constexpr int kSumWriteLine = __LINE__ + 4;
constexpr int kSumReadLine = __LINE__ + 7;
__global__ void BlockSumKernel(const float* x, float* out, bool sync) {
  EMBER_SHARED(float, s, [256]);
  s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  if (sync) __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) t += s[i];
    out[blockIdx.x] = t;
  }
}

// A tree reduction in shared memory: a barrier after every level (correct).
__global__ void TreeSumKernel(const float* x, float* out) {
  EMBER_SHARED(float, s, [256]);
  s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// Within one warp: each lane writes its slot and reads its neighbour's; ordered by __syncwarp
// when `sync`, a race otherwise (the two-order check cannot see it: the lanes of a warp run in
// one order per run and the race writes and reads distinct values).
constexpr int kWarpReadLine = __LINE__ + 5;
__global__ void WarpNeighbourKernel(float* out, bool sync) {
  EMBER_SHARED(float, s, [32]);
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (sync) __syncwarp();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 32];
}

// Thread 0 reads a slot no thread wrote.
__global__ void UnwrittenReadKernel(float* out) {
  EMBER_SHARED(float, s, [64]);
  if (threadIdx.x < 32) s[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[40];
}

// Thread 0 indexes one past the end of a shared array.
__global__ void SharedOverrunKernel(float* out) {
  EMBER_SHARED(float, s, [32]);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[32];
}

__global__ void WarpSumKernel(const float* x, float* out) {
  float v = x[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  v = __shfl_sync(0xffffffffu, v, 0) + __shfl_down_sync(0xffffffffu, 0.0f, 1);
  out[threadIdx.x] = v;
}

// Lanes 16..31 return; the rest shuffle with a full mask.
__global__ void ExitedLaneKernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
// The same with the right mask: fine.
__global__ void HalfMaskKernel(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, static_cast<float>(threadIdx.x), 1);
}

// Thread 0 returns before the barrier the others wait at.
__global__ void EarlyExitKernel(float* out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void WriteKernel(float* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = 2.0f;
}

struct Dev {
  explicit Dev(size_t n) : n(n) { REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess); }
  ~Dev() { cudaFree(p); }
  void Up(const std::vector<float>& h) {
    REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<float> Down() {
    std::vector<float> h(n);
    REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  size_t n;
  float* p = nullptr;
};

}  // namespace

TEST_CASE("interp: a block sum with its barrier is right; without it the race is reported") {
  const int blocks = 3, threads = 256;
  std::vector<float> h(blocks * threads);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 7);
  Dev x(h.size()), out(blocks);
  x.Up(h);
  EMBER_LAUNCH(BlockSumKernel, blocks, threads, 0, nullptr)(x.p, out.p, true);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> got = out.Down();
  for (int b = 0; b < blocks; ++b) {
    float want = 0;
    for (int t = 0; t < threads; ++t) want += h[b * threads + t];
    CHECK(got[b] == want);
  }
  EMBER_LAUNCH(BlockSumKernel, blocks, threads, 0, nullptr)(x.p, out.p, false);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  // In the forward order thread 0 runs first and reads s[1] before thread 1 writes it: thread
  // 1's write is reported against thread 0's read: kernel, thread, both lines, the address.
  CHECK(err.find("kernel BlockSumKernel block (0,0,0) thread (1,0,0): shared-memory race: "
                 "writes s (0x") != std::string::npos);
  CHECK(err.find("interp_test.cc:" + std::to_string(kSumWriteLine) + "; thread (0,0,0) read it "
                 "at ") != std::string::npos);
  CHECK(err.find("interp_test.cc:" + std::to_string(kSumReadLine) + " since the last") !=
        std::string::npos);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky: the next launch may run
}

TEST_CASE("interp: with the shared-memory checker off, the two-order check still sees the race") {
  const int threads = 256;
  std::vector<float> h(threads);
  for (int i = 0; i < threads; ++i) h[i] = static_cast<float>(i % 5);
  Dev x(threads), out(1);
  x.Up(h);
  ember_interp::SetSharedChecks(false);
  EMBER_LAUNCH(BlockSumKernel, 1, threads, 0, nullptr)(x.p, out.p, false);
  const cudaError_t sync = cudaDeviceSynchronize();  // the kernel runs here
  ember_interp::SetSharedChecks(true);
  CHECK(sync == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("differs between forward and reverse thread order") != std::string::npos);
}

TEST_CASE("interp: a shared-memory tree reduction with its barriers passes the checker") {
  const int blocks = 2, threads = 256;
  std::vector<float> h(blocks * threads);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 11);
  Dev x(h.size()), out(blocks);
  x.Up(h);
  REQUIRE(ember_interp::SharedChecks());
  EMBER_LAUNCH(TreeSumKernel, blocks, threads, 0, nullptr)(x.p, out.p);
  INFO(ember_interp::LastKernelError());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> got = out.Down();
  for (int b = 0; b < blocks; ++b) {
    float want = 0;
    for (int t = 0; t < threads; ++t) want += h[b * threads + t];
    CHECK(got[b] == want);  // small integers: exact in any order
  }
}

TEST_CASE("interp: lanes of one warp need a __syncwarp between a shared write and a read") {
  Dev out(32);
  EMBER_LAUNCH(WarpNeighbourKernel, 1, 32, 0, nullptr)(out.p, true);
  INFO(ember_interp::LastKernelError());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> got = out.Down();
  for (int i = 0; i < 32; ++i) CHECK(got[i] == static_cast<float>((i + 1) % 32));

  EMBER_LAUNCH(WarpNeighbourKernel, 1, 32, 0, nullptr)(out.p, false);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("kernel WarpNeighbourKernel") != std::string::npos);
  // Lane 0 reads s[1] before lane 1 writes it (forward order): lane 1's write is reported.
  CHECK(err.find("thread (1,0,0): shared-memory race: writes s") != std::string::npos);
  CHECK(err.find("interp_test.cc:" + std::to_string(kWarpReadLine)) != std::string::npos);
  CHECK(err.find("__syncwarp/shuffle of both lanes") != std::string::npos);
}

TEST_CASE("interp: reading unwritten shared memory and indexing past a shared array are errors") {
  Dev out(1);
  EMBER_LAUNCH(UnwrittenReadKernel, 1, 64, 0, nullptr)(out.p);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("UnwrittenReadKernel block (0,0,0) thread (0,0,0): shared-memory read of a "
                 "word no thread of this block wrote: s byte 160") != std::string::npos);

  EMBER_LAUNCH(SharedOverrunKernel, 1, 32, 0, nullptr)(out.p);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("shared-memory access out of bounds: 4 bytes at offset 128 of __shared__ s "
                 "(128 bytes") != std::string::npos);
}

TEST_CASE("interp: warp shuffles exchange the lanes' values") {
  std::vector<float> h(32);
  for (int i = 0; i < 32; ++i) h[i] = static_cast<float>(i);
  Dev x(32), out(32);
  x.Up(h);
  EMBER_LAUNCH(WarpSumKernel, 1, 32, 0, nullptr)(x.p, out.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  for (float v : out.Down()) CHECK(v == 496.0f);

  Dev half(32);
  EMBER_LAUNCH(HalfMaskKernel, 1, 32, 0, nullptr)(half.p);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  std::vector<float> g = half.Down();
  for (int i = 0; i < 16; ++i) CHECK(g[i] == static_cast<float>(i ^ 1));
}

TEST_CASE("interp: a block of 2048 threads is refused with cudaErrorInvalidConfiguration") {
  Dev out(2048);
  EMBER_LAUNCH(WriteKernel, 1, 2048, 0, nullptr)(out.p, 2048);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  EMBER_LAUNCH(WriteKernel, 1, dim3(32, 32, 2), 0, nullptr)(out.p, 2048);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  EMBER_LAUNCH(WriteKernel, dim3(1, 65536), 32, 0, nullptr)(out.p, 2048);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  for (float v : out.Down()) REQUIRE(std::isnan(v));  // nothing ran; cudaMalloc poisons
  EMBER_LAUNCH(WriteKernel, 1, 1024, 0, nullptr)(out.p, 2048);
  CHECK(cudaGetLastError() == cudaSuccess);
  for (float v : out.Down()) REQUIRE(v == 2.0f);
}

TEST_CASE("interp: a shuffle whose mask names an exited lane is an error") {
  Dev out(32);
  EMBER_LAUNCH(ExitedLaneKernel, 1, 32, 0, nullptr)(out.p);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("ExitedLaneKernel") != std::string::npos);
  CHECK(err.find("names lane 16, which has exited") != std::string::npos);
}

TEST_CASE("interp: a barrier not reached by every thread is an error") {
  Dev out(64);
  EMBER_LAUNCH(EarlyExitKernel, 1, 64, 0, nullptr)(out.p);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("EarlyExitKernel") != std::string::npos);
  CHECK(err.find("barrier not reached by every thread") != std::string::npos);
}

TEST_CASE("interp: writing past the end of a cudaMalloc allocation faults, naming the kernel") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    float* p = nullptr;
    if (cudaMalloc(&p, 1000 * sizeof(float)) != cudaSuccess) _exit(3);
    EMBER_LAUNCH(WriteKernel, 1, 256, 0, nullptr)(p, 1000 + 16);  // 64 bytes past the end
    cudaDeviceSynchronize();  // the kernel runs here
    _exit(0);  // not reached when the overrun faults
  }
  close(fds[1]);
  std::string err;
  char buf[512];
  for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(r));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO(err);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK(err.find("invalid memory access") != std::string::npos);
  CHECK(err.find("kernel WriteKernel block (0,0,0) thread (") != std::string::npos);
}

TEST_CASE("interp: cudaMemcpy outside an allocation and device properties") {
  Dev d(4);
  float h[8] = {};
  CHECK(cudaMemcpy(d.p, h, 8 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(prop.multiProcessorCount == 132);
  CHECK(prop.sharedMemPerBlock == 48u << 10);
  CHECK(prop.sharedMemPerBlockOptin == 227u << 10);
  CHECK(prop.major == 9);
}

// ---- streams, events, graphs, cudaGetLastError -------------------------------------------------
namespace {

__global__ void FillKernel(float* x, float v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = v;
}
__global__ void TwiceKernel(const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = 2.0f * x[i];
}
__global__ void AddOneKernel(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] += 1.0f;
}

// Producer on stream a fills x with 3; consumer on stream b computes y = 2x; b waits on an event
// recorded after the producer when `wait`. Returns y after synchronizing b only.
std::vector<float> ProducerConsumer(unsigned flags_a, unsigned flags_b, bool wait) {
  const int n = 256;
  Dev x(n), y(n);
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreateWithFlags(&a, flags_a) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, flags_b) == cudaSuccess);
  cudaEvent_t e;
  REQUIRE(cudaEventCreate(&e) == cudaSuccess);
  EMBER_LAUNCH(FillKernel, 2, 64, 0, a)(x.p, 3.0f, n);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  if (wait) REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  EMBER_LAUNCH(TwiceKernel, 2, 64, 0, b)(x.p, y.p, n);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  std::vector<float> got(n);
  // Into pageable host memory on b: returns when done, after what b waited for only.
  REQUIRE(cudaMemcpyAsync(got.data(), y.p, n * sizeof(float), cudaMemcpyDeviceToHost, b) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  return got;
}

}  // namespace

TEST_CASE("interp streams: an event wait orders a consumer after its producer") {
  for (float v : ProducerConsumer(cudaStreamNonBlocking, cudaStreamNonBlocking, true))
    REQUIRE(v == 6.0f);
  // Without the wait the consumer runs first and reads x as cudaMalloc left it (NaN): a missing
  // stream dependency is a wrong result, not a lucky right one.
  for (float v : ProducerConsumer(cudaStreamNonBlocking, cudaStreamNonBlocking, false))
    REQUIRE(std::isnan(v));
}

TEST_CASE("interp streams: the legacy default stream waits for blocking streams only") {
  const int n = 128;
  for (unsigned flags : {cudaStreamDefault, cudaStreamNonBlocking}) {
    INFO("producer stream flags " << flags);
    Dev x(n), y(n);
    cudaStream_t a;
    REQUIRE(cudaStreamCreateWithFlags(&a, flags) == cudaSuccess);
    EMBER_LAUNCH(FillKernel, 1, 64, 0, a)(x.p, 5.0f, n);
    EMBER_LAUNCH(TwiceKernel, 1, 64, 0, nullptr)(x.p, y.p, n);  // legacy stream
    std::vector<float> got = y.Down();  // cudaMemcpy: the legacy stream, synchronous
    for (float v : got) {
      if (flags == cudaStreamDefault) REQUIRE(v == 10.0f);
      else REQUIRE(std::isnan(v));
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    cudaStreamDestroy(a);
  }
}

TEST_CASE("interp streams: queued work runs at synchronization, in stream order") {
  const int n = 64;
  Dev x(n);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(x.p, 0, n * sizeof(float), s) == cudaSuccess);
  for (int i = 0; i < 3; ++i) EMBER_LAUNCH(AddOneKernel, 1, 32, 0, s)(x.p, n);
  std::vector<float> h(n, 7.0f);
  // Queued after the adds; the host buffer is consumed by the call (pageable memory).
  REQUIRE(cudaMemcpyAsync(x.p, h.data(), 4 * sizeof(float), cudaMemcpyHostToDevice, s) ==
          cudaSuccess);
  h.assign(n, -1.0f);
  // Nothing ran yet: a plain cudaMemcpy (legacy stream) does not wait for a non-blocking stream.
  std::vector<float> before = x.Down();
  for (float v : before) REQUIRE(std::isnan(v));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  std::vector<float> after = x.Down();
  for (int i = 0; i < n; ++i) REQUIRE(after[i] == (i < 4 ? 7.0f : 3.0f));
  cudaStreamDestroy(s);
}

TEST_CASE("interp graphs: a captured sequence runs only when launched, once per launch") {
  const int n = 64;
  Dev x(n);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(x.p, 0, n * sizeof(float), s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  cudaStreamCaptureStatus st;
  REQUIRE(cudaStreamIsCapturing(s, &st) == cudaSuccess);
  CHECK(st == cudaStreamCaptureStatusActive);
  EMBER_LAUNCH(AddOneKernel, 1, 32, 0, s)(x.p, n);
  EMBER_LAUNCH(AddOneKernel, 1, 32, 0, s)(x.p, n);
  cudaGraph_t g;
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  size_t nodes = 0;
  REQUIRE(cudaGraphGetNodes(g, nullptr, &nodes) == cudaSuccess);
  CHECK(nodes == 2);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (float v : x.Down()) REQUIRE(v == 0.0f);  // capture records, it does not run
  cudaGraphExec_t exec;
  REQUIRE(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess);
  for (int r = 0; r < 3; ++r) REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  for (float v : x.Down()) REQUIRE(v == 6.0f);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);

  // Synchronizing a capturing stream is an error and invalidates the capture.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
  CHECK(g == nullptr);
  cudaGetLastError();
  cudaStreamDestroy(s);
}

TEST_CASE("interp: cudaGetLastError returns a launch error once; a kernel fault at sync") {
  Dev out(2048);
  EMBER_LAUNCH(WriteKernel, 1, 2048, 0, nullptr)(out.p, 2048);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);  // peek does not reset
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  // A kernel error happens when the kernel runs: after the launch returned.
  EMBER_LAUNCH(EarlyExitKernel, 1, 64, 0, nullptr)(out.p);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky here (it is on a GPU)
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("interp: dynamic shared memory above 48 KiB needs the opt-in, 227 KiB at most") {
  Dev out(32);
  EMBER_LAUNCH(FillKernel, 1, 32, 48 << 10, nullptr)(out.p, 1.0f, 32);
  CHECK(cudaGetLastError() == cudaSuccess);
  EMBER_LAUNCH(AddOneKernel, 1, 32, (48 << 10) + 4, nullptr)(out.p, 32);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(AddOneKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             100 << 10) == cudaSuccess);
  EMBER_LAUNCH(AddOneKernel, 1, 32, (48 << 10) + 4, nullptr)(out.p, 32);
  CHECK(cudaGetLastError() == cudaSuccess);
  EMBER_LAUNCH(AddOneKernel, 1, 32, (100 << 10) + 4, nullptr)(out.p, 32);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(AddOneKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (227 << 10) + 1) == cudaErrorInvalidValue);
  for (float v : out.Down()) CHECK(v == 2.0f);  // the fill and one add ran
}

TEST_CASE("interp: the device is an H100") {
  int v = 0;
  REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  CHECK(v == 132);
  REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
  CHECK(v == 227 << 10);
  REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerBlock, 0) == cudaSuccess);
  CHECK(v == 1024);
  REQUIRE(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  CHECK(v == 9);
  cudaDeviceProp prop;
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(std::string(prop.name).find("H100") != std::string::npos);
  CHECK(prop.maxGridSize[1] == 65535);
}

// ---- cuBLASLt: the host matmul, and each refusal ----------------------------------------------
namespace {

uint16_t Bf16(float f) {  // truncation is exact for the values used below
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// One cuBLASLt call, set up the way context.cc's Gemm does; each test changes one thing.
struct LtCall {
  int64_t m = 8, n = 4, k = 16;
  cudaDataType ta_type = CUDA_R_32F, tb_type = CUDA_R_32F, tc_type = CUDA_R_32F;
  cublasOperation_t opa = CUBLAS_OP_N, opb = CUBLAS_OP_N;
  int64_t lda = 8, ldb = 16, ldc = 8, ldd = 8;
  uint64_t a_rows = 8, a_cols = 16, b_rows = 16, b_cols = 4;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType bias_type = CUDA_R_32F;
  size_t pref_ws = 1 << 20, call_ws = 1 << 20;
  uint32_t pref_align_a = 0;  // 0: not set
  size_t a_offset_bytes = 0;
  bool separate_d = false;

  // Status of the heuristic, or of the matmul when the heuristic succeeded (in *stage).
  cublasStatus_t Run(Dev& A, Dev& B, Dev& C, Dev& D, Dev& ws, const char** stage) {
    cublasLtHandle_t h;
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof epilogue) == CUBLAS_STATUS_SUCCESS);
    if (bias != nullptr) {
      REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                             sizeof bias) == CUBLAS_STATUS_SUCCESS);
    }
    REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                           sizeof bias_type) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t la, lb, lc, ld;
    REQUIRE(cublasLtMatrixLayoutCreate(&la, ta_type, a_rows, a_cols, lda) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&lb, tb_type, b_rows, b_cols, ldb) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&lc, tc_type, m, n, ldc) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&ld, tc_type, m, n, ldd) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t pref;
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &pref_ws, sizeof pref_ws) ==
            CUBLAS_STATUS_SUCCESS);
    if (pref_align_a != 0) {
      REQUIRE(cublasLtMatmulPreferenceSetAttribute(
                  pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &pref_align_a,
                  sizeof pref_align_a) == CUBLAS_STATUS_SUCCESS);
    }
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, ld, pref, 1, &heur, &found);
    *stage = "heuristic";
    if (st == CUBLAS_STATUS_SUCCESS) {
      REQUIRE(found == 1);
      const float alpha = 1.0f, beta = 0.5f;
      float* d = separate_d ? D.p : C.p;
      st = cublasLtMatmul(h, op, &alpha, reinterpret_cast<char*>(A.p) + a_offset_bytes, la, B.p,
                          lb, &beta, C.p, lc, d, ld, &heur.algo, ws.p, call_ws, nullptr);
      *stage = "matmul";
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
    return st;
  }
};

struct LtBuffers {
  Dev A{16 * 16 + 8}, B{16 * 16}, C{16 * 16}, D{16 * 16}, bias{16}, ws{(1 << 20) / 4};
  LtBuffers() {
    std::vector<float> a(A.n), b(B.n), c(C.n), bi(bias.n);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 3);
    for (size_t i = 0; i < bi.size(); ++i) bi[i] = 0.25f * static_cast<float>(i);
    A.Up(a);
    B.Up(b);
    C.Up(c);
    bias.Up(bi);
  }
  cublasStatus_t Run(LtCall& c, const char** stage) { return c.Run(A, B, C, D, ws, stage); }
};

}  // namespace

TEST_CASE("interp cuBLASLt: a valid f32 GEMM with bias matches an independent reference") {
  LtBuffers buf;
  const std::vector<float> a = buf.A.Down(), b = buf.B.Down(), c0 = buf.C.Down(),
                           bias = buf.bias.Down();
  LtCall call;
  call.opa = CUBLAS_OP_T;  // A stored k x m (16 x 8, ld 16)
  call.a_rows = 16;
  call.a_cols = 8;
  call.lda = 16;
  call.epilogue = CUBLASLT_EPILOGUE_BIAS;
  call.bias = buf.bias.p;
  const char* stage;
  REQUIRE(buf.Run(call, &stage) == CUBLAS_STATUS_SUCCESS);
  INFO(ember_interp::LastCublasLtError());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> got = buf.C.Down();
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < 8; ++i) {
      double acc = 0;
      for (int p = 0; p < 16; ++p) acc += double{a[p + i * 16]} * b[p + j * 16];
      const double want = acc + 0.5 * c0[i + j * 8] + bias[i];
      CHECK(got[i + j * 8] == static_cast<float>(want));  // small integers and quarters: exact
    }
  }
}

TEST_CASE("interp cuBLASLt: bf16 inputs with fp32 compute and the GELU epilogue") {
  Dev A(8 * 16 / 2), B(16 * 4 / 2), C(8 * 4), D(1), ws(1 << 18);
  std::vector<uint16_t> a(8 * 16), b(16 * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = Bf16(0.125f * static_cast<float>(i % 9) - 0.5f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = Bf16(0.25f * static_cast<float>(i % 4) - 0.25f);
  REQUIRE(cudaMemcpy(A.p, a.data(), a.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(B.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  C.Up(std::vector<float>(8 * 4, 1.0f));
  LtCall call;
  call.ta_type = call.tb_type = CUDA_R_16BF;
  call.epilogue = CUBLASLT_EPILOGUE_GELU;
  call.pref_ws = 0;
  call.call_ws = 0;
  const char* stage;
  REQUIRE(call.Run(A, B, C, D, ws, &stage) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> got = C.Down();
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < 8; ++i) {
      double acc = 0;
      for (int p = 0; p < 16; ++p) {
        const double av = 0.125 * ((i + p * 8) % 9) - 0.5, bv = 0.25 * ((p + j * 16) % 4) - 0.25;
        acc += av * bv;
      }
      const double x = acc + 0.5 * 1.0;  // alpha 1, beta 0.5, C = 1
      const double want =
          0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
      CHECK(std::fabs(got[i + j * 8] - want) <= 1e-6 * (1 + std::fabs(want)));
    }
  }
}

TEST_CASE("interp cuBLASLt: each documented refusal") {
  LtBuffers buf;
  const char* stage = "";
  auto refuses = [&](LtCall c, cublasStatus_t want, const char* want_stage, const char* why) {
    INFO(why);
    const cublasStatus_t got = buf.Run(c, &stage);
    INFO("stage " << stage << ": " << ember_interp::LastCublasLtError());
    CHECK(got == want);
    CHECK(std::string(stage) == want_stage);
    CHECK(ember_interp::LastCublasLtError().find(why) != std::string::npos);
  };
  LtCall ok;
  REQUIRE(buf.Run(ok, &stage) == CUBLAS_STATUS_SUCCESS);

  LtCall c = ok;
  c.lda = 7;  // < 8 rows
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "heuristic", "leading dimension of A (8 x 16, ld 7)");
  c = ok;
  c.ldc = c.ldd = 4;
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "heuristic", "leading dimension of C");
  c = ok;
  c.opb = CUBLAS_OP_T;  // op(B) becomes 4 x 16: k no longer chains
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "heuristic", "shapes do not chain");
  c = ok;
  c.opa = static_cast<cublasOperation_t>(7);
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "heuristic", "TRANSA/TRANSB 7/0");
  c = ok;
  c.tb_type = CUDA_R_16BF;  // f32 x bf16
  refuses(c, CUBLAS_STATUS_NOT_SUPPORTED, "heuristic", "types A 0, B 14");
  c = ok;
  c.ta_type = c.tb_type = CUDA_R_16F;
  refuses(c, CUBLAS_STATUS_NOT_SUPPORTED, "heuristic", "types A 2, B 2");
  c = ok;
  c.epilogue = CUBLASLT_EPILOGUE_GELU_BIAS;  // no bias pointer
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "heuristic", "without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
  c = ok;
  c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  c.bias = buf.bias.p;
  c.bias_type = CUDA_R_16BF;  // with f32 inputs
  refuses(c, CUBLAS_STATUS_NOT_SUPPORTED, "heuristic", "bias type 14");
  c = ok;
  c.a_offset_bytes = 4;  // A 4-byte aligned
  refuses(c, CUBLAS_STATUS_NOT_SUPPORTED, "matmul", "is not 16-byte aligned");
  c.pref_align_a = 4;  // the caller says A may be 4-byte aligned: an algorithm for that
  CHECK(buf.Run(c, &stage) == CUBLAS_STATUS_SUCCESS);
  c = ok;
  c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  c.bias = reinterpret_cast<const char*>(buf.bias.p) + 4;
  refuses(c, CUBLAS_STATUS_NOT_SUPPORTED, "matmul", "the bias pointer is not 16-byte aligned");
  c = ok;
  c.call_ws = 64;  // the algorithm's split-K buffer is m * n * 4 = 128 bytes
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "matmul", "workspaceSizeInBytes 64 is below the 128");
  c = ok;
  c.separate_d = true;
  c.ldd = 9;  // D separate: fine
  CHECK(buf.Run(c, &stage) == CUBLAS_STATUS_SUCCESS);
  c.separate_d = false;  // in place with ldc 8 != ldd 9
  refuses(c, CUBLAS_STATUS_INVALID_VALUE, "matmul", "in place (C == D) with ldc 8 != ldd 9");
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  // A leading dimension too large for the allocation: a GPU reads past it (illegal address).
  c = ok;
  c.ldb = 70;  // B spans 3 * 70 + 16 floats of a 256-float buffer: fine
  CHECK(buf.Run(c, &stage) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  c.ldb = 90;  // 3 * 90 + 16 = 286 floats > 256
  CHECK(buf.Run(c, &stage) == CUBLAS_STATUS_SUCCESS);  // asynchronous, as on a GPU
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  CHECK(ember_interp::LastKernelError().find("operand B (16 x 4, ld 90)") != std::string::npos);
  cudaGetLastError();

  cublasLtMatmulDesc_t d;
  CHECK(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_16F, CUDA_R_32F) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_CASE("interp: a write just past an allocation's end, inside its alignment slack, is caught") {
  Dev out(1001);  // 4004 bytes: 12 bytes of slack before the guard page
  EMBER_LAUNCH(WriteKernel, 1, 256, 0, nullptr)(out.p, 1002);  // off by one
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("kernel WriteKernel wrote past the end of a cudaMalloc allocation: byte 4004 "
                 "of the 4004-byte allocation") != std::string::npos);
  EMBER_LAUNCH(WriteKernel, 1, 256, 0, nullptr)(out.p, 1001);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("interp streams: an event destroyed before its record ran, and timing between events") {
  Dev x(64);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t a, b, gone;
  REQUIRE(cudaEventCreate(&a) == cudaSuccess);
  REQUIRE(cudaEventCreate(&b) == cudaSuccess);
  REQUIRE(cudaEventCreate(&gone) == cudaSuccess);
  REQUIRE(cudaEventRecord(a, s) == cudaSuccess);
  EMBER_LAUNCH(FillKernel, 1, 64, 0, s)(x.p, 4.0f, 64);
  REQUIRE(cudaEventRecord(gone, s) == cudaSuccess);
  REQUIRE(cudaEventDestroy(gone) == cudaSuccess);  // its record still runs, before the free
  REQUIRE(cudaEventRecord(b, s) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorNotReady);  // b's record has not run
  REQUIRE(cudaEventSynchronize(b) == cudaSuccess);
  REQUIRE(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
  CHECK(ms >= 0.0f);
  for (float v : x.Down()) CHECK(v == 4.0f);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
}
