// CUDA fused linear cross-entropy against the CPU (kernels/cross_entropy.h): several token and
// vocabulary chunks with a ragged last tile, ignored tokens, label smoothing and z-loss, mean and
// sum; dh poisoned and dW reset before each of two runs, bitwise determinism; bad targets; and the
// peak device memory stays at the plan's workspace, far below the logits. SKIPs without a GPU.
#include "kernels/cuda/gpu_test_util.h"

#ifndef EMBER_WITH_CUDA
EMBER_CUDA_SKIP_FILE("lce")
#else

#include <cmath>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/plan.h"

namespace ember::kernels::cuda {
namespace {

TEST_CASE("cuda fused LCE matches the CPU loss and gradients") {
  CudaContext* ctx = GpuOrSkip("lce");
  if (ctx == nullptr) return;
  const int64_t N = 300, d = 64, V = 1000;
  std::vector<float> h = Random(N * d, 1), W = Random(V * d, 2, 0.2f), dW0 = Random(V * d, 3);
  std::vector<int32_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = i % 11 == 0 ? -100 : static_cast<int32_t>((i * 37) % V);
  DeviceBuffer<float> dh_in(ctx, h), dW_in(ctx, W), dh(ctx, N * d), dW(ctx, V * d);
  DeviceBuffer<int32_t> dt(ctx, t);
  for (auto red : {LceOptions::Reduction::kMean, LceOptions::Reduction::kSum}) {
    LceOptions opt;
    opt.label_smoothing = 0.1f;
    opt.z_loss = 1e-4f;
    opt.reduction = red;
    opt.token_chunk = 128;  // 3 token chunks, the last ragged
    opt.vocab_chunk = 256;  // 4 vocab tiles, the last ragged
    std::vector<double> losses;
    auto got = RunTwice<float>(ctx, {{&dh, {}}, {&dW, dW0}}, [&]() -> absl::Status {
      absl::StatusOr<LceResult> r = FusedLinearCrossEntropy(
          *ctx, opt, dh_in.get(), dW_in.get(), dt.get(), N, d, V, dh.get(), dW.get(), 0.5f);
      if (!r.ok()) return r.status();
      losses.push_back(r->loss);
      CHECK(r->num_valid == N - (N + 10) / 11);
      return absl::OkStatus();
    });
    std::vector<float> wdh(N * d), wdW = dW0;
    absl::StatusOr<LceResult> want = kernels::FusedLinearCrossEntropy(
        kCpu, opt, h.data(), W.data(), t.data(), N, d, V, wdh.data(), wdW.data(), 0.5f);
    REQUIRE(want.ok());
    REQUIRE(losses.size() == 2);
    CHECK(losses[0] == losses[1]);
    CHECK(std::fabs(losses[0] - want->loss) <= 1e-5 * std::fabs(want->loss));
    CHECK(ErrRatio(got[0], wdh, 1e-5) <= 1);
    CHECK(ErrRatio(got[1], wdW, 1e-5) <= 1);
  }
  // Loss only.
  absl::StatusOr<LceResult> r = FusedLinearCrossEntropy(*ctx, LceOptions{}, dh_in.get(),
                                                        dW_in.get(), dt.get(), N, d, V, nullptr,
                                                        nullptr);
  absl::StatusOr<LceResult> w = kernels::FusedLinearCrossEntropy(
      kCpu, LceOptions{}, h.data(), W.data(), t.data(), N, d, V, nullptr, nullptr);
  REQUIRE(r.ok());
  CHECK(std::fabs(r->loss - w->loss) <= 1e-5 * std::fabs(w->loss));
  // A target outside [0, V).
  t[5] = static_cast<int32_t>(V);
  dt.Upload(t);
  r = FusedLinearCrossEntropy(*ctx, LceOptions{}, dh_in.get(), dW_in.get(), dt.get(), N, d, V,
                              dh.get(), dW.get());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cuda fused LCE peak memory is the plan's workspace, not the logits") {
  CudaContext* ctx = GpuOrSkip("lce_memory");
  if (ctx == nullptr) return;
  const int64_t N = 2048, d = 256, V = 32768;  // logits would be 256 MiB in fp32
  std::vector<float> h = Random(N * d, 4), W = Random(V * d, 5, 0.05f);
  std::vector<int32_t> t(N);
  for (int64_t i = 0; i < N; ++i) t[i] = static_cast<int32_t>((i * 7919) % V);
  DeviceBuffer<float> dh_in(ctx, h), dW_in(ctx, W), dh(ctx, N * d), dW(ctx, V * d);
  DeviceBuffer<int32_t> dt(ctx, t);
  dW.Upload(std::vector<float>(V * d, 0.0f));
  const int64_t budget = int64_t{16} << 20;
  ctx->allocator().ResetPeak();
  const int64_t before = ctx->allocator().stats().allocated_bytes;
  absl::StatusOr<LceResult> r = FusedLinearCrossEntropy(
      *ctx, LceOptions{}, dh_in.get(), dW_in.get(), dt.get(), N, d, V, dh.get(), dW.get(), 1.0f,
      budget);
  REQUIRE(r.ok());
  const int64_t extra = ctx->allocator().stats().peak_allocated_bytes - before;
  std::printf("LCE N=%lld V=%lld: extra device memory %lld bytes (logits: %lld)\n",
              static_cast<long long>(N), static_cast<long long>(V),
              static_cast<long long>(extra), static_cast<long long>(N * V * 4));
  CHECK(extra <= budget + (int64_t{4} << 20));  // + the allocator's rounding of small buffers
  CHECK(extra * 8 <= N * V * 4);
}

}  // namespace
}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDA
