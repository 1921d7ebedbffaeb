#include "bench/kernel_bench_llama.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/kernel_bench_util.h"
#include "bench/report.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/rope.h"
#include "runtime/model/gpt.h"

namespace ember::bench {
namespace {

// Args: B T H KV hd reps threads. Prints tokens/s of RoPE forward+backward on q [B,T,H,hd] and
// k [B,T,KV,hd] (HF apply_rotary_pos_emb, autograd), median over reps after one warm-up.
const char* kRopePeer = R"PY(
import sys, time, torch
B, T, H, KV, hd, reps, threads = [int(x) for x in sys.argv[1:8]]
torch.set_num_threads(threads); torch.manual_seed(0)
inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
f = torch.outer(torch.arange(T).float(), inv); emb = torch.cat((f, f), -1)
cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
def rot(x): return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), -1)
q = torch.randn(B, T, H, hd, requires_grad=True); k = torch.randn(B, T, KV, hd, requires_grad=True)
gq, gk = torch.randn_like(q), torch.randn_like(k); times = []
for i in range(reps + 1):
    t = time.perf_counter()
    qe = q * cos + rot(q) * sin; ke = k * cos + rot(k) * sin
    torch.autograd.backward([qe, ke], [gq, gk]); q.grad = None; k.grad = None
    times.append(time.perf_counter() - t)
