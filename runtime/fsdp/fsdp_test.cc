// FSDP in one process: ranks are threads, process groups bootstrap through a file rendezvous and
// talk over the cpu backend (shm/TCP loopback), exactly as separate processes would.
#include "runtime/fsdp/fsdp.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/comm/rendezvous.h"

namespace ember::fsdp {
namespace {

using comm::DataType;

// Set by the llama test case: TinyConfig() is then a Llama (RoPE, one kv head, untied head).
bool g_llama = false;

// Odd sizes so that torch.chunk pads at 4 ranks: vocab 67, context 19, width 36.
model::GptConfig TinyConfig() {
  model::GptConfig c = g_llama ? model::LlamaConfig() : model::GptConfig();
  if (g_llama) c.n_kv_head = 1;
  c.vocab_size = 67;
  c.context = 19;
  c.n_layer = 2;
  c.n_head = 3;
  c.d_model = 36;
  return c;
}

kernels::AdamWOptions Adam() {
  kernels::AdamWOptions o;
  o.lr = 3e-3f;
  o.weight_decay = 0.1f;
  return o;
}

// Global batch of step `s`: GB sequences of T+1 tokens with a learnable pattern.
std::vector<int32_t> GlobalBatch(int s, int GB, int T, int V) {
  std::vector<int32_t> out(GB * (T + 1));
  uint64_t x = 1234567 + s * 7919;
  for (int b = 0; b < GB; ++b) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int32_t t = static_cast<int32_t>((x >> 33) % V);
    for (int i = 0; i <= T; ++i) {
      out[b * (T + 1) + i] = t;
      t = (t * 5 + 3) % V;
    }
  }
  return out;
}

// Sequences [first, first + n) of a global batch as tokens/targets [n, T].
void Slice(const std::vector<int32_t>& gb, int T, int first, int n, std::vector<int32_t>* tok,
           std::vector<int32_t>* tgt) {
  tok->resize(n * T);
  tgt->resize(n * T);
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < T; ++i) {
      (*tok)[b * T + i] = gb[(first + b) * (T + 1) + i];
      (*tgt)[b * T + i] = gb[(first + b) * (T + 1) + i + 1];
    }
}

std::string FreshDir() {
  static int n = 0;
  const char* d = getenv("TEST_TMPDIR");
  return absl::StrCat(d ? d : "/tmp", "/rdzv-", getpid(), "-", n++);
}

// HSDP in RunRanks: with g_replicas > 1, world / g_replicas consecutive ranks shard the rows and
// the g_replicas groups all-reduce their gradient shards.
int g_replicas = 1;
// kernels::ExecContext::bf16_linear of every rank in RunRanks (the trainer's setting for
// precision.param_dtype: bf16 on CPUs with bf16 instructions).
bool g_bf16_linear = false;

struct RankCtx {
  int rank;
  FsdpGpt* model;
  const kernels::ExecContext* ctx;
};

