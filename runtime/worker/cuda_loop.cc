// CudaTrainLoop (cuda_trainer.h), in its own library so that only ember-worker-cuda links the CUDA
// kernels and cuBLAS: linked into the CPU ember-worker they cost every rank ~95 MiB of private memory
// at start. Linking this file registers the loop (SetCudaTrainLoop) before main.
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cuda/cuda_ops.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/env.h"
#include "runtime/model/flops.h"
#include "runtime/model/gpt_cuda.h"
#include "runtime/worker/cuda_trainer.h"
#include "spdlog/spdlog.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ember::worker {
namespace {


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

// The device's dense bf16 peak (runtime/model/flops.h), or NOT_FOUND saying why MFU is left out.
absl::StatusOr<model::DevicePeak> PeakOf(const kernels::cuda::CudaContext& ctx) {
  int major = -1, minor = -1;
#ifdef EMBER_WITH_CUDA
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device()) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx.device()) != cudaSuccess) {
    major = minor = -1;
  }
#endif
  return model::DenseBf16Peak(ctx.DeviceName(), major, minor);
}

}  // namespace

absl::Status CudaTrainLoopImpl(const Plan& plan, fsdp::FsdpGpt& host, data::TokenLoader& loader,
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
  // MFU in the progress line: model FLOPs per token x tokens/s over the dense bf16 peak (the issue's
  // yardstick, although this loop still computes in fp32).
  const double flops_per_token = model::TrainingFlopsPerToken(plan.model, T);
  const double tokens_per_step = TokensPerStep(plan);
  const absl::StatusOr<model::DevicePeak> peak = PeakOf(**ctx);
  if (peak.ok()) {
    spdlog::info("mfu: {:.4g} model FLOPs per token (6N + 12LHQS, docs/model.md) over the {}'s dense "
                 "bf16 peak {:.1f} TFLOP/s ({}); the step computes in fp32",
                 flops_per_token, peak->model, peak->flops / 1e12, peak->source);
  } else {
    spdlog::info("mfu left out of the progress line: {}", std::string(peak.status().message()));
  }
  report.Start();
  while (step < plan.spec.steps()) {
    ++step;
    StepResult r;
    r.set_step(step);
    r.set_lr(LearningRate(plan.spec, step));
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(loader.Next(tok.data(), tgt.data()));
    RETURN_IF_ERROR(gpu->ZeroGrad());
    ASSIGN_OR_RETURN(float loss, gpu->ForwardBackward(tok.data(), tgt.data(), B, T));
    kernels::AdamWOptions opt = plan.fsdp.adamw;
    opt.lr = r.lr();
    ASSIGN_OR_RETURN(const double grad_norm, gpu->AdamWStep(opt, plan.fsdp.clip_norm));
    if (plan.fsdp.clip_norm > 0) r.set_grad_norm(grad_norm);  // GptCuda computes it only to clip
    r.set_loss(loss);
    r.set_local_loss(loss);
    r.set_step_s(absl::ToDoubleSeconds(absl::Now() - t0));
    if (!std::isfinite(r.loss())) return absl::InternalError(absl::StrCat("loss is ", r.loss(), " at step ", step));
    const cu::AllocatorStats mem = (*ctx)->allocator().stats();
    r.set_device_memory_bytes(mem.allocated_bytes);
    r.set_device_peak_memory_bytes(mem.peak_allocated_bytes);
    if (peak.ok()) r.set_mfu(flops_per_token * tokens_per_step / r.step_s() / peak->flops);
    if (checkpoints.last_save_seconds() >= 0) r.set_checkpoint_save_s(checkpoints.last_save_seconds());
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

namespace {
const bool kRegistered = (SetCudaTrainLoop(&CudaTrainLoopImpl), true);
}  // namespace

}  // namespace ember::worker
