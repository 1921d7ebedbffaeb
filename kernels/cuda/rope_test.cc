// CUDA RoPE against the CPU (kernels/rope.h), forward and backward, in place: the Llama 3.1 8B
// frequencies (theta 500000, hd 128, llama3 rule) on the q and k heads of a fused GQA qkv buffer
// (v must stay untouched), a small llama3 case with frequencies in all three bands, and unscaled
// hd 64 with odd (unaligned) row strides and odd T; tables longer than T. SKIPs without a GPU.
//
// Tolerance: none. Both sides compute round(round(x0 c) -/+ round(x1 s)) in float32 from the same
// table (the CPU with fp-contract=off, the GPU with __fmul_rn/__fadd_rn/__fsub_rn, which are never
// fused), so the buffers must be equal bit for bit; ErrRatio is checked too so a failure says how
// far off it is. The op works in place, so instead of poisoning, the whole buffer (rotated heads,
// untouched v heads and row padding) is reset to the input before each of the two runs and
// compared whole: an element the kernel skipped or wrote out of place shows up as a difference.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("rope")
#else

#include "kernels/rope.h"

namespace ember::kernels::cuda {
namespace {

struct RopeCase {
  const char* name;
  int64_t B, T, table_T, heads, hd, stride;
  float theta;
  RopeScaling scaling;
};

RopeScaling Llama3(float factor, int64_t original) {
  RopeScaling s;
  s.llama3 = true;
  s.factor = factor;
  s.original_max_position = original;
  return s;
}

TEST_CASE("cuda RoPE forward/backward equal the CPU bit for bit") {
  CudaContext* ctx = GpuOrSkip("rope");
  if (ctx == nullptr) return;
  // Llama 3.1 8B attention: H = 32 query heads, KV = 8; rotate the H + KV q and k heads of rows
  // [(H + 2 KV) * hd].
  const RopeCase cases[] = {
      {"llama3.1 8B qkv", 1, 257, 260, 40, 128, 48 * 128, 500000.0f, Llama3(8.0f, 8192)},
      {"llama3 all bands", 3, 77, 77, 2, 16, 2 * 16 + 1, 10000.0f, Llama3(4.0f, 64)},
      {"unscaled hd 64", 2, 37, 64, 3, 64, 3 * 64 + 5, 10000.0f, RopeScaling{}},
  };
  for (const RopeCase& c : cases) {
    INFO(c.name);
    const RopeTable tb = MakeRopeTable(RopeInvFreq(c.hd, c.theta, c.scaling), c.table_T);
    DeviceBuffer<float> dcos(ctx, tb.cos), dsin(ctx, tb.sin);
    const RopeDeviceTable dt{dcos.get(), dsin.get(), tb.T, tb.half};
    const int64_t n = c.B * c.T * c.stride;
    std::vector<float> x = Random(n, 1 + c.hd), dy = Random(n, 2 + c.hd);
    DeviceBuffer<float> buf(ctx, n);
    auto f = RunTwice<float>(ctx, {{&buf, x}}, [&] {
      return RopeForward(*ctx, dt, buf.get(), c.B, c.T, c.heads, c.hd, c.stride);
    });
    auto b = RunTwice<float>(ctx, {{&buf, dy}}, [&] {
      return RopeBackward(*ctx, dt, buf.get(), c.B, c.T, c.heads, c.hd, c.stride);
    });
    std::vector<float> wf = x, wb = dy;
    kernels::RopeForward(kCpu, tb, wf.data(), c.B, c.T, c.heads, c.hd, c.stride);
    kernels::RopeBackward(kCpu, tb, wb.data(), c.B, c.T, c.heads, c.hd, c.stride);
    CHECK(ErrRatio(f[0], wf, 1e-6) <= 1);
    CHECK(ErrRatio(b[0], wb, 1e-6) <= 1);
    CHECK(std::memcmp(f[0].data(), wf.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(b[0].data(), wb.data(), n * sizeof(float)) == 0);
    CHECK(f[0] != x);  // the rotation did something (t > 0 rows move)
  }
}

TEST_CASE("cuda RoPE refuses shapes the table does not fit") {
  CudaContext* ctx = GpuOrSkip("rope_args");
  if (ctx == nullptr) return;
  const RopeTable tb = MakeRopeTable(RopeInvFreq(8, 10000.0f, {}), 4);
  DeviceBuffer<float> dcos(ctx, tb.cos), dsin(ctx, tb.sin), x(ctx, 2 * 5 * 16);
  const RopeDeviceTable dt{dcos.get(), dsin.get(), tb.T, tb.half};
  auto code = [&](int64_t T, int64_t hd, int64_t stride) {
    return RopeForward(*ctx, dt, x.get(), 2, T, 2, hd, stride).code();
  };
  CHECK(code(4, 8, 16) == absl::StatusCode::kOk);
  CHECK(code(5, 8, 16) == absl::StatusCode::kInvalidArgument);   // table too short
  CHECK(code(4, 6, 12) == absl::StatusCode::kInvalidArgument);   // half != table half
  CHECK(code(4, 7, 16) == absl::StatusCode::kInvalidArgument);   // odd head size
  CHECK(code(4, 8, 15) == absl::StatusCode::kInvalidArgument);   // stride < heads * hd
  CHECK(RopeBackward(*ctx, dt, x.get(), 2, 5, 2, 8, 16).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ctx->Synchronize().ok());
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
