// The GPU step of ember-worker (EMBER_DEVICE cuda:N): model::GptCuda's fp32 step as a TrainState
// (train_state.h), run by the one training loop (trainer.cc): the same data order, LR schedule,
// gradient clipping, AdamW settings, progress records (plus the device allocator's memory) and
// checkpoints in the same format, so a run resumes on cpu or cuda alike.
//
// On W > 1 ranks (parallelism.strategy fsdp): data parallel, REPLICATED on the devices -- every
// rank holds the whole model, gradients and AdamW state on its GPU (no FSDP memory saving); each
// step it runs ForwardBackward on its own data shard (gradients of loss / W), one all-reduce (sum)
// of the gradient arena over the device group "cuda.grads" (the NCCL policy backend,
// parallelism.backend nccl or nccl-lazy; over NCCL on a GPU, over the cpu communicator driver --
// a strict fake of NCCL -- on the interpreter), then global-norm clipping and AdamW on every rank.
// The loss is averaged over the ranks on the host (the world group), as cpu FSDP does.
//
// A world-W CPU FsdpGpt is the host mirror: its shards (this rank's rows of every parameter, the
// same rows a cpu FSDP rank of that world holds) are what the loop initialises or resumes and what
// a checkpoint saves, so checkpoints move between cpu and cuda ranks and across world sizes.
// SyncDevice assembles the whole model from every rank's rows (a host all-reduce on the world
// group) and uploads it; SyncHost copies this rank's rows out of its replica.
//
// NOT RUN ON A GPU YET: built with and without CUDA on a CPU-only machine; on one and on several
// ranks it has run on the CUDA interpreter (runtime/worker:cuda_interp_worker_test,
// :cuda_dp_interp_test; docs/gpu-testing.md); on a machine without a GPU only the refusals and the
// "no usable GPU" exit of the real build have run (runtime/worker/cuda_worker_test.cc).
//
// Thread safety: call from the training thread.
#ifndef EMBER_RUNTIME_WORKER_CUDA_TRAINER_H_
#define EMBER_RUNTIME_WORKER_CUDA_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/token_file.h"
#include "runtime/job/env.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/worker/step_io.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

// Whether `device` (EMBER_DEVICE) names a GPU: "cuda" or "cuda:N" (index N >= 0, else
// INVALID_ARGUMENT naming EMBER_DEVICE). Returns -1 for anything else ("cpu" and other names are
// Prepare's to judge).
absl::StatusOr<int> CudaDeviceIndex(const std::string& device);

// EMBER_EMULATE_GPUS=1 (job::kEnvEmulateGpus): cuda ranks run on the CUDA interpreter
// (kernels/cuda/interp: the same kernels as host C++, slow, checked; docs/gpu-testing.md). Only
// ember-worker-cuda-interp, a test-only build of this worker linked with the interpreter, accepts
// it; every other build refuses it at Prepare (exit 2), and ember-worker-cuda-interp refuses a cuda
// rank without it. Each emulated rank's GPU is its own process's interpreter (its device 0);
// cuda:N names which GPU of the node the rank stands for (`emberctl run --standalone
// --emulate-gpus N` places ranks on cuda:0..N-1). EmulateGpusRequested: whether the variable asks
// for the interpreter ("1"; unset, empty or "0": no; anything else INVALID_ARGUMENT naming it).
absl::StatusOr<bool> EmulateGpusRequested();

// What Prepare checks of a cuda job (p.model, p.fsdp and p.dp_replicate already filled in):
// EMBER_EMULATE_GPUS matching the build (above), a CUDA build (or the interpreter), no pipeline, no
// HSDP (dp_replicate > 1), on more than one rank the backend nccl or nccl-lazy, one micro-batch,
// f32 precision, no weight publishing, and a model GptCuda supports (no MoE; head_dim 32 or 64).
// INVALID_ARGUMENT names the field and says what is supported.
absl::Status CheckCudaPlan(const Plan& p);

// Makes the GPU TrainState on plan.env.device (FAILED_PRECONDITION naming EMBER_DEVICE and the CUDA
// error when the GPU cannot be used). It lives in :cuda_loop (cuda_loop.cc), linked only into
// ember-worker-cuda; linking it registers it. GetCudaState() is null in the CPU ember-worker, which
// hands a cuda rank to ember-worker-cuda beside it (worker_main.cc).
struct Groups;
class TrainState;
using CudaStateFn = absl::StatusOr<std::unique_ptr<TrainState>> (*)(const Plan& plan, const Groups& groups);
// `interpreted`: fn runs the step on the CUDA interpreter (ember-worker-cuda-interp).
void SetCudaState(CudaStateFn fn, bool interpreted = false);
CudaStateFn GetCudaState();
bool CudaStateInterpreted();

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_CUDA_TRAINER_H_
