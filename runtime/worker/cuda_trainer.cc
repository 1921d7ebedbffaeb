#include "runtime/worker/cuda_trainer.h"

#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cuda/cuda_ops.h"
#include "runtime/base/devices.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/env.h"
#include "runtime/jobspec/pipeline_layout.h"
#include "runtime/model/gpt_cuda.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The host mirror's shards in Gpt's flat layout (ParamSpecs order): world 1, so each shard is the
// whole parameter.
struct FlatShard {
  float* param;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t offset, numel;
};

absl::StatusOr<std::vector<FlatShard>> FlatLayout(fsdp::FsdpGpt& host) {
  std::vector<fsdp::ShardView> shards = host.Shards();
  std::vector<FlatShard> out;
  int64_t offset = 0;
  for (const model::ParamSpec& ps : model::ParamSpecs(host.config())) {
    const fsdp::ShardView* v = nullptr;
    for (const fsdp::ShardView& s : shards)
      if (s.name == ps.name) v = &s;
    if (v == nullptr || v->row_begin != 0 || v->rows * v->row_numel != ps.numel()) {
      return absl::InternalError(absl::StrCat("cuda: the host model's shard of ", ps.name,
                                              " is not the whole parameter (world must be 1)"));
    }
    out.push_back({v->param, v->exp_avg, v->exp_avg_sq, offset, ps.numel()});
    offset += ps.numel();
  }
  return out;
}

