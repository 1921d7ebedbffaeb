// The GPU TrainState (cuda_trainer.h), in its own library so that only ember-worker-cuda links the
// CUDA kernels, cuBLAS and NCCL: linked into the CPU ember-worker they cost every rank ~95 MiB of
// private memory at start. Linking this file registers it (SetCudaState) before main.
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cuda/cuda_ops.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/comm_driver.h"
#include "runtime/comm/process_group.h"
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
#ifdef EMBER_CUDA_LOOP_INTERP
#include "runtime/comm/cpu_comm_driver.h"
#endif

namespace ember::worker {
namespace {

#ifdef EMBER_CUDA_LOOP_INTERP  // built against //kernels/cuda:cuda_interp (ember-worker-cuda-interp)
constexpr bool kInterpreted = true;
#else
constexpr bool kInterpreted = false;
#endif

// This rank's rows of the host mirror (a world-W FsdpGpt: each shard is rows
// [row_begin, row_begin + rows) of its parameter, as on cpu ranks) in Gpt's flat layout
// (ParamSpecs order): `offset` is where the shard's first element sits in the flat vector.
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
    const int64_t global_rows = v == nullptr || v->row_numel <= 0 ? -1 : ps.numel() / v->row_numel;
    if (v == nullptr || global_rows * v->row_numel != ps.numel() || v->row_begin < 0 || v->rows < 0 ||
        v->row_begin + v->rows > global_rows) {
      return absl::InternalError(absl::StrCat("cuda: the host model's shard of ", ps.name,
                                              " is not a row range of the parameter"));
    }
    out.push_back({v->param, v->exp_avg, v->exp_avg_sq, offset + v->row_begin * v->row_numel,
                   v->rows * v->row_numel});
    offset += ps.numel();
  }
  return out;
}

