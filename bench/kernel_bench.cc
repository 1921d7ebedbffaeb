// kernel_bench: the issue-4 benchmark table. Fused vs materialised linear cross-entropy, sliding-
// window vs dense causal attention, the sgemm ceiling and model FLOP utilisation, and one GPT
// training step against the same model in PyTorch 2.15 (the peers venv, deploy/peers_venv.h; run
// in the same process tree, same threads);
// `llama`: RoPE, GQA attention and a Llama training step against PyTorch (kernel_bench_llama.h);
// `bf16`: the steps' linear GEMMs in bf16 (oneDNN) vs fp32 (kernel_bench_bf16.h).
//
//   bazel run -c opt //bench:kernel_bench -- [--quick] [--json [--allow-missing-peers]]
//       [--threads=N] [--device=cpu|cuda]
//
// One table of figures (value, reference, ratio); those with a goal are also targets
// (bench/report.h: the goal applies to value/peer; a PyTorch peer that fails leaves its target not
// measured). Timings are medians over --reps runs, except the big LCE and dense attention runs,
// which are timed once (each takes 10-30 s). The training step interleaves ours and PyTorch in
// rounds (median of 3).
//
// The PyTorch peer (issue 30): --python if given, else $EMBER_PEER_PYTHON, else the torch 2.15 venv
// of deploy/peers-venv.sh; never Debian's /usr/bin/python3 (torch 1.13) as a silent fallback: with
// the venv missing, every PyTorch row is not measured (met: false) with the reason. Every peer row
// names the torch version and interpreter, and the thread count of both sides (ours: the pool,
// --threads; torch.set_num_threads and OMP_NUM_THREADS the same, checked in the peer).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/tensor.h"
#include "bench/kernel_bench_bf16.h"
#include "bench/kernel_bench_cuda.h"
#include "bench/kernel_bench_llama.h"
#include "bench/kernel_bench_util.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/model/gpt.h"

ABSL_FLAG(int, threads, 0, "pool size (0: hardware concurrency)");
ABSL_FLAG(int, reps, 5, "repetitions for the cheap timings (median reported)");
ABSL_FLAG(bool, lce_8192, false, "also run the fused/materialised LCE at N = 8192");
ABSL_FLAG(bool, peer, true, "measure PyTorch (2.15, the peers venv) for the peer targets");
ABSL_FLAG(std::string, only, "",
          "comma-separated subset of: lce, attention, step, llama, bf16 (default all)");
ABSL_FLAG(int64_t, lce_n, 4096, "tokens for the LCE target");
ABSL_FLAG(int, profile_steps, 0,
          "only run this many training steps of ours (default mode, after 2 warm-up steps) and "
          "print wall and process-CPU time per step; for profilers");
ABSL_FLAG(bool, profile_deterministic, false, "--profile_steps in deterministic mode");
ABSL_FLAG(std::string, python, "",
          "python with torch for the peer measurement (empty: $EMBER_PEER_PYTHON, else the torch "
          "2.15 venv of deploy/peers-venv.sh; missing: the peer rows are not measured)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu: the CPU figures; cuda: the GPU figures (bench/kernel_bench_cuda.h), which report "
          "met: false with reason \"no GPU\" where there is none");

