#include "runtime/worker/cuda_trainer.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/devices.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/env.h"
#include "runtime/jobspec/pipeline_layout.h"

namespace ember::worker {
namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
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
  ASSIGN_OR_RETURN(const bool emulate, EmulateGpusRequested());
  if (emulate && !CudaStateInterpreted()) {
    return Bad(job::kEnvEmulateGpus, absl::StrCat("1 with ", job::kEnvDevice, "=", dev, ": this ember-worker runs real GPUs only; "
                                             "emulated GPUs need ember-worker-cuda-interp (a test build with the "
                                             "CUDA interpreter, docs/gpu-testing.md); unset ", job::kEnvEmulateGpus));
  }
  if (!emulate && CudaStateInterpreted()) {
    return Bad(job::kEnvEmulateGpus, absl::StrCat("unset with ", job::kEnvDevice, "=", dev, ": this is "
                                             "ember-worker-cuda-interp, whose GPU is the CUDA interpreter on the CPU "
                                             "(a test build); set ", job::kEnvEmulateGpus, "=1 to mean that, or run "
                                             "ember-worker-cuda on a real GPU"));
  }
  if (!base::BuiltWithCuda() && !CudaStateInterpreted()) {
    return Bad(job::kEnvDevice, absl::StrCat("'", dev, "': this ember-worker was built without CUDA (no toolkit at "
                                             "configure time); use cpu, or a build with CUDA"));
  }
  if (spec::PipelineLayoutOf(s).enabled()) {
    return Bad("parallelism.strategy", absl::StrCat("'", s.parallelism().strategy(), "' on ", dev,
                                                    ": GPU training supports strategy none (one rank) or fsdp "
                                                    "(data parallel, replicated on the GPUs)"));
  }
  if (p.dp_replicate > 1) {
    return Bad("parallelism.dp_replicate", absl::StrCat(p.dp_replicate, " on ", dev, ": GPU training has no HSDP; "
                                                        "its ranks already hold replicas (data parallel, gradients "
                                                        "all-reduced on the GPUs); use 0 or device cpu"));
  }
  if (p.env.world_size > 1) {
    // The gradients' all-reduce runs on the NCCL policy backend (runtime/comm/device_backend.h),
    // one device per process.
    const std::string& b = s.parallelism().backend();
    if (b != "nccl" && b != "nccl-lazy") {
      return Bad("parallelism.backend", absl::StrCat("'", b, "' with ", job::kEnvWorldSize, "=", p.env.world_size,
                                                     " on ", dev, ": GPU ranks all-reduce their gradients on the "
                                                     "device with nccl or nccl-lazy (one GPU per rank); set one of "
                                                     "those (resources.device_type: cuda defaults to nccl)"));
    }
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

namespace {
struct Registration {
  CudaStateFn fn = nullptr;
  bool interpreted = false;
};
Registration& Registered() {
  static Registration r;
  return r;
}
}  // namespace

void SetCudaState(CudaStateFn fn, bool interpreted) { Registered() = {fn, interpreted}; }
CudaStateFn GetCudaState() { return Registered().fn; }
bool CudaStateInterpreted() { return Registered().interpreted; }

absl::StatusOr<bool> EmulateGpusRequested() {
  const char* v = std::getenv(job::kEnvEmulateGpus);
  if (v == nullptr || std::string(v).empty() || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  return Bad(job::kEnvEmulateGpus, absl::StrCat("'", v, "': want 1 (run cuda ranks on the CUDA interpreter) or 0"));
}

}  // namespace ember::worker
