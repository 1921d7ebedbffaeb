// CUDA MoE routing, permutation and grouped GEMM against the CPU reference (kernels/moe.h):
// outputs poisoned before each of two runs, bitwise determinism. SKIPs without a GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("moe")
#else

#include "kernels/cast.h"
#include "kernels/moe.h"

namespace ember::kernels::cuda {
namespace {

TEST_CASE("cuda MoE routing and permutation equal the CPU's") {
  CudaContext* ctx = GpuOrSkip("moe_route");
  if (ctx == nullptr) return;
  const int64_t N = 777, E = 16;
  const int k = 2;
  std::vector<float> logits = Random(N * E, 1);
  DeviceBuffer<float> dl(ctx, logits), w(ctx, N * k);
  DeviceBuffer<int32_t> ex(ctx, N * k), order(ctx, N * k);
  DeviceBuffer<int64_t> off(ctx, E + 1);
  auto r = RunTwice<float>(ctx, {{&w, {}}}, [&] {
    return MoeRoute(*ctx, dl.get(), N, E, k, ex.get(), w.get());
  });
  std::vector<int32_t> wex(N * k), word(N * k);
  std::vector<float> ww(N * k);
  std::vector<int64_t> woff(E + 1);
  kernels::MoeRoute(kCpu, logits.data(), N, E, k, wex.data(), ww.data());
  kernels::MoePermute(wex.data(), N * k, E, word.data(), woff.data());
  CHECK(ex.Download() == wex);
  CHECK(ErrRatio(r[0], ww, 1e-5) <= 1);
  auto p = RunTwice<int32_t>(ctx, {{&order, {}}}, [&] {
    return MoePermute(*ctx, ex.get(), N * k, E, order.get(), off.get());
  });
  CHECK(p[0] == word);
  CHECK(off.Download() == woff);
  CHECK(MoeRoute(*ctx, dl.get(), N, E, 9, ex.get(), w.get()).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cuda grouped expert GEMM (f32 and bf16) matches the CPU") {
  CudaContext* ctx = GpuOrSkip("moe_grouped_gemm");
  if (ctx == nullptr) return;
  const int64_t E = 4, in = 64, out = 48, S = 100;
  const std::vector<int64_t> offsets = {0, 30, 30, 85, 100};  // expert 1 empty
  std::vector<float> X = Random(S * in, 2), W = Random(E * out * in, 3, 0.2f);
  std::vector<float> want(S * out);
  kernels::GroupedLinearForward(kCpu, X.data(), W.data(), offsets.data(), E, in, out, want.data());
  DeviceBuffer<float> dx(ctx, X), dw(ctx, W), y(ctx, S * out);
  DeviceBuffer<int64_t> doff(ctx, offsets);
  auto f = RunTwice<float>(ctx, {{&y, {}}}, [&] {
    return GroupedLinearForward(*ctx, GemmInput::kF32, dx.get(), dw.get(), doff.get(), E, in, out,
                                y.get());
  });
  CHECK(ErrRatio(f[0], want, 1e-5) <= 1);
  std::vector<uint16_t> xb(X.size()), wb(W.size());
  kernels::CastF32ToBf16(kCpu, X.data(), xb.data(), X.size());
  kernels::CastF32ToBf16(kCpu, W.data(), wb.data(), W.size());
  DeviceBuffer<uint16_t> dxb(ctx, xb), dwb(ctx, wb);
  auto b = RunTwice<float>(ctx, {{&y, {}}}, [&] {
    return GroupedLinearForward(*ctx, GemmInput::kBF16, dxb.get(), dwb.get(), doff.get(), E, in,
                                out, y.get());
  });
  CHECK(ErrRatio(b[0], want, 1e-2) <= 1);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
