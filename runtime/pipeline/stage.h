// PipelineGpt: one rank's part of a pipelined GPT, executed action by action from a Schedule over
// a ProcessGroup (CPU backend today).
//
// Stage s is model::Part::Stage(cfg, s, S) (runtime/model/driver.h): blocks [s*L/S, (s+1)*L/S); stage
// 0 also the embedding, the last stage ln_f and the LM head. Each stage this rank holds is run by
// the one model driver with FSDP applied to it: fsdp::FullyShard over the stage group
// (PipelineOptions::data: the ranks of the other pipeline replicas that hold this rank's stages), so
// PP x FSDP is ZeRO-3 within each stage: parameters sharded over the stage group with torch.chunk
// rows, each unit all-gathered before its forward and its backward and freed after
// (reshard_after_forward), gradients reduce-scattered at the stage's ReduceGrad action (issued
// without waiting; it overlaps the rank's remaining backward work), AdamW on this rank's rows
// only. With DataParallel::shard off the replicas keep whole parameters and all-reduce gradients
// (FullyShard's replicate group). With DataParallel::replicate as well, PP x HSDP: rows sharded
// within the stage's shard group, the gradient shards all-reduced across the replicate group (the
// shard groups holding the same rows), as FullyShard does for HSDP. A single replica keeps whole
// parameters and moves nothing.
//
// The LM head is tied to the token embedding in the gpt arch: when the first and last stages sit
// on different ranks each holds a copy of wte, and at the Optimizer action their reduced gradient
// rows are summed (an all-reduce on a two-rank subgroup, or in memory when one rank holds both) so
// both copies take the same step. That all-reduce runs at the Optimizer action, not at ReduceGrad:
// the CPU backend runs small collectives inline on the caller's thread, which at ReduceGrad could
// block a rank that still owes its peer activations (interleaved 1F1B).
//
// Every replica runs the same schedule, so stage-group collectives (gathers, reduce-scatters) are
// issued in the same order on every member and, being at the same place in each replica's action
// list, cannot deadlock the pipeline even when the backend runs them inline. Parameters are
// initialised exactly as model::Gpt::Create(cfg, seed) initialises them, so a pipelined run and an
// unpipelined one on the same data agree to rounding (stage_test checks it).
//
// Optimizer: one global gradient norm over every stage and shard (the tied copy counted once:
// sums of squares all-reduced over the stage group, then the pipeline group), clipping to
// PipelineOptions::clip_norm, then AdamW. Precision (PipelineOptions::mp) is FSDP's per-parameter
// policy: gathers in param_dtype, reductions in reduce_dtype, block outputs rounded to output_dtype.
//
// A step runs the rank's action list in order: a Recv takes a buffer from the BufferPool and posts
// the receive, the compute that needs it waits for it; a compute that feeds a Send writes into a
// pool buffer, which the pool frees once the send's Work completes; stages on the same rank hand
// over in memory. Each micro-batch's loss gradient is scaled by 1/micro_batches, so the step's
// gradient is that of the mean loss over the whole batch. ZB-H1's BackwardInput and BackwardWeight
// are the driver's split backward (bitwise equal to the fused one).
//
// Errors: a failed or timed-out receive/send/collective comes back as its Status, annotated with
// the action; the step is then unusable (abort the group). Thread-compatible: one step at a time.
//
//   ASSIGN_OR_RETURN(Schedule s, BuildSchedule({ScheduleKind::k1F1B, 2, 2, /*micro_batches=*/4}));
//   ASSIGN_OR_RETURN(auto stage, PipelineGpt::Create(cfg, seed, s, pg.get(), /*mb_size=*/2, T));
//   ASSIGN_OR_RETURN(double loss, stage->Step(ctx, tokens, targets));  // [4*2, T] each
#ifndef EMBER_RUNTIME_PIPELINE_STAGE_H_
#define EMBER_RUNTIME_PIPELINE_STAGE_H_

#include <algorithm>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/exec_context.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "runtime/comm/process_group.h"
#include "runtime/fsdp/fully_shard.h"
#include "runtime/model/driver.h"
#include "runtime/model/gpt.h"
#include "runtime/model/model.h"
#include "runtime/pipeline/buffer_pool.h"
#include "runtime/pipeline/schedule.h"

namespace ember::pipeline {

// Where one rank's last step spent its time (for pipeline_bench's measured bubble).
struct StepTiming {
  double compute_s = 0;  // in forward / backward / backward-input / backward-weight computes,
                         // less their waits for received data
  double span_s = 0;     // from the step's start to the end of the rank's last such compute
  double recv_wait_s = 0;  // computes waiting for their received input (part of the idle time)
};

// The data-parallel side of a pipeline rank (see the top of this file).
struct DataParallel {
  comm::ProcessGroup* group = nullptr;  // the stage group; borrowed; null or size 1: one replica
  bool shard = false;                   // reduce-scatter + sharded AdamW state (else all-reduce)
  // HSDP (with shard): the ranks holding the same rows of this rank's stages in the other shard
  // groups; gradient shards are all-reduced across it. Borrowed; null or size 1: none. With
  // `group` of size 1 (dp_shard 1) it is plain replication (shard off over this group).
  comm::ProcessGroup* replicate = nullptr;
};

struct PipelineOptions {
  BufferPoolOptions pool;
  kernels::AdamWOptions adamw;
  absl::Duration timeout = absl::Minutes(5);  // for each wait on a receive, send or collective
  DataParallel data;
  fsdp::MixedPrecisionPolicy mp;     // per-parameter precision (fsdp/policy.h)
  double clip_norm = 0;              // global-norm clipping over every stage and shard; 0 = off
  bool reshard_after_forward = true;
  bool prefetch = true;
};

class PipelineGpt {
 public:
  // Collective over `pg` (every rank calls it; it may create the tied-embedding subgroup).
  // `pg` is borrowed and must outlive the object; its size must be the schedule's rank count and
  // its rank this pipeline rank. InvalidArgument naming the numbers when n_layer is not divisible
  // by the stages, T exceeds the context, or sizes are not positive.
  static absl::StatusOr<std::unique_ptr<PipelineGpt>> Create(const model::GptConfig& cfg,
                                                             uint64_t seed, const Schedule& schedule,
                                                             comm::ProcessGroup* pg,
                                                             int64_t micro_batch_size, int64_t T,
                                                             PipelineOptions options = {});
  // The same for any registered architecture (runtime/model/model.h).
  static absl::StatusOr<std::unique_ptr<PipelineGpt>> Create(std::shared_ptr<const model::Model> model,
                                                             uint64_t seed, const Schedule& schedule,
                                                             comm::ProcessGroup* pg,
                                                             int64_t micro_batch_size, int64_t T,
                                                             PipelineOptions options = {});
  ~PipelineGpt();