// Runs fn on `world` thread-ranks, each with its own groups and FsdpGpt. Errors come back as
// strings (Catch2 assertions are not thread-safe).
std::vector<std::string> RunRanks(int world, const model::GptConfig& cfg, const FsdpOptions& opts,
                                  bool separate_rs, const std::function<std::string(RankCtx)>& fn) {
  const std::string dir = FreshDir();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto rdzv = comm::MakeFileRendezvous(dir);
      comm::GroupOptions go;
      go.timeout = absl::Seconds(60);
      go.bootstrap_timeout = absl::Seconds(30);
      go.name = "world";
      auto pg = comm::ProcessGroup::Create(rdzv, r, world, go);
      if (!pg.ok()) { errors[r] = pg.status().ToString(); return; }
      std::unique_ptr<comm::ProcessGroup> rs;
      if (separate_rs) {
        go.name = "rs";
        auto g = comm::ProcessGroup::Create(rdzv, r, world, go);
        if (!g.ok()) { errors[r] = g.status().ToString(); return; }
        rs = std::move(*g);
      }
      std::unique_ptr<comm::ProcessGroup> shard, replicate;
      if (g_replicas > 1) {
        const int per = world / g_replicas;
        auto sg = (*pg)->Split(r / per, r % per, absl::StrCat("shard", r / per));
        if (!sg.ok()) { errors[r] = sg.status().ToString(); return; }
        auto rg = (*pg)->Split(r % per, r / per, absl::StrCat("replicate", r % per));
        if (!rg.ok()) { errors[r] = rg.status().ToString(); return; }
        shard = std::move(*sg);
        replicate = std::move(*rg);
        rs.reset();  // the separate reduce-scatter group must have the shard group's ranks
      }
      auto m = FsdpGpt::Create(cfg, {pg->get(), rs.get(), shard.get(), replicate.get()}, opts);
      if (!m.ok()) { errors[r] = m.status().ToString(); return; }
      kernels::ThreadPool pool(1);
      kernels::ExecContext ctx{&pool, true};
      ctx.bf16_linear = g_bf16_linear;
      errors[r] = fn({r, m->get(), &ctx});
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Trains `steps` steps on a global batch of 4 sequences split over the ranks (and micro-batches);
// returns the global mean loss per step (identical on every rank).
std::vector<double> Train(int world, const FsdpOptions& opts, bool separate_rs, int steps,
                          int micro = 1, std::vector<CommBytes>* bytes = nullptr,
                          std::vector<int64_t>* state = nullptr) {
  const model::GptConfig cfg = TinyConfig();
  const int GB = 4, T = 16, per_rank = GB / world / micro;
  std::vector<std::vector<double>> losses(world);
  if (bytes) bytes->assign(world, {});
  if (state) state->assign(world, 0);
  auto errors = RunRanks(world, cfg, opts, separate_rs, [&](RankCtx rc) -> std::string {
    std::vector<int32_t> tok, tgt;
    for (int s = 0; s < steps; ++s) {
      auto gb = GlobalBatch(s, GB, T, static_cast<int>(cfg.vocab_size));
      double loss = 0;
      for (int k = 0; k < micro; ++k) {
        Slice(gb, T, (k * world + rc.rank) * per_rank, per_rank, &tok, &tgt);
        auto l = rc.model->ForwardBackward(*rc.ctx, tok.data(), tgt.data(), per_rank, T, k == micro - 1);
        if (!l.ok()) return l.status().ToString();
        loss += *l / micro;
      }
      auto mean = rc.model->AllReduceMean(loss);
      if (!mean.ok()) return mean.status().ToString();
      losses[rc.rank].push_back(*mean);
      if (s == 0 && bytes) (*bytes)[rc.rank] = rc.model->comm_bytes();
      auto n = rc.model->OptimizerStep(*rc.ctx, Adam().lr);
      if (!n.ok()) return n.status().ToString();
    }
    if (state) (*state)[rc.rank] = rc.model->state_bytes();
    return "";
  });
  for (const auto& e : errors) REQUIRE(e == "");
  for (int r = 1; r < world; ++r) REQUIRE(losses[r] == losses[0]);
  return losses[0];
}

FsdpOptions Fp32() {
  FsdpOptions o;
  o.adamw = Adam();
  o.seed = 42;
  o.clip_norm = 1.0;
  return o;
}

FsdpOptions Bf16FpNorms(std::optional<DataType> reduce = std::nullopt) {
  FsdpOptions o = Fp32();
  o.mp.param_dtype = DataType::kBF16;
  o.mp.reduce_dtype = reduce;
  o.mp.overrides.push_back({"*ln*", DataType::kF32, std::nullopt});
  return o;
}

void CheckClose(const std::vector<double>& a, const std::vector<double>& b, double rel) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i << ": " << a[i] << " vs " << b[i]);
    CHECK(std::abs(a[i] - b[i]) <= rel * std::abs(b[i]));
  }
}

TEST_CASE("torch.chunk sharding and policy resolution", "[fsdp]") {
  CHECK(ShardRows(10, 4, 0) == std::make_pair<int64_t, int64_t>(0, 3));
  CHECK(ShardRows(10, 4, 3) == std::make_pair<int64_t, int64_t>(9, 10));
  CHECK(ShardRows(2, 4, 1) == std::make_pair<int64_t, int64_t>(1, 2));
  CHECK(ShardRows(2, 4, 3) == std::make_pair<int64_t, int64_t>(2, 2));  // past the end: empty
  CHECK(GlobMatch("*ln*", "blocks.0.ln1.weight"));
  CHECK(GlobMatch("blocks.?.attn.*", "blocks.3.attn.qkv.weight"));
  CHECK_FALSE(GlobMatch("*.gate.weight", "blocks.0.moe.gate.bias"));
  MixedPrecisionPolicy mp{DataType::kBF16, std::nullopt, DataType::kBF16, {{"*ln*", DataType::kF32, std::nullopt}}};
  CHECK(mp.Resolve("ln_f.weight").param_dtype == DataType::kF32);
  CHECK(mp.Resolve("ln_f.weight").reduce_dtype == DataType::kF32);
  CHECK(mp.Resolve("wte.weight").reduce_dtype == DataType::kBF16);
  mp.reduce_dtype = DataType::kF32;
  CHECK(mp.Resolve("wte.weight").reduce_dtype == DataType::kF32);
  CHECK(!ParseFloatDtype("precision.param_dtype", "f8").ok());
}

