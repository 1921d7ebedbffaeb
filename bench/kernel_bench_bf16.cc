#include "bench/kernel_bench_bf16.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/kernel_bench_util.h"
#include "bench/report.h"
#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "runtime/model/gpt.h"

namespace ember::bench {
namespace {

using kernels::ExecContext;

// One linear layer of a block: y[N,out] = x[N,in] @ W[out,in]^T.
struct LinearShape {
  std::string name;
  int64_t in, out;
};

std::vector<LinearShape> BlockLinears(const model::GptConfig& c) {
  const int64_t C = c.d_model, F = c.ff();
  const bool swiglu = c.mlp == model::GptConfig::Mlp::kSwiGlu;
  return {{"qkv", C, c.qkv_width()}, {"proj", C, C}, {"fc1", C, swiglu ? 2 * F : F}, {"fc2", F, C}};
}

// One GEMM of the step: op(A)[M,K] @ op(B)[K,N], as LinearForward/LinearBackward call it.
struct Shape {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;
};

struct Buffers {
  std::vector<float> a, b, c;
  std::vector<uint16_t> ab, bb;
};

Buffers Make(const ExecContext& ctx, const Shape& s) {
  Buffers x;
  x.a = Rand(s.M * s.K, 41, 1.0f);
  x.b = Rand(s.K * s.N, 42, 0.05f);
  x.c.assign(s.M * s.N, 0.0f);
  x.ab.resize(x.a.size());
  x.bb.resize(x.b.size());
  kernels::CastF32ToBf16(ctx, x.a.data(), x.ab.data(), x.a.size());
  kernels::CastF32ToBf16(ctx, x.b.data(), x.bb.data(), x.b.size());
  return x;
}

double TimeGemm(const ExecContext& ctx, const Shape& s, Buffers& x, bool bf16) {
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  const double t0 = Now();
  if (bf16) {
    kernels::GemmBf16(ctx, s.ta, s.tb, s.M, s.N, s.K, 1.0f, x.ab.data(), lda, x.bb.data(), ldb,
                      s.beta, x.c.data(), s.N);
  } else {
    kernels::Gemm(ctx, s.ta, s.tb, s.M, s.N, s.K, 1.0f, x.a.data(), lda, x.b.data(), ldb, s.beta,
                  x.c.data(), s.N);
  }
  return Now() - t0;
}

void BenchModel(const ExecContext& ctx, const std::string& model, const model::GptConfig& c,
                int64_t B, int rounds, const std::string& where, bool native,
                std::vector<KernelFigure>* out) {
  const int64_t N = B * c.context;
  std::vector<Shape> shapes;
  for (const LinearShape& l : BlockLinears(c)) {
    shapes.push_back({l.name + "_fwd", false, true, N, l.out, l.in, 0.0f});  // x @ W^T
    shapes.push_back({l.name + "_dx", false, false, N, l.in, l.out, 0.0f});  // dy @ W
    shapes.push_back({l.name + "_dw", true, false, l.out, l.in, N, 1.0f});   // dW += dy^T @ x
  }
  std::vector<Buffers> bufs;
  for (const Shape& s : shapes) bufs.push_back(Make(ctx, s));
  // Warm-up: oneDNN creates (and caches) its primitives on first use of a shape.
  for (size_t i = 0; i < shapes.size(); ++i) {
    TimeGemm(ctx, shapes[i], bufs[i], true);
    TimeGemm(ctx, shapes[i], bufs[i], false);
  }
  std::vector<std::vector<double>> t32(shapes.size()), t16(shapes.size());
  std::vector<double> sum32, sum16;
  for (int r = 0; r < rounds; ++r) {
    double s32 = 0, s16 = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      // A/B/B/A: each side is first half the time.
      const double a1 = TimeGemm(ctx, shapes[i], bufs[i], false);
      const double b1 = TimeGemm(ctx, shapes[i], bufs[i], true);
      const double b2 = TimeGemm(ctx, shapes[i], bufs[i], true);
      const double a2 = TimeGemm(ctx, shapes[i], bufs[i], false);
      t32[i].push_back(std::min(a1, a2));
      t16[i].push_back(std::min(b1, b2));
      s32 += std::min(a1, a2);
      s16 += std::min(b1, b2);
    }
    sum32.push_back(s32);
    sum16.push_back(s16);
  }
  double flops_all = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const double flops = 2.0 * s.M * s.N * s.K;
    flops_all += flops;
    out->push_back({absl::StrCat("bf16_gemm_", model, "_", s.name), flops / Median(t16[i]) / 1e9,
                    flops / Median(t32[i]) / 1e9, std::nullopt, true, "GFLOP/s",
                    absl::StrFormat("M=%d N=%d K=%d trans_a=%d trans_b=%d; reference: fp32 sgemm; %s",
                                    s.M, s.N, s.K, s.ta, s.tb, where)});
  }
  std::optional<double> goal;
  if (native) goal = 1.6;
  out->push_back({absl::StrCat("bf16_gemm_", model, "_step_gemms"), flops_all / Median(sum16) / 1e9,
                  flops_all / Median(sum32) / 1e9, goal, true, "GFLOP/s",
                  absl::StrFormat("the %d linear GEMMs of one %s step per layer (B=%d T=%d C=%d), "
                                  "bf16 inputs vs fp32, summed per round, median of %d rounds; "
                                  "reference: fp32 sgemm; %s",
                                  shapes.size(), model, B, c.context, c.d_model, rounds, where)});

