// cuBLASLt GEMM against the CPU GEMM (kernels/gemm.h): fp32 in every transpose combination with
// alpha/beta, and bf16 inputs with the bias and GELU epilogues (reference: GemmBf16 + bias +
// GeluForward). Outputs poisoned/reset before each of two runs, bitwise determinism. SKIPs
// without a GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("gemm")
#else

#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"

namespace ember::kernels::cuda {
namespace {

TEST_CASE("cuda fp32 GEMM matches the CPU in every transpose combination") {
  CudaContext* ctx = GpuOrSkip("gemm_f32");
  if (ctx == nullptr) return;
  const int64_t M = 67, N = 129, K = 200;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      INFO("trans_a=" << ta << " trans_b=" << tb);
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<float> a = Random(M * K, 1), b = Random(K * N, 2), c0 = Random(M * N, 3);
      DeviceBuffer<float> da(ctx, a), db(ctx, b), dc(ctx, M * N);
      auto got = RunTwice<float>(ctx, {{&dc, c0}}, [&] {
        return Gemm(*ctx, GemmInput::kF32, ta, tb, M, N, K, 0.5f, da.get(), lda, db.get(), ldb,
                    0.7f, dc.get(), N);
      });
      std::vector<float> want = c0;
      kernels::Gemm(kCpu, ta, tb, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, 0.7f, want.data(),
                    N);
      CHECK(ErrRatio(got[0], want, 1e-5) <= 1);
    }
  }
}

TEST_CASE("cuda bf16 linear with bias and GELU epilogues matches the CPU") {
  CudaContext* ctx = GpuOrSkip("gemm_bf16");
  if (ctx == nullptr) return;
  const int64_t N = 64, in = 256, out = 192;  // y[N,out] = x[N,in] W[out,in]^T + b
  std::vector<float> x = Random(N * in, 4), W = Random(out * in, 5, 0.1f), b = Random(out, 6);
  std::vector<uint16_t> xb(x.size()), Wb(W.size());
  kernels::CastF32ToBf16(kCpu, x.data(), xb.data(), x.size());
  kernels::CastF32ToBf16(kCpu, W.data(), Wb.data(), W.size());
  std::vector<float> base(N * out, 0.0f);
  kernels::GemmBf16(kCpu, false, true, N, out, in, 1.0f, xb.data(), in, Wb.data(), in, 0.0f,
                    base.data(), out);
  DeviceBuffer<uint16_t> dx(ctx, xb), dW(ctx, Wb);
  DeviceBuffer<float> dbias(ctx, b), dy(ctx, N * out);
  for (GemmEpilogue ep : {GemmEpilogue::kNone, GemmEpilogue::kBias, GemmEpilogue::kGelu,
                          GemmEpilogue::kGeluBias}) {
    INFO("epilogue " << static_cast<int>(ep));
    const bool bias = ep == GemmEpilogue::kBias || ep == GemmEpilogue::kGeluBias;
    const bool gelu = ep == GemmEpilogue::kGelu || ep == GemmEpilogue::kGeluBias;
    auto got = RunTwice<float>(ctx, {{&dy, {}}}, [&] {
      return Gemm(*ctx, GemmInput::kBF16, false, true, N, out, in, 1.0f, dx.get(), in, dW.get(),
                  in, 0.0f, dy.get(), out, ep, bias ? dbias.get() : nullptr);
    });
    std::vector<float> want = base;
    if (bias)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < out; ++o) want[n * out + o] += b[o];
    if (gelu) kernels::GeluForward(kCpu, want.data(), want.data(), want.size());
    CHECK(ErrRatio(got[0], want, 1e-2) <= 1);
  }
  CHECK(Gemm(*ctx, GemmInput::kBF16, false, true, N, out, in, 1.0f, dx.get(), in, dW.get(), in,
             0.0f, dy.get(), out, GemmEpilogue::kBias, nullptr)
            .code() == absl::StatusCode::kInvalidArgument);
}

GemmAlignment g_seen;
int g_calls = 0;

TEST_CASE("cuda GEMM on offset pointers: the heuristic is told their alignment, results match") {
  CudaContext* ctx = GpuOrSkip("gemm_offset");
  if (ctx == nullptr) return;
  SetGemmAlignmentObserver([](const GemmAlignment& a) {
    g_seen = a;
    ++g_calls;
  });
  // Rows of a bigger buffer, as MoE expert slices and LCE chunks pass them: offsets of 1, 3 and 5
  // floats (4, 12 and 20 bytes) from 256-byte-aligned allocations.
  const int64_t M = 16, N = 24, K = 40;
  std::vector<float> a = Random((M + 1) * K, 7), b = Random((K + 3) * N, 8);
  DeviceBuffer<float> da(ctx, a), db(ctx, b), dc(ctx, M * N + 5);
  const float* A = da.get() + 1;
  const float* B = db.get() + 3;
  float* C = dc.get() + 5;
  auto got = RunTwice<float>(ctx, {{&dc, std::vector<float>(M * N + 5, 0.0f)}}, [&] {
    return Gemm(*ctx, GemmInput::kF32, false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
  });
  SetGemmAlignmentObserver(nullptr);
  REQUIRE(g_calls >= 1);
  auto align = [](const void* p) {  // independent: the largest power of two <= 256 dividing p
    uint32_t x = 1;
    while (x < 256 && reinterpret_cast<uintptr_t>(p) % (2 * x) == 0) x *= 2;
    return x;
  };
  CHECK(g_seen.a == align(A));
  CHECK(g_seen.b == align(B));
  CHECK(g_seen.c == align(C));
  CHECK(g_seen.d == align(C));
  CHECK(g_seen.a < 256);  // the offsets really are misaligned for the default assumption
  std::vector<float> want(M * N, 0.0f);
  kernels::Gemm(kCpu, false, false, M, N, K, 1.0f, a.data() + 1, K, b.data() + 3, N, 0.0f,
                want.data(), N);
  std::vector<float> out(got[0].begin() + 5, got[0].end());
  CHECK(ErrRatio(out, want, 1e-5) <= 1);
  CHECK(PointerAlignment(nullptr) == 256);
  CHECK(PointerAlignment(reinterpret_cast<void*>(0x1000)) == 256);
  CHECK(PointerAlignment(reinterpret_cast<void*>(0x1008)) == 8);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
