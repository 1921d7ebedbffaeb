// The single-GPU training loop of ember-worker (EMBER_DEVICE cuda:N): model::GptCuda's fp32 step
// in the CPU loop's shape (trainer.cc): the same data order, LR schedule, gradient clipping, AdamW
// settings, progress records (plus the device allocator's memory) and checkpoints in the same
// format, so a run resumes on cpu or cuda alike. A world-1 CPU FsdpGpt is the host mirror: it
// initialises the weights (seed, safetensors, Hugging Face, or a checkpoint's parameters and AdamW
// state, uploaded to the GPU) and holds what a checkpoint saves (downloaded before each save).
//
// NOT RUN ON A GPU YET: built with and without CUDA on a CPU-only machine; only the refusals and
// the "no usable GPU" exit have run (runtime/worker/cuda_worker_test.cc).
//
// Thread safety: call from the training thread.
#ifndef EMBER_RUNTIME_WORKER_CUDA_TRAINER_H_
#define EMBER_RUNTIME_WORKER_CUDA_TRAINER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/token_file.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/worker/step_io.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

// Whether `device` (EMBER_DEVICE) names a GPU: "cuda" or "cuda:N" (index N >= 0, else
// INVALID_ARGUMENT naming EMBER_DEVICE). Returns -1 for anything else ("cpu" and other names are
// Prepare's to judge).
absl::StatusOr<int> CudaDeviceIndex(const std::string& device);

// What Prepare checks of a cuda job (p.model and p.fsdp already filled in): a CUDA build, world
// size 1 (strategy none, or fsdp on one rank), no pipeline, one micro-batch, f32 precision, no
// weight publishing, and a model GptCuda supports (no MoE; head_dim 32 or 64). INVALID_ARGUMENT
// names the field and says what is supported.
absl::Status CheckCudaPlan(const Plan& p);

// Trains steps (step, plan.spec.steps()] on GPU plan.env.device, starting from `host`'s state
// (world 1, already initialised or resumed at `step`). FAILED_PRECONDITION (the message names
// EMBER_DEVICE and the CUDA error) when the GPU cannot be used. Saves through `checkpoints`, whose
// snapshot reads `host`: the loop downloads the GPU state into `host` before each save.
// The loop lives in :cuda_loop (cuda_loop.cc), linked only into ember-worker-cuda; linking it
// registers it. GetCudaTrainLoop() is null in the CPU ember-worker, which hands a cuda rank to
// ember-worker-cuda beside it (worker_main.cc).
using CudaTrainLoopFn = absl::Status (*)(const Plan& plan, fsdp::FsdpGpt& host, data::TokenLoader& loader,
                                         int64_t step, Reporter& report, Checkpointer& checkpoints);
void SetCudaTrainLoop(CudaTrainLoopFn fn);
CudaTrainLoopFn GetCudaTrainLoop();

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_CUDA_TRAINER_H_