  // One training step (forward, backward, AdamW) on tokens/targets [micro_batches *
  // micro_batch_size, T] (int32), this replica's batch, the same on every rank of the replica:
  // micro-batch k is rows [k*mbs, (k+1)*mbs). Returns the mean loss over every replica's batch, on
  // every rank (broadcast from the last stage, averaged over the stage group).
  absl::StatusOr<double> Step(const kernels::ExecContext& ctx, const int32_t* tokens,
                              const int32_t* targets);

  // This rank's parameter shards, stage by stage (checkpoints, publishing): the rows this rank
  // updates, with their AdamW state. The tied wte copy of the last stage is not primary; nor, with
  // replicated data parallelism, is any shard of a replica other than the first.
  std::vector<fsdp::ShardView> Shards();
  int64_t optimizer_step() const { return adam_step_; }    // AdamW steps taken (bias correction)
  void set_optimizer_step(int64_t step) { adam_step_ = step; }
  void set_learning_rate(float lr) { opts_.adamw.lr = lr; }  // for the following steps
  // The gradient norm of the last step (before clipping), over every stage and shard.
  double last_grad_norm() const { return grad_norm_; }

  const BufferPool& pool() const { return *pool_; }
  const StepTiming& last_step_timing() const { return timing_; }
  // The stages this rank holds, in increasing order.
  const std::vector<int>& stages() const { return stage_ids_; }
  // Bytes of persistent state (param, grad, AdamW shards) and the high-water mark of gathered
  // (unsharded) parameter bytes, over this rank's stages.
  int64_t state_bytes() const;
  int64_t peak_gathered_bytes() const;
  // Bytes moved by the stage-group collectives and the time spent in them, since the last reset.
  fsdp::CommBytes comm_bytes() const;
  absl::Duration comm_wait() const;
  void ResetCommStats();

 private:
  struct StageState {
    int stage = 0;
    std::unique_ptr<model::Driver> driver;
    std::unique_ptr<fsdp::ShardedPart> sharded;
  };
  using Key = std::tuple<int, int, int>;  // ActionType, stage, micro-batch
  PipelineGpt() = default;
  absl::Status Forward(const kernels::ExecContext& ctx, const Action& a, const int32_t* tokens,
                       const int32_t* targets);
  // Backward or BackwardInput (by a.type) of one stage and micro-batch.
  absl::Status Backward(const kernels::ExecContext& ctx, const Action& a);
  absl::Status BackwardWeight(const kernels::ExecContext& ctx, const Action& a);
  // The buffer holding the received data of `recv` once its receive completed.
  absl::StatusOr<const float*> Received(const Action& recv);
  // Where a compute writes the output that crosses to `peer_stage`: a pool send buffer, or a local
  // hand-over buffer when that stage is on this rank.
  absl::StatusOr<float*> OutputFor(ActionType send_type, int stage, int mb, int peer_stage);
  StageState& Local(int stage);
  // Optimizer: waits for the reductions, sums the tied wte, the global norm, clipping, AdamW.
  absl::Status OptimizerStep(const kernels::ExecContext& ctx);
  absl::Status AllReduceSum(comm::ProcessGroup* g, double* v, const char* what);

  std::shared_ptr<const model::Model> model_;
  Schedule schedule_;
  comm::ProcessGroup* pg_ = nullptr;
  int rank_ = 0;
  int64_t mbs_ = 0, T_ = 0, N_ = 0;  // micro-batch rows, sequence length, tokens per micro-batch
  PipelineOptions opts_;
  std::vector<int> stage_ids_;
  std::vector<StageState> local_stages_;
  int dp_size_ = 1;
  std::string tied_name_;   // a parameter of the embedding and the head (GPT's wte), or ""
  bool tied_copy_ = false;  // ... held by stage 0 and by the last stage
  int64_t adam_step_ = 0;
  double grad_norm_ = 0;
  std::unique_ptr<comm::ProcessGroup> tied_;  // {rank of stage 0, rank of the last stage}
  std::unique_ptr<BufferPool> pool_;

  // Per step.
  std::map<Key, std::pair<std::shared_ptr<comm::Work>, float*>> recvs_;
  std::map<Key, float*> outputs_;                    // send buffers written by a compute
  std::map<Key, std::vector<float>> handover_;       // same-rank stage to stage
  std::map<std::pair<int, int>, model::MicroBatch> mbs_state_;  // (stage, micro-batch)
  double loss_sum_ = 0;
  StepTiming timing_;
  double recv_wait_s_ = 0;  // of the current compute
};

}  // namespace ember::pipeline

#endif  // EMBER_RUNTIME_PIPELINE_STAGE_H_