// Losses of the unsharded model (TinyConfig(), seed 42, AdamW with clipping) over `steps` steps.
std::vector<double> Unsharded(int steps) {
  auto gpt = *model::Gpt::Create(TinyConfig(), 42);
  model::AdamW adam(Adam(), gpt->num_params(), 1.0);
  kernels::ThreadPool pool(1);
  kernels::ExecContext ctx{&pool, true};
  std::vector<double> ref;
  std::vector<int32_t> tok, tgt;
  for (int s = 0; s < steps; ++s) {
    auto gb = GlobalBatch(s, 4, 16, 67);
    Slice(gb, 16, 0, 4, &tok, &tgt);
    gpt->ZeroGrad();
    ref.push_back(*gpt->ForwardBackward(ctx, tok.data(), tgt.data(), 4, 16));
    adam.Step(ctx, *gpt);
  }
  return ref;
}

TEST_CASE("one rank matches the unsharded model with AdamW", "[fsdp]") {
  const std::vector<double> ref = Unsharded(8);
  CheckClose(Train(1, Fp32(), false, 8), ref, 1e-5);
  CHECK(ref.back() < ref.front());
}

TEST_CASE("llama (RoPE, GQA, untied head): 1 rank matches the unsharded model, 2 and 4 ranks match 1", "[fsdp]") {
  g_llama = true;
  const auto names = model::RootParamNames(TinyConfig());
  CHECK(names == std::vector<std::string>{"wte.weight", "ln_f.weight", "lm_head.weight"});
  const std::vector<double> ref = Unsharded(10);
  CHECK(ref.back() < 0.9 * ref.front());
  CheckClose(Train(1, Fp32(), false, 10), ref, 1e-5);
  CheckClose(Train(2, Fp32(), true, 10), ref, 1e-5);
  CheckClose(Train(4, Fp32(), true, 10), ref, 1e-5);
  g_llama = false;
}

TEST_CASE("1, 2 and 4 ranks give the same fp32 losses; overlap settings are bitwise neutral", "[fsdp]") {
  const int steps = 20;
  auto one = Train(1, Fp32(), false, steps);
  CHECK(one.back() < 0.8 * one.front());  // it learns
  CheckClose(Train(2, Fp32(), true, steps), one, 1e-5);
  std::vector<int64_t> state1, state4;
  Train(1, Fp32(), false, 1, 1, nullptr, &state1);
  auto four = Train(4, Fp32(), true, steps, 1, nullptr, &state4);
  CheckClose(four, one, 1e-5);
  // Params + grads + AdamW state per rank at 4 ranks vs 1 rank (padding included).
  for (int64_t s : state4) CHECK(static_cast<double>(s) <= 0.30 * state1[0]);

  FsdpOptions off = Fp32();
  off.prefetch = false;
  off.reshard_after_forward = false;
  CHECK(Train(2, off, false, 6) == Train(2, Fp32(), true, 6));
}

TEST_CASE("HSDP 2x2 (rows sharded in pairs, gradients all-reduced across the pairs) matches one rank", "[fsdp]") {
  const int steps = 20;
  std::vector<int64_t> state1, state_hsdp;
  auto one = Train(1, Fp32(), false, steps, 1, nullptr, &state1);
  struct Reset { ~Reset() { g_replicas = 1; } } reset;  // also when a REQUIRE fails
  g_replicas = 2;
  auto hsdp = Train(4, Fp32(), true, steps, 1, nullptr, &state_hsdp);
  CheckClose(hsdp, one, 1e-5);
  // Each rank holds half of the state (sharded over 2), not a quarter (FSDP over 4) or all of it.
  for (int64_t s : state_hsdp) {
    CHECK(static_cast<double>(s) <= 0.55 * state1[0]);
    CHECK(static_cast<double>(s) >= 0.45 * state1[0]);
  }
}