namespace ember::kernels {
namespace {

using bench::Median;
using bench::Now;
using bench::Rand;
using bench::TimeMedian;
using bench::TrainStep;

using Target = bench::KernelFigure;  // bench/kernel_bench_cuda.h

// Fused vs materialised LCE forward+backward: time and peak workspace bytes (allocator high-water
// mark above the inputs/outputs, which both variants share).
void BenchLce(const ExecContext& ctx, int64_t N, int64_t V, int64_t d, std::vector<Target>* out) {
  auto h = Rand(N * d, 1, 1.0f), W = Rand(V * d, 2, 0.02f);
  std::vector<int32_t> y(N);
  for (int64_t n = 0; n < N; ++n) y[n] = (n * 7919) % V;
  std::vector<float> dh(N * d), dW(V * d, 0.0f);
  LceOptions opt;
  auto run = [&](bool fused, double* secs, double* peak, double* loss) {
    int64_t base = MemoryStats::live_bytes();
    MemoryStats::ResetPeak();
    double s = Now();
    auto r = fused ? FusedLinearCrossEntropy(ctx, opt, h.data(), W.data(), y.data(), N, d, V, dh.data(), dW.data())
                   : MaterialisedLinearCrossEntropy(ctx, opt, h.data(), W.data(), y.data(), N, d, V, dh.data(), dW.data());
    *secs = Now() - s;
    *peak = static_cast<double>(MemoryStats::peak_bytes() - base) / (1 << 20);
    *loss = r->loss;
  };
  double tf, pf, lf, tm, pm, lm;
  run(true, &tf, &pf, &lf);
  run(false, &tm, &pm, &lm);
  std::string shape = absl::StrCat("N=", N, " V=", V, " d=", d);
  std::string note = absl::StrFormat("%s; loss fused %.6f materialised %.6f", shape, lf, lm);
  out->push_back({absl::StrCat("lce_peak_workspace_N", N), pf, pm, 1.0 / 8, false, "MiB", note});
  out->push_back({absl::StrCat("lce_fwd_bwd_time_N", N), tf, tm, 1.0, false, "s", shape});
}

void BenchAttention(ExecContext ctx, int64_t T, int64_t W, int reps, std::vector<Target>* out) {
  const int64_t hd = 64, H = 1, C = H * hd;
  auto qkv = Rand(T * 3 * C, 3, 1.0f), dout = Rand(T * C, 4, 1.0f);
  std::vector<float> o(T * C), lse(H * T), dqkv(T * 3 * C);
  auto step = [&](int64_t window) {
    AttentionShape s{1, T, H, hd, window};
    const float* q = qkv.data();
    float* d = dqkv.data();
    AttentionForward(ctx, s, q, q + C, q + 2 * C, 3 * C, o.data(), C, lse.data());
    AttentionBackward(ctx, s, q, q + C, q + 2 * C, 3 * C, o.data(), dout.data(), C, lse.data(), d, d + C, d + 2 * C);
  };
  ctx.deterministic = false;
  double tw = TimeMedian(reps, [&] { step(W); });
  double td = TimeMedian(1, [&] { step(0); });
  std::string shape = absl::StrCat("T=", T, " W=", W, " hd=64 B=1 H=1 fwd+bwd");
  out->push_back({"attention_window_vs_dense_time", tw, td, 1.0 / 30, false, "s", shape});
  ctx.deterministic = true;
  double tdet = TimeMedian(reps, [&] { step(W); });
  out->push_back({"attention_window_deterministic_vs_default", tdet, tw, std::nullopt, false, "s",
                  "cost of deterministic mode (single-thread backward per head)"});
}

double SgemmCeiling(const ExecContext& ctx, int64_t n, int reps) {
  auto a = Rand(n * n, 5, 1.0f), b = Rand(n * n, 6, 1.0f);
  std::vector<float> c(n * n);
  // The ceiling is the best of the repetitions (fastest run), not the median.
  double t = 1e30;
  for (int i = 0; i < std::max(reps, 3); ++i) {
    double s = Now();
    Gemm(ctx, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    t = std::min(t, Now() - s);
  }
  return 2.0 * n * n * n / t;
}

// The same GPT in PyTorch (args V T L H C B steps threads), attention by PyTorch 2.x's
// F.scaled_dot_product_attention(is_causal=True), what a torch 2.15 user runs; AdamW; tokens/s.
std::string GptPeerScript() {
  return absl::StrCat(R"PY(
import math, sys, time, torch, torch.nn as nn, torch.nn.functional as F
V, T, L, H, C, B, steps, threads = [int(x) for x in sys.argv[1:9]]
torch.set_num_threads(threads); torch.manual_seed(0)
)PY", bench::kTorchRmsNorm, R"PY(class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = RMSNorm(C), RMSNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
        s.fc1, s.fc2 = nn.Linear(C, 4 * C, bias=False), nn.Linear(4 * C, C, bias=False)
    def forward(s, x):
        q, k, v = s.qkv(s.ln1(x)).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList([Block() for _ in range(L)]); s.ln_f = RMSNorm(C)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.blocks: x = b(x)
        return F.cross_entropy((s.ln_f(x) @ s.wte.weight.t()).view(-1, V), tgt.view(-1))
m = GPT()
)PY", bench::kTorchTrainLoop);
}

absl::StatusOr<double> TorchTokensPerSec(const bench::TorchPeer& peer, const model::GptConfig& c,
                                         int64_t B, int steps, int threads) {
  return bench::RunTorchPeer(peer.python, GptPeerScript(),
                             absl::StrCat(c.vocab_size, " ", c.context, " ", c.n_layer, " ", c.n_head,
                                          " ", c.d_model, " ", B, " ", steps, " ", threads),
                             threads);
}

void BenchStep(const ExecContext& ctx, bool quick, int reps, int threads,
               const bench::TorchPeer& peer, std::vector<Target>* out);
double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// --profile_steps: our training step alone. CPU seconds per step are less sensitive to other load
// than wall seconds (they still include cache and memory-bandwidth interference).
int ProfileSteps(const ExecContext& ctx, int steps) {
  const model::GptConfig c = model::BenchmarkConfig();
  const int64_t B = 8;
  auto m = *model::Gpt::Create(c, 1);
  model::AdamW opt(AdamWOptions{1e-4f}, m->num_params());
  std::vector<int32_t> tok(B * c.context), tgt(B * c.context);
  std::mt19937 rng(7);
  for (auto& t : tok) t = rng() % c.vocab_size;
  for (auto& t : tgt) t = rng() % c.vocab_size;
  std::vector<double> wall, cpu;
  for (int i = 0; i < steps + 2; ++i) {
    const double w0 = Now(), c0 = ProcessCpuSeconds();
    m->ZeroGrad();
    if (!m->ForwardBackward(ctx, tok.data(), tgt.data(), B, c.context).ok()) std::abort();
    opt.Step(ctx, *m);
    if (i >= 2) {
      wall.push_back(Now() - w0);
      cpu.push_back(ProcessCpuSeconds() - c0);
    }
  }
  std::printf("profile: %d steps after 2 warm-up: median %.1f tokens/s (wall %.1f ms), median "
              "process CPU %.1f ms per step, min %.1f\n",
              steps, B * c.context / Median(wall), 1e3 * Median(wall), 1e3 * Median(cpu),
              1e3 * *std::min_element(cpu.begin(), cpu.end()));
  return 0;
}

int Print(bench::Report& report, const std::vector<Target>& t, int threads,
          bench::LoadAverage load_begin);

int Main(int argc, char** argv) {
  const bool quick = bench::Quick();
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const int reps = quick ? 1 : absl::GetFlag(FLAGS_reps);
  ThreadPool pool(threads);
  ExecContext ctx{&pool, /*deterministic=*/false};
  if (int n = absl::GetFlag(FLAGS_profile_steps); n > 0) {
    ctx.deterministic = absl::GetFlag(FLAGS_profile_deterministic);
    return ProfileSteps(ctx, n);
  }
  bench::Report report("kernel_bench", argc, argv);
  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  std::vector<Target> t;
  const std::string only = absl::GetFlag(FLAGS_only);
  auto want = [&](const char* g) { return only.empty() || only.find(g) != std::string::npos; };

  if (absl::GetFlag(FLAGS_device) == "cuda") {
    t = bench::BenchCuda(quick, reps);
    return Print(report, t, threads, load_begin);
  }
  if (absl::GetFlag(FLAGS_device) != "cpu") {
    std::fprintf(stderr, "kernel_bench: --device must be cpu or cuda, got %s\n",
                 absl::GetFlag(FLAGS_device).c_str());
    return 2;
  }
  if (want("lce")) {
    if (quick) {
      BenchLce(ctx, 512, 8192, 128, &t);
    } else {
      BenchLce(ctx, absl::GetFlag(FLAGS_lce_n), 128256, 1024, &t);
      if (absl::GetFlag(FLAGS_lce_8192)) BenchLce(ctx, 8192, 128256, 1024, &t);
    }
  }
  if (want("attention")) BenchAttention(ctx, quick ? 2048 : 32768, 256, reps, &t);
  if (want("bf16")) {
    for (auto& f : bench::BenchBf16Gemm(ctx, quick, reps)) t.push_back(std::move(f));
  }
  if (want("step") || want("llama")) {
    const bench::TorchPeer peer =
        bench::TorchPeer::Resolve(absl::GetFlag(FLAGS_peer), absl::GetFlag(FLAGS_python), threads);
    report.SetMeta("peer", json::Value::Str(peer.python.empty() ? "none: " + peer.missing
                                                                : "PyTorch, " + peer.label));
    if (!peer.python.empty()) std::fprintf(stderr, "kernel_bench: peer %s\n", peer.label.c_str());
    if (want("step")) BenchStep(ctx, quick, reps, threads, peer, &t);
    if (want("llama")) {
      for (auto& f : bench::BenchLlama(ctx, quick, reps, threads, peer)) t.push_back(std::move(f));
    }
  }
  return Print(report, t, threads, load_begin);
}

void BenchStep(const ExecContext& ctx, bool quick, int reps, int threads,
               const bench::TorchPeer& peer, std::vector<Target>* out) {
  std::vector<Target>& t = *out;
  model::GptConfig c = model::BenchmarkConfig();  // vocab 8192, context 256, 4x4 heads, width 256
  if (quick) {  // a smoke run: same code paths, a small model
    c.vocab_size = 1024;
    c.context = 64;
    c.n_layer = 1;
    c.d_model = 64;
  }
  const int64_t B = quick ? 2 : 8;
  const int steps = quick ? 2 : 6;
  // Rounds interleave ours (default and deterministic mode), PyTorch and the sgemm ceiling, so a
  // burst of load from other processes hits all of them; each figure is the median over rounds.
  const int rounds = quick ? 1 : 3;
  ExecContext det = ctx;  // same pool, deterministic partitioning
  det.deterministic = true;
  ExecContext bf16 = ctx;  // the linear layers in bf16 (what param_dtype: bf16 runs on such CPUs)
  bf16.bf16_linear = true;
  const bool native_bf16 = HasNativeBf16Gemm();
  std::vector<double> v_tps, v_det, v_peer, v_ceiling, v_bf16;
  std::string peer_error = peer.python.empty() ? peer.missing : "";
  int64_t peak = 0, peak_det = 0;
  for (int r = 0; r < rounds; ++r) {
    v_ceiling.push_back(SgemmCeiling(ctx, quick ? 256 : 2048, quick ? 2 : reps));
    v_tps.push_back(TrainStep(ctx, c, B, steps, &peak));
    v_det.push_back(TrainStep(det, c, B, steps, &peak_det));
    if (!peer.python.empty()) {
      auto p = TorchTokensPerSec(peer, c, B, steps, threads);
      if (p.ok()) v_peer.push_back(*p);
      else peer_error = std::string(p.status().message());
    }
  }
  const double ceiling = Median(v_ceiling), tps = Median(v_tps), tps_det = Median(v_det);
  // Model FLOPs per token: 6 x (block matmul params + LM head) + causal attention 6 * L * T * C.
  const double flops_tok = 6.0 * (12.0 * c.n_layer * c.d_model * c.d_model + c.vocab_size * c.d_model) +
                           6.0 * c.n_layer * c.context * c.d_model;
  t.push_back({"sgemm_ceiling", ceiling / 1e9, std::nullopt, std::nullopt, true, "GFLOP/s",
               absl::StrCat("square sgemm n=", quick ? 256 : 2048, " on the pool")});
  t.push_back({"train_step_mfu", tps * flops_tok / ceiling, std::nullopt, std::nullopt, true,
               "fraction", absl::StrFormat("%.1f GFLOP/s model FLOPs", tps * flops_tok / 1e9)});
  std::optional<double> peer_tps;
  if (!v_peer.empty()) peer_tps = Median(v_peer);
  t.push_back({"train_step_tokens_per_s", tps, peer_tps, 1.5, true, "tokens/s",
               absl::StrFormat("B=%d T=%d V=%d L=%d H=%d C=%d, peak activations %.1f MiB; "
                               "compared: peer %s, the same model (attention by "
                               "F.scaled_dot_product_attention(is_causal)), rounds interleaved; "
                               "%s",
                               B, c.context, c.vocab_size, c.n_layer, c.n_head, c.d_model,
                               peak / 1048576.0,
                               peer.python.empty() ? "PyTorch (not run: see the reason)"
                                                   : peer.label,
                               peer.ThreadsText()),
               peer_error});
  t.push_back({"train_step_deterministic_vs_default", tps_det, tps, std::nullopt, true, "tokens/s",
               "cost of deterministic mode"});
  // The same step with ExecContext::bf16_linear: block linears and the LM head's GEMMs in bf16
  // (oneDNN); attention tiles and everything else fp32. Only where the CPU has bf16 instructions.
  const std::string cpu = absl::StrCat("CPU: ", Bf16GemmInfo().cpu, ", ", threads, " threads");
  if (native_bf16) {
    // Its own rounds, alternating which side goes first (A/B, B/A, ...), so a burst of load from
    // other work hits both sides alike.
    std::vector<double> v_f32;
    int64_t peak_bf16 = 0;
    const int bf16_rounds = quick ? 1 : 4;
    for (int r = 0; r < bf16_rounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        if ((r + k) % 2 == 0) v_f32.push_back(TrainStep(ctx, c, B, steps, &peak_det));
        else v_bf16.push_back(TrainStep(bf16, c, B, steps, &peak_bf16));
      }
    }
    t.push_back({"train_step_bf16_linear_vs_fp32", Median(v_bf16), Median(v_f32), std::nullopt, true,
                 "tokens/s",
                 absl::StrCat("the step above with the block linears and the LM head in bf16 (inputs "
                              "rounded, fp32 accumulation; attention fp32) vs the fp32 step, ",
                              bf16_rounds, " rounds of one each, alternating which goes first; ",
                              cpu)});
  }  // else no row: the report's meta `bf16_gemm` says why
}

int Print(bench::Report& report, const std::vector<Target>& t, int threads,
          bench::LoadAverage load_begin) {
  report.SetMeta("threads", json::Value::Int(threads));
  report.SetMeta("cpu", json::Value::Str(Bf16GemmInfo().cpu));
  report.SetMeta("bf16_gemm", json::Value::Str(Bf16GemmInfo().reason));
  bench::Table& table = report.AddTable(
      "kernels: figures (reference = the figure the value is compared with)",
      {"figure", "value", "reference", "value/reference", "goal", "unit", "note"});
  table.SetLoad(load_begin, bench::ReadLoadAverage());
  for (const auto& x : t) {
    std::optional<double> ratio;
    if (x.peer) ratio = x.value / *x.peer;
    table.AddRow({x.name, x.value, x.peer, ratio,
                  x.goal ? absl::StrFormat("%s %.4g", x.higher_is_better ? ">=" : "<=", *x.goal)
                         : std::string("-"),
                  x.unit, x.note});
    if (x.goal) {
      report.AddTarget(bench::Target::VsPeer(x.name, x.value, x.peer, *x.goal, x.higher_is_better,
                                             x.unit, x.peer_error, x.note));
    }
  }
  return report.Finish();
}

}  // namespace
}  // namespace ember::kernels

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "kernel_bench");
  return ember::kernels::Main(argc, argv);
}
