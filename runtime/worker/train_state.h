// TrainState: what the one training loop (trainer.cc) needs of a model under training, whatever its
// parallelism. FSDP / HSDP (fsdp::FsdpGpt), the pipeline (pipeline::PipelineGpt, its stages
// FSDP-sharded) and the GPU step (cuda_trainer.h) each implement it; the loop, checkpoints
// (model_state.h), resume, publishing, progress and fault hooks are the same code for all.
//
// Thread safety: call from the training thread.
#ifndef EMBER_RUNTIME_WORKER_TRAIN_STATE_H_
#define EMBER_RUNTIME_WORKER_TRAIN_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/exec_context.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/flight/recorder.h"
#include "runtime/data/token_file.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/worker/step_io.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

class TrainState {
 public:
  virtual ~TrainState() = default;

  // One optimizer step at learning rate `lr`: this rank's batches from `loader`, forward and
  // backward, the loss averaged over every rank, the global gradient norm, clipping, the update.
  // Sets the StepMetrics fields it measures: step, lr, loss, local_loss, grad_norm (when computed),
  // step_s and what the layout measures (comm wait and bytes, device memory, MFU; comm_memory_bytes
  // of groups the state made itself, to which the loop adds the Groups').
  virtual absl::StatusOr<StepResult> Step(const kernels::ExecContext& ctx, data::TokenLoader& loader,
                                          int64_t step, float lr) = 0;

  // This rank's parameter shards with their AdamW state (checkpoints, init, publishing). Host
  // memory: call SyncHost first on a device state, SyncDevice after writing through them.
  virtual std::vector<fsdp::ShardView> Shards() = 0;
  virtual absl::Status SyncHost() { return absl::OkStatus(); }
  virtual absl::Status SyncDevice() { return absl::OkStatus(); }

  virtual int64_t optimizer_step() const = 0;
  virtual void set_optimizer_step(int64_t s) = 0;
  // Bytes of this rank's persistent model state (parameters, gradients, optimizer state).
  virtual int64_t state_bytes() const = 0;
  // The checkpoint's parallelism record of this layout ({"fsdp", "4"}, {"pipeline", "stages=..."}).
  virtual std::pair<std::string, std::string> Layout() const = 0;
  // Mean of `v` over every rank of the job.
  virtual absl::StatusOr<double> AllReduceMean(double v) = 0;
  virtual const model::GptConfig& config() const = 0;
};

// The process groups of one attempt: "world"; "reduce_scatter" for FSDP when the plan separates it
// (its own stream of collectives, so reduce-scatters overlap the next unit's all-gathers); with
// HSDP "shard<r>" / "replicate<s>"; a pipeline with R ranks per replica on W > R ranks also has
// "pipeline<d>" (replica d: world ranks d*R .. d*R+R-1) and "stage<r>" (the W/R ranks of pipeline
// rank r, over which its stages are sharded); with W == R the pipeline group is the world.
struct Groups {
  std::unique_ptr<comm::ProcessGroup> world, reduce_scatter, pipeline, stage, shard, replicate;
  // The attempt's rendezvous and flight recorder (may be null) the groups were created with: a
  // TrainState that needs groups of its own (the GPU step's device group, cuda_loop.cc) creates
  // them with these.
  std::shared_ptr<comm::Rendezvous> rdzv;
  flight::FlightRecorder* recorder = nullptr;
  comm::ProcessGroup* pipe() const { return pipeline ? pipeline.get() : world.get(); }
  // Communicator memory over every group (shm segments, NCCL buffers), for the progress record.
  int64_t CommMemoryBytes() const;
};

// The groups of one attempt over `rdzv` (the attempt's store in a job; tests may run ranks as
// threads over a file rendezvous), from the plan's ParallelDims. `recorder` may be null.
absl::StatusOr<Groups> CreateGroups(const Plan& plan, std::shared_ptr<comm::Rendezvous> rdzv,
                                    flight::FlightRecorder* recorder);
// The TrainState of the plan's layout and device: pipeline, GPU (ember-worker-cuda) or FSDP/HSDP.
absl::StatusOr<std::unique_ptr<TrainState>> MakeTrainState(const Plan& plan, const Groups& groups);

// FSDP (or HSDP with groups.shard/replicate) over groups.world.
absl::StatusOr<std::unique_ptr<TrainState>> MakeFsdpState(const Plan& plan, const Groups& groups);
// A pipeline replica's rank (spec checked by Prepare).
absl::StatusOr<std::unique_ptr<TrainState>> MakePipelineState(const Plan& plan, const Groups& groups);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_TRAIN_STATE_H_