// Copies the host mirror's parameters and AdamW state to the GPU (to_gpu) or back. The GPU holds
// every parameter whole (replicated on every rank); the host mirror this rank's rows. To the GPU:
// each rank writes its rows into zeroed full-size vectors and a sum over `world` (host memory, the
// cpu backend) assembles them: every element has exactly one non-zero contribution, so the sum is
// exact. Back: each rank copies its own rows out of its replica (no communication; the replicas
// are equal, having applied the same all-reduced gradients). `world` null: one rank.
absl::Status Sync(fsdp::FsdpGpt& host, model::GptCuda& gpu, comm::ProcessGroup* world, bool to_gpu) {
  ASSIGN_OR_RETURN(std::vector<FlatShard> flat, FlatLayout(host));
  const int64_t n = gpu.num_params();
  if (to_gpu) {
    std::vector<float> pmv(3 * n, 0.0f);
    float *p = pmv.data(), *m = p + n, *v = m + n;
    for (const FlatShard& f : flat) {
      std::copy(f.param, f.param + f.numel, p + f.offset);
      std::copy(f.exp_avg, f.exp_avg + f.numel, m + f.offset);
      std::copy(f.exp_avg_sq, f.exp_avg_sq + f.numel, v + f.offset);
    }
    if (world != nullptr && world->size() > 1) {
      comm::OpOptions o;
      o.tag = "cuda.sync_device";
      RETURN_IF_ERROR(base::Annotate(
          world->AllReduce(pmv.data(), pmv.size(), comm::DataType::kF32, comm::ReduceOp::kSum, o)->Wait(),
          "assembling the parameters and AdamW state from every rank's rows for the GPU"));
    }
    RETURN_IF_ERROR(gpu.UploadParams(p, n));
    return gpu.UploadOptimizerState(m, v, n, host.optimizer_step());
  }
  std::vector<float> p(n), m(n), v(n);
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

// The device group's communicator library: the cpu communicator driver (a strict fake of NCCL's
// non-blocking communicators, runtime/comm/cpu_comm_driver.h) on the interpreter, whose device
// memory is host memory; NCCL (null: MakeNcclDriver, runtime/comm/nccl_driver.cc) on a GPU.
// `stream`: the stream the policy requires for device ops (a current stream, never the legacy
// one): a driver-owned fake stream on the interpreter (GptCuda synchronises its own stream after
// every call, so the gradients are final before the all-reduce is submitted), the context's
// stream on a GPU (the communicator's stream then waits on it, as NCCL needs).
struct DeviceComm {
  std::shared_ptr<comm::CommDriver> driver;
  void* stream = nullptr;
};

absl::StatusOr<DeviceComm> MakeDeviceComm(const Plan& plan, const Groups& groups,
                                          kernels::cuda::CudaContext& ctx) {
  DeviceComm d;
#ifdef EMBER_CUDA_LOOP_INTERP
  (void)ctx;
  comm::BackendOptions base;  // transport options of the cpu communicators (shm / tcp, local host)
  comm::FakeNcclOptions fake;  // strict: a policy violation aborts the process, loudly
  fake.seed = static_cast<uint64_t>(plan.env.rank) + 1;  // the ranks draw "in progress" differently
  auto driver = std::make_shared<comm::CpuCommDriver>(groups.rdzv, base, fake);
  d.stream = driver->NewStream("cuda.grads");
  d.driver = std::move(driver);
#else
  (void)plan;
  (void)groups;
  d.stream = ctx.stream();
#endif
  return d;
}

// Sets the calling thread's current stream (comm::SetCurrentStream) for its lifetime.
class CurrentStream {
 public:
  explicit CurrentStream(void* s) : saved_(comm::CurrentStream()) { comm::SetCurrentStream(s); }
  ~CurrentStream() { comm::SetCurrentStream(saved_); }

 private:
  void* const saved_;
};

// The GPU step (GptCuda, fp32) with its host mirror (world-W FsdpGpt, see cuda_trainer.h). On W > 1
// ranks: data parallel, replicated -- every rank holds the whole model, its gradients and AdamW
// state on its device; each step's gradients (of loss / W) are summed by one all-reduce over the
// device group (backend parallelism.backend: nccl or nccl-lazy) before clipping and AdamW, which
// every rank then runs on the same values.
class CudaState final : public TrainState {
 public:
  static absl::StatusOr<std::unique_ptr<TrainState>> Make(const Plan& plan, const Groups& groups) {
    namespace cu = kernels::cuda;
    ASSIGN_OR_RETURN(int device, CudaDeviceIndex(plan.env.device));
    // Emulated GPUs: each process's interpreter is its own single device 0; cuda:N (a daemon
    // placing N emulated GPUs, `emberctl run --standalone --emulate-gpus`) names which GPU of the
    // node this rank stands for.
    if (kInterpreted) device = 0;
    absl::StatusOr<std::unique_ptr<cu::CudaContext>> ctx = cu::CudaContext::Create(device);
    if (!ctx.ok()) {
      // Not UNAVAILABLE: that reads as a peer's death (Train would wait for a stop decision).
      return absl::FailedPreconditionError(absl::StrCat(job::kEnvDevice, "=", plan.env.device, ": cannot use the GPU (",
                                                        ctx.status().message(), "); run the job with device cpu"));
    }
    std::unique_ptr<CudaState> s(new CudaState(plan, groups.world.get()));
    s->ctx_ = std::move(*ctx);
    ASSIGN_OR_RETURN(s->host_, fsdp::FsdpGpt::Create(plan.model, {groups.world.get(), nullptr}, plan.fsdp));
    ASSIGN_OR_RETURN(s->gpu_, model::GptCuda::Create(plan.model, *s->ctx_));
    if (plan.env.world_size > 1) RETURN_IF_ERROR(s->ConnectGradGroup(plan, groups));
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
    const std::string dp = plan.env.world_size > 1
                               ? absl::StrCat(", data parallel over ", plan.env.world_size, " ranks (replicated; "
                                              "gradients all-reduced on the device, ", plan.spec.parallelism().backend(), ")")
                               : "";
    if (kInterpreted) {
      spdlog::warn("training on {} (GptCuda, fp32{}) on the CUDA interpreter: an emulated GPU on the CPU "
                   "(ember-worker-cuda-interp, a test build; {}=1)", plan.env.device, dp, job::kEnvEmulateGpus);
    } else {
      spdlog::info("training on {} (GptCuda, fp32{})", plan.env.device, dp);
    }
    return std::unique_ptr<TrainState>(std::move(s));
  }

  ~CudaState() override {
    grads_.reset();  // before the driver and its streams
#ifdef EMBER_CUDA_LOOP_INTERP
    if (auto* fake = dynamic_cast<comm::CpuCommDriver*>(comm_.driver.get())) {
      spdlog::info("cuda.grads on the cpu communicator driver (the NCCL fake): {} calls returned in progress "
                   "and were polled to completion", fake->InProgressCount());
    }
#endif
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
    // Gradients of loss / W: the all-reduced sum is then the mean over ranks (cpu FSDP sums and
    // scales by 1 / W; for W a power of two the two are the same floats).
    const int world = plan_.env.world_size;
    ASSIGN_OR_RETURN(const float loss, gpu_->ForwardBackward(tok_.data(), tgt_.data(), B, T, 1.0f / world));
    absl::Duration comm_wait;
    if (grads_ != nullptr) {
      const absl::Time c0 = absl::Now();
      CurrentStream on(comm_.stream);
      comm::OpOptions o;
      o.tag = "cuda.grad_all_reduce";
      std::shared_ptr<comm::Work> w = grads_->AllReduce(gpu_->grad_arena(), gpu_->grad_arena_floats(),
                                                        comm::DataType::kF32, comm::ReduceOp::kSum, o);
      // block_host: AdamW's kernels run next on the context's stream; on the interpreter nothing but
      // the host orders them after the communicator's stream.
      RETURN_IF_ERROR(base::Annotate(w->Wait(absl::InfiniteDuration(), /*block_host=*/true),
                                     "all-reduce of the gradients on the device"));
      comm_wait = absl::Now() - c0;
      fsdp::CommBytes bytes;
      bytes.all_reduce["f32"] = gpu_->grad_arena_floats() * int64_t{sizeof(float)};
      SetCommBytes(bytes, &r);
    }
    kernels::AdamWOptions opt = plan_.fsdp.adamw;
    opt.lr = lr;
    ASSIGN_OR_RETURN(const double grad_norm, gpu_->AdamWStep(opt, plan_.fsdp.clip_norm));
    if (plan_.fsdp.clip_norm > 0) r.set_grad_norm(grad_norm);  // GptCuda computes it only to clip
    // The loss averaged over every rank (host, the world group), as cpu FSDP reports it.
    ASSIGN_OR_RETURN(const double mean_loss, host_->AllReduceMean(loss));
    r.set_loss(mean_loss);
    r.set_local_loss(loss);
    r.set_step_s(absl::ToDoubleSeconds(absl::Now() - t0));
    if (grads_ != nullptr) {
      r.set_comm_wait_s(absl::ToDoubleSeconds(comm_wait));
      r.set_comm_memory_bytes(static_cast<int64_t>(grads_->CommMemoryBytes()));  // the loop adds its groups'
    }
    const kernels::cuda::AllocatorStats mem = ctx_->allocator().stats();
    r.set_device_memory_bytes(mem.allocated_bytes);
    r.set_device_peak_memory_bytes(mem.peak_allocated_bytes);
    if (peak_.ok()) r.set_mfu(flops_per_token_ * TokensPerStep(plan_) / r.step_s() / peak_->flops);
    return r;
  }

  std::vector<fsdp::ShardView> Shards() override { return host_->Shards(); }
  absl::Status SyncHost() override { return Sync(*host_, *gpu_, world_, /*to_gpu=*/false); }
  absl::Status SyncDevice() override { return Sync(*host_, *gpu_, world_, /*to_gpu=*/true); }
  int64_t optimizer_step() const override { return host_->optimizer_step(); }
  void set_optimizer_step(int64_t s) override { host_->set_optimizer_step(s); }
  // The device's: parameters, gradients and both AdamW moments, whole on every rank (fp32).
  int64_t state_bytes() const override { return 4 * gpu_->grad_arena_floats() * int64_t{sizeof(float)}; }
  // World 1: FSDP on one rank is the whole model. More ranks: data parallel, replicated on the
  // devices (not FSDP: nothing is sharded on the GPU); the checkpoint's rows are the host mirror's
  // FSDP rows of that world, so it resumes on cpu ranks as a resharded checkpoint.
  std::pair<std::string, std::string> Layout() const override {
    if (plan_.env.world_size == 1) return {"fsdp", "1"};
    return {"dp_replicated", absl::StrCat(plan_.env.world_size)};
  }
  absl::StatusOr<double> AllReduceMean(double v) override { return host_->AllReduceMean(v); }
  const model::GptConfig& config() const override { return plan_.model; }

 private:
  CudaState(const Plan& plan, comm::ProcessGroup* world)
      : plan_(plan), world_(world), peak_(absl::UnknownError("")) {}

  // The device group "cuda.grads" over every rank: the NCCL policy backend (parallelism.backend,
  // nccl or nccl-lazy, CheckCudaPlan) on this rank's device over the communicator library of
  // MakeDeviceComm.
  absl::Status ConnectGradGroup(const Plan& plan, const Groups& groups) {
    if (groups.rdzv == nullptr) {
      return absl::InternalError("cuda: no rendezvous for the device group (Groups::rdzv unset)");
    }
    ASSIGN_OR_RETURN(comm_, MakeDeviceComm(plan, groups, *ctx_));
    comm::GroupOptions go;
    go.name = "cuda.grads";
    go.backend = plan.spec.parallelism().backend();
    go.device = plan.env.device;
    go.comm_driver = comm_.driver;
    go.timeout = absl::Seconds(plan.spec.collective_timeout_s());
    go.global_rank = plan.env.rank;
    go.dump_dir = plan.env.fr_dump_dir;
    go.recorder = groups.recorder;  // a hung all-reduce shows in the attempt's flight dumps
    absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> g =
        comm::ProcessGroup::Create(groups.rdzv, plan.env.rank, plan.env.world_size, go);
    if (!g.ok()) {
      return base::Annotate(g.status(), absl::StrCat("the device group for the gradients (parallelism.backend '",
                                                     go.backend, "' on ", plan.env.device, ")"));
    }
    grads_ = std::move(*g);
    return absl::OkStatus();
  }

  const Plan& plan_;
  comm::ProcessGroup* const world_;
  std::unique_ptr<kernels::cuda::CudaContext> ctx_;
  std::unique_ptr<fsdp::FsdpGpt> host_;
  std::unique_ptr<model::GptCuda> gpu_;
  DeviceComm comm_;
  std::unique_ptr<comm::ProcessGroup> grads_;  // world > 1 only
  double flops_per_token_ = 0;
  absl::StatusOr<model::DevicePeak> peak_;
  std::vector<int32_t> tok_, tgt_;
};

const bool kRegistered = (SetCudaState(&CudaState::Make, kInterpreted), true);
}  // namespace

}  // namespace ember::worker
