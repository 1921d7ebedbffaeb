// The llama arch against an independent float64 implementation of docs/model.md (RMSNorm, RoPE
// with interleaved pairs, grouped-query causal/windowed attention, SwiGLU, untied or tied head,
// mean cross-entropy): the loss, and every parameter's gradient as a float64 directional
// derivative of the reference. Also parameter names/shapes and learning.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/model/gpt.h"

namespace ember::model {
namespace {

using kernels::ExecContext;
using kernels::ThreadPool;
using V = std::vector<double>;

GptConfig TinyLlama(int64_t kv, int64_t window, bool tie, bool llama3) {
  GptConfig c = LlamaConfig();
  c.vocab_size = 29;
  c.context = 12;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = kv;
  c.d_model = 32;
  c.d_ff = 40;
  c.window = window;
  c.tie_embeddings = tie;
  c.rope_theta = 100.0f;  // large angles at small T, so a wrong rotation shows
  if (llama3) {
    c.rope_scaling.llama3 = true;
    c.rope_scaling.factor = 4;
    c.rope_scaling.original_max_position = 8;  // all three frequency bands at hd 8
  }
  c.init_std = 0.3f;
  return c;
}

// Float64 reference of docs/model.md for the llama arch. params[i] follows ParamSpecs(cfg).
struct Ref {
  GptConfig c;
  std::vector<double> inv_freq;  // float32 frequencies (kernels::RopeInvFreq), as documented

  double Loss(const std::vector<V>& p, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt,
              int64_t B, int64_t T) const {
    const int64_t C = c.d_model, H = c.n_head, KV = c.kv_heads(), hd = C / H, F = c.ff(), Vv = c.vocab_size;
    const int64_t Q = (H + 2 * KV) * hd, N = B * T;
    auto rms = [&](const V& x, const V& w) {
      V y(x.size());
      for (int64_t n = 0; n < N; ++n) {
        double ss = 0;
        for (int64_t k = 0; k < C; ++k) ss += x[n * C + k] * x[n * C + k];
        const double r = 1 / std::sqrt(ss / C + double(c.norm_eps));
        for (int64_t k = 0; k < C; ++k) y[n * C + k] = x[n * C + k] * r * w[k];
      }
      return y;
    };
    auto linear = [&](const V& x, const V& W, int64_t in, int64_t out) {
      V y(N * out, 0.0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < out; ++o) {
          double s = 0;
          for (int64_t i = 0; i < in; ++i) s += x[n * in + i] * W[o * in + i];
          y[n * out + o] = s;
        }
      return y;
    };
    size_t pi = 0;
    const V& wte = p[pi++];
    V x(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < C; ++k) x[n * C + k] = wte[tok[n] * C + k];
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const V &ln1 = p[pi], &wqkv = p[pi + 1], &wproj = p[pi + 2], &ln2 = p[pi + 3], &fc1 = p[pi + 4],
               &fc2 = p[pi + 5];
      pi += 6;
      V qkv = linear(rms(x, ln1), wqkv, C, Q);
      for (int64_t n = 0; n < N; ++n) {
        const double t = n % T;
        for (int64_t h = 0; h < H + KV; ++h)  // q heads then k heads
          for (int64_t i = 0; i < hd / 2; ++i) {
            double* e = &qkv[n * Q + h * hd + 2 * i];
            const double a = t * inv_freq[i], x0 = e[0], x1 = e[1];
            e[0] = x0 * std::cos(a) - x1 * std::sin(a);
            e[1] = x0 * std::sin(a) + x1 * std::cos(a);
          }
      }
      V att(N * C, 0.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t g = h / (H / KV);
          for (int64_t t = 0; t < T; ++t) {
            const double* q = &qkv[(b * T + t) * Q + h * hd];
            V s(T, -1e300);
            double mx = -1e300, z = 0;
            for (int64_t j = 0; j <= t; ++j) {
              if (c.window > 0 && t - j >= c.window) continue;
              const double* k = &qkv[(b * T + j) * Q + (H + g) * hd];
              double d = 0;
              for (int64_t i = 0; i < hd; ++i) d += q[i] * k[i];
              s[j] = d / std::sqrt(double(hd));
              mx = std::max(mx, s[j]);
            }
            for (int64_t j = 0; j <= t; ++j) if (s[j] > -1e299) z += std::exp(s[j] - mx);
            for (int64_t j = 0; j <= t; ++j) {
              if (s[j] <= -1e299) continue;
              const double w = std::exp(s[j] - mx) / z;
              const double* v = &qkv[(b * T + j) * Q + (H + KV + g) * hd];
              for (int64_t i = 0; i < hd; ++i) att[(b * T + t) * C + h * hd + i] += w * v[i];
            }
          }
        }
      V proj = linear(att, wproj, C, C);
      for (int64_t i = 0; i < N * C; ++i) x[i] += proj[i];
      V u = linear(rms(x, ln2), fc1, C, 2 * F), act(N * F);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t f = 0; f < F; ++f) {
          const double a = u[n * 2 * F + f], up = u[n * 2 * F + F + f];
          act[n * F + f] = a / (1 + std::exp(-a)) * up;
        }
      V m = linear(act, fc2, F, C);
      for (int64_t i = 0; i < N * C; ++i) x[i] += m[i];
    }
    const V& lnf = p[pi++];
    const V& head = c.tie_embeddings ? wte : p[pi++];
    V logits = linear(rms(x, lnf), head, C, Vv);
    double loss = 0;
    for (int64_t n = 0; n < N; ++n) {
      double mx = -1e300, z = 0;
      for (int64_t v = 0; v < Vv; ++v) mx = std::max(mx, logits[n * Vv + v]);
      for (int64_t v = 0; v < Vv; ++v) z += std::exp(logits[n * Vv + v] - mx);
      loss += mx + std::log(z) - logits[n * Vv + tgt[n]];
    }
    return loss / N;
  }
};

