// The spec -> model/optimizer settings of ember-worker (trainer.h). The environment's tests are in
// runtime/job/job_test.cc.
#include "runtime/model/from_spec.h"
#include "runtime/worker/trainer.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/gemm.h"
#include "runtime/base/devices.h"
#include "runtime/job/env.h"

namespace ember::worker {
namespace {

// One table of defaults (docs/model.md): what an empty spec trains is exactly the code's
// defaults, GptConfig{}, AdamWOptions{} and LceOptions{}.
TEST_CASE("the job spec's defaults are the model's, the loss's and the optimizer's", "[worker]") {
  spec::JobSpec s;
  s.set_name("d");
  spec::ApplyDefaults(&s);
  REQUIRE(spec::ValidateJobSpec(s).ok());
  auto c = model::ConfigFromSpec(s);
  REQUIRE(c.ok());
  const model::GptConfig g;
  CHECK(c->vocab_size == g.vocab_size);
  CHECK(c->context == g.context);
  CHECK(c->n_layer == g.n_layer);
  CHECK(c->n_head == g.n_head);
  CHECK(c->d_model == g.d_model);
  CHECK(c->mlp == g.mlp);
  CHECK(c->d_ff == g.d_ff);
  CHECK(c->window == g.window);
  CHECK(c->init_std == g.init_std);
  CHECK(c->norm_eps == g.norm_eps);
  CHECK(c->loss.label_smoothing == g.loss.label_smoothing);
  CHECK(c->loss.z_loss == g.loss.z_loss);
  CHECK(c->loss.ignore_index == g.loss.ignore_index);
  CHECK(c->arch == g.arch);
  CHECK(c->kv_heads() == g.kv_heads());
  CHECK(c->tie_embeddings == g.tie_embeddings);
  // arch: llama defaults are model::LlamaConfig()'s.
  {
    spec::JobSpec l;
    l.set_name("l");
    l.mutable_model()->set_arch("llama");
    spec::ApplyDefaults(&l);
    auto lc = model::ConfigFromSpec(l);
    REQUIRE(lc.ok());
    const model::GptConfig want = model::LlamaConfig();
    CHECK(lc->arch == want.arch);
    CHECK(lc->mlp == want.mlp);
    CHECK(lc->tie_embeddings == want.tie_embeddings);
    CHECK(lc->kv_heads() == want.kv_heads());
    CHECK(lc->rope_theta == want.rope_theta);
    CHECK(lc->rope_scaling.llama3 == want.rope_scaling.llama3);
    l.mutable_model()->mutable_rope_scaling()->set_type("llama3");
    spec::ApplyDefaults(&l);
    lc = model::ConfigFromSpec(l);
    REQUIRE(lc.ok());
    const kernels::RopeScaling r;  // Llama 3.1's values
    CHECK(lc->rope_scaling.llama3);
    CHECK(lc->rope_scaling.factor == r.factor);
    CHECK(lc->rope_scaling.low_freq_factor == r.low_freq_factor);
    CHECK(lc->rope_scaling.high_freq_factor == r.high_freq_factor);
    CHECK(lc->rope_scaling.original_max_position == r.original_max_position);
  }
  s.mutable_model()->set_mlp("moe");
  spec::ApplyDefaults(&s);
  c = model::ConfigFromSpec(s);
  REQUIRE(c.ok());
  CHECK(c->n_expert == g.n_expert);
  CHECK(c->top_k == g.top_k);
  const kernels::AdamWOptions a = AdamWOptionsFor(s), k;
  CHECK(a.lr == k.lr);
  CHECK(a.beta1 == k.beta1);
  CHECK(a.beta2 == k.beta2);
  CHECK(a.eps == k.eps);
  CHECK(a.weight_decay == k.weight_decay);
}

TEST_CASE("learning-rate schedule: warmup, constant, cosine floor", "[worker]") {
  spec::JobSpec s;
  s.set_steps(100);
  s.mutable_optimizer()->set_lr(1.0f);
  s.mutable_optimizer()->set_warmup_steps(10);
  s.mutable_optimizer()->set_schedule("constant");
  s.mutable_optimizer()->set_min_lr_ratio(0.1f);
  CHECK(LearningRate(s, 5) == Approx(0.5));
  CHECK(LearningRate(s, 50) == Approx(1.0));
  s.mutable_optimizer()->set_schedule("cosine");
  CHECK(LearningRate(s, 10) == Approx(1.0));
  CHECK(LearningRate(s, 55) == Approx(0.55));
  CHECK(LearningRate(s, 100) == Approx(0.1));
}

// Prepare() on a job directory holding tokens.bin (ids 0..299, made with `tok`) and a spec.
// `top` adds top-level spec lines, `model` model fields; `base` is the environment (job dirs set here).
absl::StatusOr<Plan> PreparePlan(const std::string& name, const data::TokenizerInfo* tok, const std::string& yaml,
                                 int vocab = 384, const std::string& model = "", const std::string& top = "",
                                 job::WorkerEnv base = {}) {
  const char* t = getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(t ? t : "/tmp", "/", name);
  REQUIRE(system(("mkdir -p " + dir).c_str()) == 0);
  std::ofstream f(dir + "/tokens.bin", std::ios::binary);
  if (tok != nullptr) f << data::TokenFileHeader(data::TokenDtype::kU16, 3000, *tok);
  for (int i = 0; i < 3000; ++i) {
    const uint16_t v = static_cast<uint16_t>(i % 300);
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
  f.close();
  std::ofstream(dir + "/job.yaml") << "name: t\ndata: {path: tokens.bin" << yaml << "}\n"
                                   << "model: {vocab_size: " << vocab << ", context_length: 16" << model << "}\n"
                                   << top;
  job::WorkerEnv env = base;
  env.job_dir = env.upload_dir = dir;
  return Prepare(env, "");
}

absl::Status PrepareWith(const std::string& name, const data::TokenizerInfo* tok, const std::string& yaml,
                         int vocab = 384, const std::string& model = "", const std::string& top = "",
                         job::WorkerEnv base = {}) {
  return PreparePlan(name, tok, yaml, vocab, model, top, base).status();
}

TEST_CASE("bf16 linears: param_dtype bf16, no fp32-kept matrix, and a CPU with bf16 instructions", "[worker]") {
  auto decide = [](const std::string& name, const std::string& precision, std::string* why) {
    auto plan = PreparePlan(name, nullptr, "", 384, "", precision);
    REQUIRE(plan.ok());
    return Bf16LinearFor(*plan, why);
  };
  std::string why;
  CHECK_FALSE(decide("bf16_f32", "", &why));  // f32 by default
  // bf16 with fp32 norms (1-D): the CPU decides, and the line says so.
  const bool on = decide("bf16_on", "precision: {param_dtype: bf16, overrides: [{pattern: \"*ln*\", param_dtype: f32}]}\n", &why);
  CHECK(on == kernels::HasNativeBf16Gemm());
  CHECK(absl::StrContains(why, on ? "linear layers compute in bf16" : "linear layers compute in fp32"));
  CHECK(absl::StrContains(why, kernels::Bf16GemmInfo().reason));
  // A matrix kept in fp32 keeps the whole job on fp32 GEMMs, on any CPU, naming it.
  CHECK_FALSE(decide("bf16_kept", "precision: {param_dtype: bf16, overrides: [{pattern: \"*.attn.qkv.weight\", param_dtype: f32}]}\n", &why));
  CHECK(absl::StrContains(why, "keeps the matrix blocks.0.attn.qkv.weight out of bf16"));
}

TEST_CASE("the worker refuses a vocab_size below the tokenizer's and another tokenizer", "[worker]") {
  const std::string sha(64, 'a');
  const data::TokenizerInfo spm{"sentencepiece", sha, 384, "spm.model"};
  CHECK(PrepareWith("ok", &spm, "").ok());
  CHECK(PrepareWith("ok_named", &spm, ", tokenizer: {kind: sentencepiece, sha256: " + sha + "}").ok());
  absl::Status s = PrepareWith("small", &spm, "", 256);
  CHECK(absl::StrContains(s.message(), "model.vocab_size: 256 is below the 384 tokens of"));
  CHECK(absl::StrContains(s.message(), "sentencepiece (sha256 aaaaaaaaaaaa..., vocab 384, spm.model)"));
  s = PrepareWith("kind", &spm, ", tokenizer: {kind: bytes}");
  CHECK(absl::StrContains(s.message(), "data.tokenizer.kind: 'bytes', but data.path"));
  s = PrepareWith("sha", &spm, ", tokenizer: {kind: sentencepiece, sha256: " + std::string(64, 'b') + "}");
  CHECK(absl::StrContains(s.message(), "data.tokenizer.sha256: bbbb"));
  CHECK(absl::StrContains(s.message(), "was made with the model of sha256 aaaa"));
  s = PrepareWith("old", nullptr, ", tokenizer: {kind: sentencepiece}");
  CHECK(absl::StrContains(s.message(), "records no tokenizer"));
  CHECK(PrepareWith("old_unchecked", nullptr, "").ok());  // headerless files train as before
}

// EMBER_DEVICE cuda:N (cuda_trainer.h): one rank or data parallel over several with an nccl
// backend, fp32, no HSDP, no MoE, head size 32 or 64; else exit 2 naming the field. A build without
// CUDA refuses every cuda job, naming EMBER_DEVICE.
TEST_CASE("Prepare accepts fp32 cuda jobs on one or more ranks and refuses what the GPU step lacks", "[worker][cuda]") {
  job::WorkerEnv gpu;
  gpu.device = "cuda:0";
  const std::string ok_model = ", d_model: 64, n_heads: 2";  // head size 32
  auto prep = [&](const std::string& name, const std::string& model, const std::string& top,
                  job::WorkerEnv env) { return PrepareWith(name, nullptr, "", 384, model, top, env); };
  absl::Status s = prep("cuda_ok", ok_model, "", gpu);
  if (!base::BuiltWithCuda()) {
    CHECK(absl::IsInvalidArgument(s));
    CHECK(absl::StrContains(s.message(), absl::StrCat(job::kEnvDevice, ": 'cuda:0': this ember-worker was built without CUDA")));
    return;
  }
  CHECK(s.ok());
  // (backend nccl runs on device_type cuda only: Resolve refuses the mismatch, as Submit does)
  CHECK(prep("cuda_fsdp1", ok_model, "parallelism: {strategy: fsdp, backend: nccl}\nresources: {device_type: cuda}\n", gpu).ok());
  CHECK(prep("cuda_llama", ", arch: llama, d_model: 128, n_heads: 2, n_kv_heads: 1, mlp: swiglu", "", gpu).ok());
  CHECK(prep("cuda_clip", ok_model, "optimizer: {grad_clip: 1.0, schedule: cosine, warmup_steps: 2}\n", gpu).ok());
  // The same spec on cpu: still accepted, and a head size the GPU lacks is fine there.
  CHECK(prep("cpu_h16", ", d_model: 32, n_heads: 2", "", {}).ok());
  job::WorkerEnv two = gpu;
  two.world_size = two.local_world_size = 2;
  // More ranks: data parallel, the gradients all-reduced on the device with nccl or nccl-lazy.
  CHECK(prep("cuda_w2", ok_model, "parallelism: {strategy: fsdp}\nresources: {device_type: cuda}\n", two).ok());
  CHECK(prep("cuda_w2_lazy", ok_model, "parallelism: {strategy: fsdp, backend: nccl-lazy}\nresources: {device_type: cuda}\n", two).ok());
  s = prep("cuda_w2_cpu", ok_model, "parallelism: {strategy: fsdp}\n", two);
  CHECK(absl::StrContains(s.message(), "parallelism.backend: 'cpu' with " + std::string(job::kEnvWorldSize) + "=2 on cuda:0: GPU ranks all-reduce their gradients on the device with nccl or nccl-lazy"));
  s = prep("cuda_w2_legacy", ok_model, "parallelism: {strategy: fsdp, backend: nccl-legacy}\nresources: {device_type: cuda}\n", two);
  CHECK(absl::StrContains(s.message(), "parallelism.backend: 'nccl-legacy' with "));
  job::WorkerEnv four = gpu;
  four.world_size = four.local_world_size = 4;
  s = prep("cuda_hsdp", ok_model, "parallelism: {strategy: fsdp, dp_replicate: 2}\n", four);
  CHECK(absl::StrContains(s.message(), "parallelism.dp_replicate: 2 on cuda:0: GPU training has no HSDP"));
  s = prep("cuda_hsdp_spec", ok_model, "parallelism: {strategy: fsdp, dp_replicate: 2}\nresources: {device_type: cuda}\n", four);
  CHECK(absl::StrContains(s.message(), "parallelism.dp_replicate: 2 on cuda: GPU training has no HSDP"));
  s = prep("cuda_h16", ", d_model: 32, n_heads: 2", "", gpu);
  CHECK(absl::StrContains(s.message(), "model.n_heads: head size d_model / n_heads = 32 / 2 = 16 on cuda:0"));
  CHECK(absl::StrContains(s.message(), "supports head sizes 32 and 64"));
  s = prep("cuda_moe", ok_model + ", mlp: moe, moe_experts: 4, moe_top_k: 2", "", gpu);
  CHECK(absl::StrContains(s.message(), "model.mlp: 'moe' on cuda:0: the GPU step has no MoE"));
  s = prep("cuda_bf16", ok_model, "precision: {param_dtype: bf16}\n", gpu);
  CHECK(absl::StrContains(s.message(), "precision: on cuda:0 GPU training is fp32 only"));
  s = prep("cuda_mb", ok_model, "parallelism: {micro_batches: 2}\n", gpu);
  CHECK(absl::StrContains(s.message(), "parallelism.micro_batches: 2 on cuda:0: GPU training supports 1 micro-batch"));
  s = prep("cuda_pub", ok_model, "publish: {every_steps: 2}\n", gpu);
  CHECK(absl::StrContains(s.message(), "publish.every_steps: 2 on cuda:0"));
  job::WorkerEnv bad = gpu;
  bad.device = "cuda:x";
  s = prep("cuda_bad", ok_model, "", bad);
  CHECK(absl::StrContains(s.message(), absl::StrCat(job::kEnvDevice, ": 'cuda:x': want cpu or cuda:N")));
}

}  // namespace
}  // namespace ember::worker
