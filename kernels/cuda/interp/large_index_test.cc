// Interpreter-only: elementwise ops over more than 2^31 elements, run on the interpreter's lazy
// (unreserved, unpoisoned) 1 GiB+ allocations with only the block that owns the last elements
// (ember_interp::SetBlockFilter), so a 32-bit element count or index anywhere between the op's
// host wrapper and the kernel's loop shows as a wrong or missing tail (or a fault).
#include <cstdint>
#include <vector>

#include "kernels/cuda/gpu_test_util.h"

namespace ember::kernels::cuda {
namespace {

constexpr int64_t kN = (int64_t{1} << 31) + 100;  // (kN - 1) % 256 == 99
constexpr int64_t kTail = 256;

// Runs only the block whose grid-stride chunk holds element kN - 1.
void OnlyLastBlock() {
  ember_interp::SetBlockFilter([](uint3 b, dim3 g, dim3 blk) {
    const int64_t stride = int64_t{g.x} * blk.x;
    return b.y == 0 && b.z == 0 && b.x == static_cast<unsigned>((kN - 1) % stride / blk.x);
  });
}

template <typename T>
T* Alloc(int64_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}

TEST_CASE("interp: Add over 2^31 + 100 elements writes its last elements (64-bit indexing)") {
  CudaContext* ctx = GpuOrSkip("large_index_add");
  REQUIRE(ctx != nullptr);
  float *a = Alloc<float>(kN), *b = Alloc<float>(kN), *out = Alloc<float>(kN);
  const std::vector<float> ones(kTail, 1.0f), twos(kTail, 2.0f);
  REQUIRE(cudaMemcpy(a + kN - kTail, ones.data(), kTail * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaMemcpy(b + kN - kTail, twos.data(), kTail * 4, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  OnlyLastBlock();
  const absl::Status st = Add(*ctx, a, b, out, kN);
  const absl::Status sync = ctx->Synchronize();
  ember_interp::SetBlockFilter({});
  REQUIRE(st.ok());
  REQUIRE(sync.ok());
  std::vector<float> got(kTail);
  REQUIRE(cudaMemcpy(got.data(), out + kN - kTail, kTail * 4, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  // The block owning kN - 1 owns elements kN - 100 .. kN - 1 of its chunk; the rest of the tail
  // belongs to blocks that did not run (zero pages).
  for (int64_t i = 0; i < kTail; ++i) {
    INFO("element kN - " << kTail - i);
    CHECK(got[i] == (i >= kTail - 100 ? 3.0f : 0.0f));
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(out);
}

TEST_CASE("interp: the bf16 cast over 2^31 + 100 elements writes its last elements") {
  CudaContext* ctx = GpuOrSkip("large_index_cast");
  REQUIRE(ctx != nullptr);
  float* in = Alloc<float>(kN);
  uint16_t* out = Alloc<uint16_t>(kN);
  const std::vector<float> v(kTail, 1.5f);  // bf16 0x3FC0
  REQUIRE(cudaMemcpy(in + kN - kTail, v.data(), kTail * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  OnlyLastBlock();
  const absl::Status st = CastF32ToBf16(*ctx, in, out, kN);
  const absl::Status sync = ctx->Synchronize();
  ember_interp::SetBlockFilter({});
  REQUIRE(st.ok());
  REQUIRE(sync.ok());
  std::vector<uint16_t> got(kTail);
  REQUIRE(cudaMemcpy(got.data(), out + kN - kTail, kTail * 2, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  for (int64_t i = 0; i < kTail; ++i) {
    INFO("element kN - " << kTail - i);
    CHECK(got[i] == (i >= kTail - 100 ? 0x3FC0 : 0));
  }
  cudaFree(in);
  cudaFree(out);
}

}  // namespace
}  // namespace ember::kernels::cuda