TEST_CASE("llama parameter names and shapes (GQA, untied head, no wpe)") {
  GptConfig c = TinyLlama(2, 0, false, false);
  auto specs = ParamSpecs(c);
  REQUIRE(specs.size() == 1 + 6 * 2 + 2);
  CHECK(specs[0].name == "wte.weight");
  CHECK(specs[1].name == "blocks.0.ln1.weight");
  CHECK(specs[2].name == "blocks.0.attn.qkv.weight");
  CHECK(specs[2].shape == std::vector<int64_t>{(4 + 2 * 2) * 8, 32});
  CHECK(specs[3].shape == std::vector<int64_t>{32, 32});
  CHECK(specs[5].shape == std::vector<int64_t>{80, 32});
  CHECK(specs[6].shape == std::vector<int64_t>{32, 40});
  CHECK(specs[13].name == "ln_f.weight");
  CHECK(specs[14].name == "lm_head.weight");
  CHECK(specs[14].shape == std::vector<int64_t>{29, 32});
  CHECK(RootParamNames(c) == std::vector<std::string>{"wte.weight", "ln_f.weight", "lm_head.weight"});
  c.tie_embeddings = true;
  CHECK(ParamSpecs(c).back().name == "ln_f.weight");
  c.n_kv_head = 3;
  CHECK(c.Validate().message().find("n_kv_head = 3") != std::string::npos);
  GptConfig g;
  g.n_kv_head = 2;
  CHECK(g.Validate().message().find("needs arch llama") != std::string::npos);
}

TEST_CASE("llama loss and gradients match a float64 reference") {
  ThreadPool pool(2);
  ExecContext ctx{&pool, true};
  struct Case { int64_t kv, window; bool tie, llama3; };
  for (Case cs : {Case{2, 0, false, false}, Case{1, 5, true, true}, Case{4, 0, false, true}}) {
    const GptConfig c = TinyLlama(cs.kv, cs.window, cs.tie, cs.llama3);
    INFO("kv " << cs.kv << " window " << cs.window << " tie " << cs.tie << " llama3 " << cs.llama3);
    auto m = *Gpt::Create(c, 3);
    const int64_t B = 2, T = 12;
    std::mt19937 rng(4);
    std::vector<int32_t> tok(B * T), tgt(B * T);
    for (auto& t : tok) t = rng() % c.vocab_size;
    for (auto& t : tgt) t = rng() % c.vocab_size;
    m->ZeroGrad();
    auto loss = m->ForwardBackward(ctx, tok.data(), tgt.data(), B, T);
    REQUIRE(loss.ok());
    Ref ref{c, {}};
    for (float f : kernels::RopeInvFreq(c.head_dim(), c.rope_theta, c.rope_scaling)) ref.inv_freq.push_back(f);
    std::vector<V> p;
    for (size_t i = 0; i < m->specs().size(); ++i)
      p.emplace_back(m->param(i), m->param(i) + m->specs()[i].numel());
    const double want = ref.Loss(p, tok, tgt, B, T);
    CHECK(std::fabs(*loss - want) <= 1e-5 * want);
    std::normal_distribution<double> nd;
    for (size_t i = 0; i < p.size(); ++i) {
      V u(p[i].size());
      for (auto& v : u) v = nd(rng);
      double gu = 0;
      for (size_t j = 0; j < u.size(); ++j) gu += double(m->grad(i)[j]) * u[j];
      const V p0 = p[i];
      auto at = [&](double h) {
        for (size_t j = 0; j < u.size(); ++j) p[i][j] = p0[j] + h * u[j];
        return ref.Loss(p, tok, tgt, B, T);
      };
      const double h = 1e-4, fd = (at(h) - at(-h)) / (2 * h);
      p[i] = p0;
      INFO(m->specs()[i].name << " analytic " << gu << " float64 " << fd);
      CHECK(std::fabs(gu - fd) <= 1e-3 * std::fabs(fd) + 1e-5);
    }
  }
}

TEST_CASE("llama with MoE and a window trains; its loss falls") {
  GptConfig c = TinyLlama(2, 6, false, false);
  c.mlp = GptConfig::Mlp::kMoe;
  c.n_expert = 3;
  c.init_std = 0.02f;
  auto m = *Gpt::Create(c, 1);
  kernels::AdamWOptions o;
  o.lr = 1e-2f;
  AdamW adam(o, m->num_params());
  ThreadPool pool(2);
  ExecContext ctx{&pool, true};
  std::vector<int32_t> tok(4 * 12), tgt(4 * 12);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((i * 7) % c.vocab_size);
    tgt[i] = static_cast<int32_t>((i * 7 + 7) % c.vocab_size);
  }
  float first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    m->ZeroGrad();
    last = *m->ForwardBackward(ctx, tok.data(), tgt.data(), 4, 12);
    if (s == 0) first = last;
    adam.Step(ctx, *m);
  }
  CHECK(last < 0.3f * first);
}

}  // namespace
}  // namespace ember::model