  // The same GEMMs through the linear layers, casts to bf16 included (what the step pays).
  std::vector<double> lin32, lin16;
  for (int r = 0; r < rounds + 1; ++r) {
    for (bool bf16 : {false, true, true, false}) {
      ExecContext lc = ctx;
      lc.bf16_linear = bf16;
      double t = 0;
      for (const LinearShape& l : BlockLinears(c)) {
        auto x = Rand(N * l.in, 51, 1.0f), w = Rand(l.out * l.in, 52, 0.05f), dy = Rand(N * l.out, 53, 1.0f);
        std::vector<float> y(N * l.out), dx(N * l.in), dw(l.out * l.in, 0.0f);
        const double t0 = Now();
        kernels::LinearForward(lc, x.data(), w.data(), nullptr, N, l.in, l.out, y.data());
        kernels::LinearBackward(lc, x.data(), w.data(), dy.data(), N, l.in, l.out, dx.data(), dw.data(), nullptr);
        t += Now() - t0;
      }
      if (r > 0) (bf16 ? lin16 : lin32).push_back(t);  // round 0 warms up
    }
  }
  out->push_back({absl::StrCat("bf16_linear_", model, "_fwd_bwd"), flops_all / Median(lin16) / 1e9,
                  flops_all / Median(lin32) / 1e9, std::nullopt, true, "GFLOP/s",
                  absl::StrFormat("LinearForward+LinearBackward of one %s block with "
                                  "ExecContext::bf16_linear (fp32->bf16 casts of x, W, dy "
                                  "included) vs fp32; %s",
                                  model, where)});
}

}  // namespace

std::vector<KernelFigure> BenchBf16Gemm(const ExecContext& ctx, bool quick, int reps) {
  const kernels::Bf16GemmSupport& s = kernels::Bf16GemmInfo();
  const std::string where =
      absl::StrCat("CPU: ", s.cpu, ", ", ctx.num_threads(), " threads both sides; bf16 path: ",
                   s.native ? "" : "none (fp32 widening, goal not applied): ", s.reason);
  const int rounds = quick ? 1 : std::max(reps, 3);
  std::vector<KernelFigure> out;
  // kernel_bench's step figures: the tiny GPT (B=8) and the Llama (B=4), both T=256 C=256.
  model::GptConfig gpt = model::BenchmarkConfig();
  model::GptConfig llama = model::LlamaConfig();
  llama.vocab_size = 8192;
  llama.context = 256;
  llama.n_layer = 4;
  llama.n_head = 8;
  llama.n_kv_head = 2;
  llama.d_model = 256;
  int64_t b_gpt = 8, b_llama = 4;
  if (quick) {
    gpt.context = llama.context = 64;
    gpt.d_model = llama.d_model = 64;
    b_gpt = b_llama = 2;
  }
  BenchModel(ctx, "gpt", gpt, b_gpt, rounds, where, s.native, &out);
  BenchModel(ctx, "llama", llama, b_llama, rounds, where, s.native, &out);
  return out;
}

}  // namespace ember::bench