// Copies the host mirror's parameters and AdamW state to the GPU (to_gpu) or back.
absl::Status Sync(fsdp::FsdpGpt& host, model::GptCuda& gpu, bool to_gpu) {
  ASSIGN_OR_RETURN(std::vector<FlatShard> flat, FlatLayout(host));
  const int64_t n = gpu.num_params();
  std::vector<float> p(n), m(n), v(n);
  if (to_gpu) {
    for (const FlatShard& f : flat) {
      std::copy(f.param, f.param + f.numel, p.data() + f.offset);
      std::copy(f.exp_avg, f.exp_avg + f.numel, m.data() + f.offset);
      std::copy(f.exp_avg_sq, f.exp_avg_sq + f.numel, v.data() + f.offset);
    }
    RETURN_IF_ERROR(gpu.UploadParams(p.data(), n));
    return gpu.UploadOptimizerState(m.data(), v.data(), n, host.optimizer_step());
  }
  RETURN_IF_ERROR(gpu.DownloadParams(p.data(), n));
  RETURN_IF_ERROR(gpu.DownloadOptimizerState(m.data(), v.data(), n));
  for (const FlatShard& f : flat) {
    std::copy(p.data() + f.offset, p.data() + f.offset + f.numel, f.param);
    std::copy(m.data() + f.offset, m.data() + f.offset + f.numel, f.exp_avg);
    std::copy(v.data() + f.offset, v.data() + f.offset + f.numel, f.exp_avg_sq);
  }
  host.set_optimizer_step(gpu.optimizer_step());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> CudaDeviceIndex(const std::string& device) {
  if (device == "cuda") return 0;
  if (!absl::StartsWith(device, "cuda:")) return -1;
  int n = -1;
  if (!absl::SimpleAtoi(device.substr(5), &n) || n < 0) {
    return Bad(job::kEnvDevice, absl::StrCat("'", device, "': want cpu or cuda:N with N a device index >= 0"));
  }
  return n;
}

absl::Status CheckCudaPlan(const Plan& p) {
  const spec::JobSpec& s = p.spec;
  const std::string dev = p.env.device;
  if (!base::BuiltWithCuda()) {
    return Bad(job::kEnvDevice, absl::StrCat("'", dev, "': this ember-worker was built without CUDA (no toolkit at "
                                             "configure time); use cpu, or a build with CUDA"));
  }
  if (p.env.world_size != 1) {
    return Bad("parallelism.world_size", absl::StrCat(job::kEnvWorldSize, "=", p.env.world_size, " on ", dev,
                                                      ": GPU training runs on one rank only (strategy none, or fsdp "
                                                      "with world_size 1); use 1 rank or device cpu"));
  }
  if (spec::PipelineLayoutOf(s).enabled()) {
    return Bad("parallelism.strategy", absl::StrCat("'", s.parallelism().strategy(), "' on ", dev,
                                                    ": GPU training supports strategy none or fsdp on one rank"));
  }
  if (s.parallelism().micro_batches() > 1) {
    return Bad("parallelism.micro_batches", absl::StrCat(s.parallelism().micro_batches(), " on ", dev,
                                                         ": GPU training supports 1 micro-batch per step"));
  }
  const fsdp::MixedPrecisionPolicy& mp = p.fsdp.mp;
  if (mp.param_dtype != fsdp::DataType::kF32 || mp.output_dtype != fsdp::DataType::kF32 ||
      (mp.reduce_dtype && *mp.reduce_dtype != fsdp::DataType::kF32) || !mp.overrides.empty()) {
    return Bad("precision", absl::StrCat("on ", dev, " GPU training is fp32 only (param, output and reduce "
                                         "dtype f32, no overrides); leave precision unset or use device cpu"));
  }
  if (s.publish().every_steps() > 0) {
    return Bad("publish.every_steps", absl::StrCat(s.publish().every_steps(), " on ", dev,
                                                   ": GPU training does not publish weights yet; use 0 or device cpu"));
  }
  if (p.model.mlp == model::GptConfig::Mlp::kMoe) {
    return Bad("model.mlp", absl::StrCat("'moe' on ", dev, ": the GPU step has no MoE; use gelu or swiglu, or device cpu"));
  }
  if (p.model.head_dim() != 32 && p.model.head_dim() != 64) {
    return Bad("model.n_heads", absl::StrCat("head size d_model / n_heads = ", p.model.d_model, " / ", p.model.n_head, " = ",
                                             p.model.head_dim(), " on ", dev, ": the CUDA attention supports head "
                                             "sizes 32 and 64; choose n_heads so, or use device cpu"));
  }
  return absl::OkStatus();
}

absl::Status CudaTrainLoop(const Plan& plan, fsdp::FsdpGpt& host, data::TokenLoader& loader,
                           int64_t step, Reporter& report, Checkpointer& checkpoints) {
  namespace cu = kernels::cuda;
  ASSIGN_OR_RETURN(int device, CudaDeviceIndex(plan.env.device));
  absl::StatusOr<std::unique_ptr<cu::CudaContext>> ctx = cu::CudaContext::Create(device);
  if (!ctx.ok()) {
    // Not UNAVAILABLE: that reads as a peer's death (Train would wait for a stop decision).
    return absl::FailedPreconditionError(absl::StrCat(job::kEnvDevice, "=", plan.env.device, ": cannot use the GPU (",
                                                      ctx.status().message(), "); run the job with device cpu"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::GptCuda> gpu, model::GptCuda::Create(plan.model, **ctx));
  RETURN_IF_ERROR(Sync(host, *gpu, /*to_gpu=*/true));
  const int64_t B = plan.spec.batch_size(), T = plan.model.context;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  spdlog::info("training on {} (GptCuda, fp32) from step {}", plan.env.device, step);
  report.Start();
  while (step < plan.spec.steps()) {
    ++step;
    StepResult r;
    r.step = step;
    r.lr = LearningRate(plan.spec, step);
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(loader.Next(tok.data(), tgt.data()));
    RETURN_IF_ERROR(gpu->ZeroGrad());
    ASSIGN_OR_RETURN(float loss, gpu->ForwardBackward(tok.data(), tgt.data(), B, T));
    kernels::AdamWOptions opt = plan.fsdp.adamw;
    opt.lr = r.lr;
    ASSIGN_OR_RETURN(r.grad_norm, gpu->AdamWStep(opt, plan.fsdp.clip_norm));
    if (plan.fsdp.clip_norm <= 0) r.grad_norm = std::nan("");  // GptCuda computes it only to clip
    r.loss = r.local_loss = loss;
    r.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!std::isfinite(r.loss)) return absl::InternalError(absl::StrCat("loss is ", r.loss, " at step ", step));
    const cu::AllocatorStats mem = (*ctx)->allocator().stats();
    r.device_memory_bytes = mem.allocated_bytes;
    r.device_peak_memory_bytes = mem.peak_allocated_bytes;
    r.checkpoint_save_s = checkpoints.last_save_seconds();
    if (report.Due(step)) RETURN_IF_ERROR(report.Report(r));
    if (checkpoints.Due(step)) {
      RETURN_IF_ERROR(Sync(host, *gpu, /*to_gpu=*/false));
      RETURN_IF_ERROR(checkpoints.Save(step));
    }
  }
  RETURN_IF_ERROR(checkpoints.Finish());
  report.Done(step);
  return absl::OkStatus();
}

}  // namespace ember::worker
