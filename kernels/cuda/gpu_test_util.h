// Helpers for the CUDA op tests: a shared context or a visible SKIP line when there is no GPU,
// device buffers from the context's allocator, and RunTwice, which poisons (NaN-fills) or resets
// the outputs before each of two runs, checks the two results are bitwise identical and returns
// them for comparison against the CPU reference. testonly.
//
//   CudaContext* ctx = GpuOrSkip("rmsnorm");  if (!ctx) return;
#ifndef EMBER_KERNELS_CUDA_GPU_TEST_UTIL_H_
#define EMBER_KERNELS_CUDA_GPU_TEST_UTIL_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kernels/cuda/cuda_ops.h"
#include "testing/kernel_test_util.h"

// In a build without CUDA a test file compiles only this: one test that prints the skip.
#define EMBER_CUDA_SKIP_FILE(group)                                                        \
  TEST_CASE(group ": skipped, built without CUDA") {                                      \
    std::printf("SKIP %s: built without CUDA (no toolkit at configure time); nothing ran\n", \
                group);                                                                    \
    std::fflush(stdout);                                                                   \
  }

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>

namespace ember::kernels::cuda::testing {

// The process-wide context, or nullptr after printing "SKIP <test>: no GPU (<reason>)". Set
// EMBER_EXPECT_GPUS=1 to turn a missing GPU into a failure (the GPU machine's script does).
inline CudaContext* GpuOrSkip(const char* test) {
  static std::string why;
  static CudaContext* ctx = [] {
    absl::StatusOr<std::unique_ptr<CudaContext>> c = CudaContext::Create(0);
    if (!c.ok()) {
      why = std::string(c.status().message());
      return static_cast<CudaContext*>(nullptr);
    }
    std::printf("GPU: %s\n", (*c)->DeviceName().c_str());
    return c->release();
  }();
  if (ctx == nullptr) {
    const char* expect = std::getenv("EMBER_EXPECT_GPUS");
    if (expect != nullptr && std::string(expect) != "0") FAIL("no GPU but EMBER_EXPECT_GPUS set: " << why);
    std::printf("SKIP %s: no GPU (%s); nothing ran on a device\n", test, why.c_str());
    std::fflush(stdout);
  }
  return ctx;
}

// n elements of T on the device (from the context's allocator), freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(CudaContext* ctx, size_t n) : ctx_(ctx), n_(n) {
    absl::StatusOr<void*> p = ctx->allocator().Allocate(std::max<size_t>(n, 1) * sizeof(T));
    REQUIRE(p.ok());
    p_ = static_cast<T*>(*p);
  }
  DeviceBuffer(CudaContext* ctx, const std::vector<T>& host) : DeviceBuffer(ctx, host.size()) {
    Upload(host);
  }
  ~DeviceBuffer() { ctx_->allocator().Free(p_).IgnoreError(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return p_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    REQUIRE(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    // The ops run on the context's non-blocking stream, which does not wait for the legacy
    // default stream: finish the copy before anything is queued.
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  }
  std::vector<T> Download() {
    std::vector<T> host(n_);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  // All bytes 0xFF: NaN for f32 and bf16, -1 for integers.
  void Poison() {
    REQUIRE(cudaMemset(p_, 0xFF, n_ * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // see Upload
  }

 private:
  CudaContext* ctx_;
  size_t n_;
  T* p_ = nullptr;
};

// An output of the op under test: poisoned before each run when `init` is empty, else reset to
// `init` (accumulated outputs).
template <typename T>
struct Output {
  DeviceBuffer<T>* buf;
  std::vector<T> init;
};

// Runs `run` (returns absl::Status) twice, preparing the outputs before each; REQUIREs success
// and bitwise identical outputs; returns the first run's outputs.
template <typename T, typename Fn>
std::vector<std::vector<T>> RunTwice(CudaContext* ctx, std::vector<Output<T>> outs, Fn run) {
  std::vector<std::vector<T>> first;
  for (int rep = 0; rep < 2; ++rep) {
    for (auto& o : outs) {
      if (o.init.empty()) o.buf->Poison(); else o.buf->Upload(o.init);
    }
    absl::Status st = run();
    INFO(st.ToString());
    REQUIRE(st.ok());
    REQUIRE(ctx->Synchronize().ok());
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<T> got = outs[i].buf->Download();
      if (rep == 0) {
        first.push_back(std::move(got));
      } else {
        INFO("output " << i << " differs between two identical runs (determinism)");
        REQUIRE(std::memcmp(got.data(), first[i].data(), got.size() * sizeof(T)) == 0);
      }
    }
  }
  return first;
}

}  // namespace ember::kernels::cuda::testing

namespace ember::kernels::cuda {
// What every CUDA op test uses; the CPU reference runs on one thread.
using kernels::testing::ErrRatio;
using kernels::testing::Random;
using testing::DeviceBuffer;
using testing::GpuOrSkip;
using testing::RunTwice;
inline const ExecContext kCpu{};
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
#endif  // EMBER_KERNELS_CUDA_GPU_TEST_UTIL_H_