TEST_CASE("gradient accumulation matches one big micro-batch", "[fsdp]") {
  std::vector<CommBytes> b1, b2;
  auto big = Train(2, Fp32(), true, 6, 1, &b1);
  auto acc = Train(2, Fp32(), true, 6, 2, &b2);
  CheckClose(acc, big, 1e-5);
  // One reduce-scatter per step, not one per micro-batch.
  CHECK(b2[0].reduce_scatter == b1[0].reduce_scatter);
  CHECK(b2[0].all_gather.at("f32") == 2 * b1[0].all_gather.at("f32"));
}

// Analytic bytes per step for `opts` at `world` ranks: every parameter is gathered for the forward
// and again for the backward (root and the last block once), and reduce-scattered once.
CommBytes Expected(const FsdpOptions& opts, int world) {
  const model::GptConfig cfg = TinyConfig();
  CommBytes e;
  for (const auto& s : model::ParamSpecs(cfg)) {
    const int64_t numel = world * ChunkRows(s.shape[0], world) * (s.numel() / s.shape[0]);
    const ParamPrecision p = opts.mp.Resolve(s.name);
    const bool once = s.name.rfind("blocks.", 0) != 0 ||
                      s.name.rfind(absl::StrCat("blocks.", cfg.n_layer - 1, "."), 0) == 0;
    e.all_gather[comm::DTypeName(p.param_dtype)] += (once ? 1 : 2) * numel * comm::DTypeSize(p.param_dtype);
    e.reduce_scatter[comm::DTypeName(p.reduce_dtype)] += numel * comm::DTypeSize(p.reduce_dtype);
  }
  e.all_reduce["f64"] = 8;  // the loss mean (the norm all-reduce comes after the snapshot)
  return e;
}

