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
#include "runtime/worker/train_state.h"
#include "spdlog/spdlog.h"

#if defined(EMBER_CUDA_LOOP_INTERP)
// :cuda_loop_interp. By path: <cuda_runtime_api.h> would find the toolkit's first (:worker's
// runtime/base:devices brings @local_cuda's include path), so the interpreter's calls must be named.
#include "kernels/cuda/interp/include/cuda_runtime_api.h"
#elif defined(EMBER_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace ember::worker {
namespace {

#ifdef EMBER_CUDA_LOOP_INTERP  // built against //kernels/cuda:cuda_interp (ember-worker-cuda-interp)
constexpr bool kInterpreted = true;
#else
constexpr bool kInterpreted = false;
#endif

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
  for (const model::ParamSpec& ps : host.model().ParamSpecs()) {
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

namespace {

// The GPU step (GptCuda, fp32) with its host mirror (world-1 FsdpGpt, see cuda_trainer.h).
class CudaState final : public TrainState {
 public:
  static absl::StatusOr<std::unique_ptr<TrainState>> Make(const Plan& plan, const Groups& groups) {
    namespace cu = kernels::cuda;
    ASSIGN_OR_RETURN(int device, CudaDeviceIndex(plan.env.device));
    absl::StatusOr<std::unique_ptr<cu::CudaContext>> ctx = cu::CudaContext::Create(device);
    if (!ctx.ok()) {
      // Not UNAVAILABLE: that reads as a peer's death (Train would wait for a stop decision).
      return absl::FailedPreconditionError(absl::StrCat(job::kEnvDevice, "=", plan.env.device, ": cannot use the GPU (",
                                                        ctx.status().message(), "); run the job with device cpu"));
    }
    std::unique_ptr<CudaState> s(new CudaState(plan));
    s->ctx_ = std::move(*ctx);
    ASSIGN_OR_RETURN(s->host_, fsdp::FsdpGpt::Create(plan.model, {groups.world.get(), nullptr}, plan.fsdp));
    ASSIGN_OR_RETURN(s->gpu_, model::GptCuda::Create(plan.model, *s->ctx_));
    // MFU in the progress line: model FLOPs per token x tokens/s over the dense bf16 peak (the
    // issue's yardstick, although this step still computes in fp32).
    s->flops_per_token_ = model::TrainingFlopsPerToken(plan.model, plan.model.context);
    // The interpreter describes itself as an H100; an MFU against that peak would mean nothing.
    s->peak_ = kInterpreted ? absl::NotFoundError("an emulated GPU (the CUDA interpreter) has no peak")
                            : PeakOf(*s->ctx_);
    if (s->peak_.ok()) {
      spdlog::info("mfu: {:.4g} model FLOPs per token (6N + 12LHQS, docs/model.md) over the {}'s dense "
                   "bf16 peak {:.1f} TFLOP/s ({}); the step computes in fp32",
                   s->flops_per_token_, s->peak_->model, s->peak_->flops / 1e12, s->peak_->source);
    } else {
      spdlog::info("mfu left out of the progress line: {}", std::string(s->peak_.status().message()));
    }
    if (kInterpreted) {
      spdlog::warn("training on {} (GptCuda, fp32) on the CUDA interpreter: an emulated GPU on the CPU "
                   "(ember-worker-cuda-interp, a test build; {}=1)", plan.env.device, job::kEnvEmulateGpus);
    } else {
      spdlog::info("training on {} (GptCuda, fp32)", plan.env.device);
    }
    return std::unique_ptr<TrainState>(std::move(s));
  }

  absl::StatusOr<StepResult> Step(const kernels::ExecContext&, data::TokenLoader& loader, int64_t step,
                                  float lr) override {
    const int64_t B = plan_.spec.batch_size(), T = plan_.model.context;
    tok_.resize(B * T);
    tgt_.resize(B * T);
    StepResult r;
    r.set_step(step);
    r.set_lr(lr);
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(loader.Next(tok_.data(), tgt_.data()));
    RETURN_IF_ERROR(gpu_->ZeroGrad());
    ASSIGN_OR_RETURN(float loss, gpu_->ForwardBackward(tok_.data(), tgt_.data(), B, T));
    kernels::AdamWOptions opt = plan_.fsdp.adamw;
    opt.lr = lr;
    ASSIGN_OR_RETURN(const double grad_norm, gpu_->AdamWStep(opt, plan_.fsdp.clip_norm));
    if (plan_.fsdp.clip_norm > 0) r.set_grad_norm(grad_norm);  // GptCuda computes it only to clip
    r.set_loss(loss);
    r.set_local_loss(loss);
    r.set_step_s(absl::ToDoubleSeconds(absl::Now() - t0));
    const kernels::cuda::AllocatorStats mem = ctx_->allocator().stats();
    r.set_device_memory_bytes(mem.allocated_bytes);
    r.set_device_peak_memory_bytes(mem.peak_allocated_bytes);
    if (peak_.ok()) r.set_mfu(flops_per_token_ * TokensPerStep(plan_) / r.step_s() / peak_->flops);
    return r;
  }

  std::vector<fsdp::ShardView> Shards() override { return host_->Shards(); }
  absl::Status SyncHost() override { return Sync(*host_, *gpu_, /*to_gpu=*/false); }
  absl::Status SyncDevice() override { return Sync(*host_, *gpu_, /*to_gpu=*/true); }
  int64_t optimizer_step() const override { return host_->optimizer_step(); }
  void set_optimizer_step(int64_t s) override { host_->set_optimizer_step(s); }
  int64_t state_bytes() const override { return host_->state_bytes(); }
  std::pair<std::string, std::string> Layout() const override { return {"fsdp", "1"}; }
  absl::StatusOr<double> AllReduceMean(double v) override { return host_->AllReduceMean(v); }
  const model::GptConfig& config() const override { return plan_.model; }

 private:
  explicit CudaState(const Plan& plan) : plan_(plan), peak_(absl::UnknownError("")) {}

  const Plan& plan_;
  std::unique_ptr<kernels::cuda::CudaContext> ctx_;
  std::unique_ptr<fsdp::FsdpGpt> host_;
  std::unique_ptr<model::GptCuda> gpu_;
  double flops_per_token_ = 0;
  absl::StatusOr<model::DevicePeak> peak_;
  std::vector<int32_t> tok_, tgt_;
};

const bool kRegistered = (SetCudaState(&CudaState::Make, kInterpreted), true);
}  // namespace

}  // namespace ember::worker