times = sorted(times[1:]); print(B * T / times[len(times) // 2])
)PY";

// Args: B T H KV hd reps threads. Causal GQA attention forward+backward with PyTorch 2.x's fused
// attention, F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) (torch >= 2.5; what
// transformers' Llama runs by default): the peer a torch 2.15 user has, not torch 1.13's
// repeat_interleave and masked softmax.
const char* kGqaPeer = R"PY(
import sys, time, torch, torch.nn.functional as F
B, T, H, KV, hd, reps, threads = [int(x) for x in sys.argv[1:8]]
torch.set_num_threads(threads); torch.manual_seed(0)
q = torch.randn(B, H, T, hd, requires_grad=True)
k = torch.randn(B, KV, T, hd, requires_grad=True); v = torch.randn(B, KV, T, hd, requires_grad=True)
go = torch.randn(B, H, T, hd); times = []
for i in range(reps + 1):
    t = time.perf_counter()
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(go)
    q.grad = k.grad = v.grad = None
    times.append(time.perf_counter() - t)
times = sorted(times[1:]); print(B * T / times[len(times) // 2])
)PY";

// Args: V T L H KV C F B steps threads. The llama arch of docs/model.md in PyTorch (HF-style
// rotate_half RoPE, GQA attention by F.scaled_dot_product_attention(is_causal, enable_gqa) as
// transformers' default "sdpa" attention, SwiGLU, untied head), AdamW; tokens/s median after 2
// warm-up steps.
std::string LlamaPeerScript() {
  return absl::StrCat(R"PY(
import math, sys, time, torch, torch.nn as nn, torch.nn.functional as F
V, T, L, H, KV, C, FF, B, steps, threads = [int(x) for x in sys.argv[1:11]]
torch.set_num_threads(threads); torch.manual_seed(0); hd = C // H
)PY", bench::kTorchRmsNorm, R"PY(inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
f = torch.outer(torch.arange(T).float(), inv); emb = torch.cat((f, f), -1)
COS, SIN = emb.cos()[None, None], emb.sin()[None, None]
def rope(x): return x * COS + torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), -1) * SIN
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.ln2 = RMSNorm(C), RMSNorm(C)
        s.q, s.k, s.v = nn.Linear(C, H * hd, bias=False), nn.Linear(C, KV * hd, bias=False), nn.Linear(C, KV * hd, bias=False)
        s.o = nn.Linear(H * hd, C, bias=False)
        s.gate, s.up, s.down = nn.Linear(C, FF, bias=False), nn.Linear(C, FF, bias=False), nn.Linear(FF, C, bias=False)
    def forward(s, x):
        a = s.ln1(x)
        q = rope(s.q(a).view(B, T, H, hd).transpose(1, 2))
        k = rope(s.k(a).view(B, T, KV, hd).transpose(1, 2))
        v = s.v(a).view(B, T, KV, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + s.o(y.transpose(1, 2).reshape(B, T, C))
        m = s.ln2(x)
        return x + s.down(F.silu(s.gate(m)) * s.up(m))
class Llama(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.blocks = nn.ModuleList([Block() for _ in range(L)])
        s.ln_f = RMSNorm(C); s.lm_head = nn.Linear(C, V, bias=False)
    def forward(s, idx, tgt):
        x = s.wte(idx)
        for b in s.blocks: x = b(x)
        return F.cross_entropy(s.lm_head(s.ln_f(x)).view(-1, V), tgt.view(-1))
m = Llama()
)PY", bench::kTorchTrainLoop);
}

struct AttnShape {
  int64_t B, T, H, KV, hd;
  std::string Args(int reps, int threads) const {
    return absl::StrCat(B, " ", T, " ", H, " ", KV, " ", hd, " ", reps, " ", threads);
  }
  std::string Text() const { return absl::StrFormat("B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd); }
};

// Ours: tokens/s of RoPE forward+backward on q and k inside a fused qkv buffer.
double OurRope(const kernels::ExecContext& ctx, const AttnShape& s, int reps) {
  const int64_t Q = (s.H + 2 * s.KV) * s.hd;
  auto x = Rand(s.B * s.T * Q, 1, 1.0f), g = Rand(s.B * s.T * Q, 2, 1.0f);
  const auto table = kernels::MakeRopeTable(kernels::RopeInvFreq(s.hd, 10000.0f, {}), s.T);
  kernels::RopeForward(ctx, table, x.data(), s.B, s.T, s.H + s.KV, s.hd, Q);  // warm-up
  const double t = TimeMedian(reps, [&] {
    kernels::RopeForward(ctx, table, x.data(), s.B, s.T, s.H + s.KV, s.hd, Q);
    kernels::RopeBackward(ctx, table, g.data(), s.B, s.T, s.H + s.KV, s.hd, Q);
  });
  return s.B * s.T / t;
}

// Ours: tokens/s of causal GQA attention forward+backward.
double OurGqa(const kernels::ExecContext& ctx, const AttnShape& s, int reps) {
  const int64_t C = s.H * s.hd, KC = s.KV * s.hd, Q = C + 2 * KC, N = s.B * s.T;
  auto qkv = Rand(N * Q, 3, 1.0f), dout = Rand(N * C, 4, 1.0f);
  std::vector<float> o(N * C), lse(s.B * s.H * s.T), d(N * Q);
  const kernels::AttentionShape as{s.B, s.T, s.H, s.hd, 0, s.KV};
  auto step = [&] {
    const float* q = qkv.data();
    kernels::AttentionForward(ctx, as, q, q + C, q + C + KC, Q, o.data(), C, lse.data());
    kernels::AttentionBackward(ctx, as, q, q + C, q + C + KC, Q, o.data(), dout.data(), C,
                               lse.data(), d.data(), d.data() + C, d.data() + C + KC);
  };
  step();  // warm-up
  return N / TimeMedian(reps, step);
}

// One figure from interleaved rounds of ours and the peer.
KernelFigure Interleaved(const std::string& name, int rounds, const std::function<double()>& ours,
                         const std::function<absl::StatusOr<double>()>& peer,
                         const TorchPeer& tp, double goal, const std::string& note) {
  std::vector<double> a, b;
  const bool have_peer = !tp.python.empty();
  std::string err = have_peer ? "" : tp.missing;
  for (int r = 0; r < rounds; ++r) {
    a.push_back(ours());
    if (!have_peer) continue;
    auto p = peer();
    if (p.ok()) b.push_back(*p);
    else err = std::string(p.status().message());
  }
  std::optional<double> pv;
  if (!b.empty()) pv = Median(b);
  return {name, Median(a), pv, goal, true, "tokens/s", note, b.empty() ? err : ""};
}

}  // namespace

std::vector<KernelFigure> BenchLlama(const kernels::ExecContext& ctx, bool quick, int reps,
                                     int threads, const TorchPeer& peer) {
  std::vector<KernelFigure> out;
  const std::string& python = peer.python;
  // What every row says about the peer (its note is the row's `compared` text).
  const std::string compared = absl::StrCat(
      "compared: peer ", peer.python.empty() ? "PyTorch (not run: see the reason)" : peer.label,
      "; ", peer.ThreadsText());
  const int rounds = quick ? 1 : 3;
  const int kreps = quick ? 1 : std::max(reps, 3);
  // Llama-like attention shapes, scaled to a CPU: 4 query heads per kv head.
  const AttnShape rs = quick ? AttnShape{1, 64, 8, 2, 64} : AttnShape{4, 1024, 16, 4, 64};
  out.push_back(Interleaved(
      "rope_fwd_bwd_tokens_per_s", rounds, [&] { return OurRope(ctx, rs, kreps); },
      [&] { return RunTorchPeer(python, kRopePeer, rs.Args(kreps, threads), threads); }, peer, 1.0,
      rs.Text() + " q and k; peer: HF rotate_half with autograd; " + compared));
  const AttnShape gs = quick ? AttnShape{1, 128, 4, 2, 32} : AttnShape{2, 1024, 8, 2, 64};
  out.push_back(Interleaved(
      "gqa_attention_fwd_bwd_tokens_per_s", rounds, [&] { return OurGqa(ctx, gs, kreps); },
      [&] { return RunTorchPeer(python, kGqaPeer, gs.Args(kreps, threads), threads); }, peer, 1.0,
      gs.Text() + " causal; peer: F.scaled_dot_product_attention(is_causal, enable_gqa), autograd; " +
          compared));

  model::GptConfig c = model::LlamaConfig();
  c.vocab_size = 8192;
  c.context = 256;
  c.n_layer = 4;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.d_model = 256;
  if (quick) {
    c.vocab_size = 512;
    c.context = 32;
    c.n_layer = 1;
    c.d_model = 64;
  }
  const int64_t B = quick ? 2 : 4;
  const int steps = quick ? 1 : 3;
  int64_t peak = 0;
  const std::string args = absl::StrCat(c.vocab_size, " ", c.context, " ", c.n_layer, " ", c.n_head, " ",
                                        c.kv_heads(), " ", c.d_model, " ", c.ff(), " ", B, " ", steps, " ",
                                        threads);
  KernelFigure f = Interleaved(
      "llama_train_step_tokens_per_s", rounds, [&] { return TrainStep(ctx, c, B, steps, &peak); },
      [&] { return RunTorchPeer(python, LlamaPeerScript(), args, threads); }, peer, 1.5, "");
  f.note = absl::StrFormat("B=%d T=%d V=%d L=%d H=%d KV=%d C=%d F=%d untied, peak activations %.1f MiB; "
                           "peer: the same model in PyTorch (attention by "
                           "F.scaled_dot_product_attention), rounds interleaved; %s",
                           B, c.context, c.vocab_size, c.n_layer, c.n_head, c.kv_heads(), c.d_model,
                           c.ff(), peak / 1048576.0, compared);
  out.push_back(std::move(f));

  // The same step with the linear layers and the LM head in bf16 (ExecContext::bf16_linear, what
  // precision.param_dtype: bf16 runs on CPUs with bf16 instructions) against fp32, interleaved;
  // only where the CPU has bf16 instructions.
  const kernels::Bf16GemmSupport& bs = kernels::Bf16GemmInfo();
  const std::string cpu = absl::StrCat("CPU: ", bs.cpu, ", ", threads, " threads");
  if (bs.native) {
    kernels::ExecContext bf16 = ctx;
    bf16.bf16_linear = true;
    std::vector<double> v32, v16;
    const int bf16_rounds = quick ? 1 : 4;
    for (int r = 0; r < bf16_rounds; ++r) {
      for (int k = 0; k < 2; ++k) {  // alternating which side goes first
        if ((r + k) % 2 == 0) v32.push_back(TrainStep(ctx, c, B, steps, &peak));
        else v16.push_back(TrainStep(bf16, c, B, steps, &peak));
      }
    }
    out.push_back({"llama_train_step_bf16_linear_vs_fp32", Median(v16), Median(v32), std::nullopt,
                   true, "tokens/s",
                   absl::StrCat("the Llama step above with the linears and the LM head in bf16 "
                                "(inputs rounded, fp32 accumulation; attention fp32) vs fp32, ", bf16_rounds,
                                " rounds of one each, alternating which goes first; ", cpu),
                   ""});
  }  // else no row: the report's meta `bf16_gemm` says why
  return out;
}

}  // namespace ember::bench