TEST_CASE("bf16 policy with fp32 norms: bytes, tolerance, fp32 params never pass through bf16", "[fsdp]") {
  for (int world : {2, 4}) {
    for (auto reduce : {std::optional<DataType>(), std::optional<DataType>(DataType::kF32)}) {
      std::vector<CommBytes> b;
      Train(world, Bf16FpNorms(reduce), true, 1, 1, &b);
      const CommBytes e = Expected(Bf16FpNorms(reduce), world);
      CHECK(b[0].all_gather == e.all_gather);
      CHECK(b[0].reduce_scatter == e.reduce_scatter);
      CHECK(b[0].all_reduce == e.all_reduce);
      if (!reduce) {
        // PyTorch would reduce every mixed block and the root entirely in fp32.
        int64_t rs = 0;
        for (const auto& [k, v] : b[0].reduce_scatter) rs += v;
        CHECK(static_cast<double>(rs) <= 0.6 * b[0].reduce_scatter_promoted);
      }
    }
  }
  auto f32 = Train(2, Fp32(), true, 20);
  auto bf16 = Train(2, Bf16FpNorms(), true, 20);
  CheckClose(bf16, f32, 2e-2);  // stated tolerance: 2% after 20 steps

  {
    // bf16 linear GEMMs (GemmBf16: oneDNN where the CPU has bf16 instructions, widened sgemm
    // elsewhere; the activations entering each linear are rounded to bf16 as well).
    struct Reset {
      ~Reset() { g_bf16_linear = false; }
    } reset;
    g_bf16_linear = true;
    auto bf16_gemm = Train(2, Bf16FpNorms(), true, 20);
    CheckClose(bf16_gemm, f32, 2e-3);  // stated bound: 0.2% of fp32 after 20 steps (seen: 1e-4)
    // ... and the bf16 GEMMs really ran: the losses differ from the rounding-only run.
    double diff = 0;
    for (size_t i = 0; i < bf16.size(); ++i) diff = std::max(diff, std::abs(bf16_gemm[i] - bf16[i]));
    INFO("max |bf16 GEMM loss - bf16 rounding-only loss| = " << diff);
    CHECK(diff > 1e-6);
    g_bf16_linear = false;
  }

  // Bitwise: at 2 ranks the reduced fp32 gradient must equal g0 + g1 exactly (IEEE addition of
  // two values is commutative), and the gathered fp32 norm weight must equal the master shards.
  FsdpOptions o = Bf16FpNorms();
  o.keep_debug_copies = true;
  std::vector<std::vector<float>> ln_gathered(2), ln_red(2), qkv_gathered(2), ln_local(2), qkv_red(2);
  std::vector<std::vector<float>> ln_master(2);
  const std::string ln = "blocks.1.ln2.weight", qkv = "blocks.1.attn.qkv.weight";
  // Step 1 moves the norm weights off their all-ones init; step 2's gathered values and reduced
  // gradients are compared with the master shards and each rank's local unsharded gradient.
  auto errors = RunRanks(2, TinyConfig(), o, true, [&](RankCtx rc) -> std::string {
    std::vector<int32_t> tok, tgt;
    auto gb = GlobalBatch(0, 4, 16, 67);
    Slice(gb, 16, rc.rank * 2, 2, &tok, &tgt);
    for (int s = 0; s < 2; ++s) {
      if (auto l = rc.model->ForwardBackward(*rc.ctx, tok.data(), tgt.data(), 2, 16, true); !l.ok())
        return l.status().ToString();
      if (s == 0) {
        if (auto n = rc.model->OptimizerStep(*rc.ctx, 1e-2f); !n.ok()) return n.status().ToString();
      }
    }
    ln_gathered[rc.rank] = rc.model->TEST_gathered(ln);
    qkv_gathered[rc.rank] = rc.model->TEST_gathered(qkv);
    ln_red[rc.rank] = rc.model->TEST_reduced(ln);
    ln_local[rc.rank] = rc.model->TEST_local_grad(ln);
    qkv_red[rc.rank] = rc.model->TEST_reduced(qkv);
    for (const auto& v : rc.model->Shards())
      if (v.name == ln) ln_master[rc.rank].assign(v.param, v.param + v.rows * v.row_numel);
    return "";
  });
  for (const auto& e : errors) REQUIRE(e == "");
  std::vector<float> masters = ln_master[0];
  masters.insert(masters.end(), ln_master[1].begin(), ln_master[1].end());
  REQUIRE(ln_gathered[0].size() == masters.size());
  CHECK(std::memcmp(ln_gathered[0].data(), masters.data(), masters.size() * 4) == 0);
  CHECK(ln_gathered[0] == ln_gathered[1]);
  bool ln_has_non_bf16 = false;
  for (float x : masters) ln_has_non_bf16 |= base::Bf16ToF32(base::F32ToBf16(x)) != x;
  CHECK(ln_has_non_bf16);  // so bitwise equality above really proves fp32 transport
  for (float x : qkv_gathered[0]) REQUIRE(base::Bf16ToF32(base::F32ToBf16(x)) == x);
  bool red_non_bf16 = false;
  const int64_t C = TinyConfig().d_model, c = ChunkRows(C, 2);
  REQUIRE(ln_local[0].size() == static_cast<size_t>(C));
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < c; ++i) {
      const float want = ln_local[0][r * c + i] + ln_local[1][r * c + i];
      CHECK(std::memcmp(&ln_red[r][i], &want, 4) == 0);
      red_non_bf16 |= base::Bf16ToF32(base::F32ToBf16(ln_red[r][i])) != ln_red[r][i];
    }
    for (float x : qkv_red[r]) REQUIRE(base::Bf16ToF32(base::F32ToBf16(x)) == x);  // bf16 path
  }
  CHECK(red_non_bf16);
}

// Issue 11: collectives small enough to run inline on the caller's thread (<= 256 KiB, all of this
// model's) block inside the issuing call, not in Wait(); comm_wait() must count that time. Rank 1
// arrives 300 ms late, so rank 0's first all-gather blocks ~300 ms on the training thread.
TEST_CASE("comm wait counts collectives that run inline on the caller's thread", "[fsdp]") {
  std::vector<double> wait_s(2, 0);
  auto errors = RunRanks(2, TinyConfig(), FsdpOptions(), false, [&](RankCtx rc) -> std::string {
    std::vector<int32_t> tok, tgt;
    auto gb = GlobalBatch(0, 4, 16, 67);
    Slice(gb, 16, rc.rank * 2, 2, &tok, &tgt);
    if (rc.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    rc.model->ResetCommWait();
    if (auto l = rc.model->ForwardBackward(*rc.ctx, tok.data(), tgt.data(), 2, 16, true); !l.ok())
      return l.status().ToString();
    wait_s[rc.rank] = absl::ToDoubleSeconds(rc.model->comm_wait());
    return "";
  });
  for (const auto& e : errors) REQUIRE(e == "");
  CHECK(wait_s[0] >= 0.25);
}

}  // namespace
}  // namespace ember::fsdp
