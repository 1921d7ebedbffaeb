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

namespace {

// Block-wide sum through shared memory; `sync` false drops the barrier between the writes and
// the reads (a race).
__global__ void BlockSumKernel(const float* x, float* out, bool sync) {
  __shared__ float s[256];
  s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  if (sync) __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) t += s[i];
    out[blockIdx.x] = t;
  }
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

TEST_CASE("interp: a block sum with its barrier is right; without it the race is caught") {
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
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("BlockSumKernel") != std::string::npos);
  CHECK(err.find("differs between forward and reverse thread order") != std::string::npos);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky: the next launch may run
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
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("ExitedLaneKernel") != std::string::npos);
  CHECK(err.find("names lane 16, which has exited") != std::string::npos);
  cudaDeviceSynchronize();
}

TEST_CASE("interp: a barrier not reached by every thread is an error") {
  Dev out(64);
  EMBER_LAUNCH(EarlyExitKernel, 1, 64, 0, nullptr)(out.p);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  const std::string err = ember_interp::LastKernelError();
  INFO(err);
  CHECK(err.find("EarlyExitKernel") != std::string::npos);
  CHECK(err.find("barrier not reached by every thread") != std::string::npos);
  cudaDeviceSynchronize();
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
