// PipelineGpt: one rank's part of a pipelined GPT, executed action by action from a Schedule over
// a ProcessGroup (CPU backend today).
//
// Stage s holds blocks [s*L/S, (s+1)*L/S) of the model (L = n_layer, S = stages); stage 0 also
// holds the embeddings, the last stage ln_f and the LM head, which is tied to the token embedding:
// when the first and last stages sit on different ranks both hold a copy of wte, and their wte
// gradients are summed (an all-reduce on a two-rank subgroup) so both copies take the same step.
// That all-reduce runs at the Optimizer action, not at ReduceGrad: the CPU backend runs small
// collectives inline on the caller's thread, which at ReduceGrad could block a rank that still owes
// its peer activations (interleaved 1F1B). A llama model with an untied head has no wpe and no
// wte copy: its last stage holds lm_head.weight, and there is no tied all-reduce.
//
// Data parallelism (PipelineOptions::data, the stage group: the ranks of the other pipeline
// replicas that hold this rank's stages): at ReduceGrad(s) the stage's gradients (its blocks;
// stage 0 also wte and wpe, the last stage ln_f and, on another rank than stage 0, its wte copy)
// are packed and their reduction is issued on the stage group without waiting: an all-reduce
// (average) when replicated, a reduce-scatter (average) into this rank's torch.chunk rows of every
// parameter when `shard` is set. It overlaps the rank's remaining backward work; the Optimizer
// action waits for every stage's reduction, then runs AdamW on this rank's rows only (sharded:
// AdamW state holds only those rows) and, sharded, all-gathers the updated rows so every replica
// holds the whole stage again (ZeRO-2: gradients and optimizer state sharded, parameters
// replicated between steps; runtime/fsdp's units cannot be reused here, see docs/pipeline.md).
// Every replica runs the same schedule, so stage-group collectives are issued in the same order
// on every member and, being at the same place in each replica's action list, cannot deadlock
// the pipeline even when the backend runs them inline. Parameters are initialised exactly as
// model::Gpt::Create(cfg, seed) initialises them, so a pipelined run and an unpipelined one on the
// same data agree to rounding (stage_test checks it).
//
// A step runs the rank's action list in order: a Recv takes a buffer from the BufferPool and posts
// the receive, the compute that needs it waits for it; a compute that feeds a Send writes into a
// pool buffer, which the pool frees once the send's Work completes; stages on the same rank hand
// over in memory. Each micro-batch's loss gradient is scaled by 1/micro_batches, so the step's
// gradient is that of the mean loss over the whole batch. ZB-H1's BackwardInput runs the blocks'
// model::Block::BackwardInput (input gradient and norm-weight gradients; the embedding gradient on
// stage 0) and BackwardWeight their deferred linear weight gradients, bitwise equal to the fused
// backward. Gradient clipping is not supported.
//
// Errors: a failed or timed-out receive/send/all-reduce comes back as its Status, annotated with
// the action; the step is then unusable (abort the group). Thread-compatible: one step at a time.
//
//   ASSIGN_OR_RETURN(Schedule s, BuildSchedule({ScheduleKind::k1F1B, 2, 2, /*micro_batches=*/4}));
//   ASSIGN_OR_RETURN(auto stage, PipelineGpt::Create(cfg, seed, s, pg.get(), /*mb_size=*/2, T));
//   ASSIGN_OR_RETURN(double loss, stage->Step(ctx, tokens, targets));  // [4*2, T] each
#ifndef EMBER_RUNTIME_PIPELINE_STAGE_H_
#define EMBER_RUNTIME_PIPELINE_STAGE_H_

#include <algorithm>
#include <map>
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
#include "runtime/model/gpt.h"
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

// One parameter this rank holds, with its AdamW state (views into the PipelineGpt, valid for its
// life). `param` is the whole parameter; this rank updates (and owns the AdamW state of) global
// rows [row_begin, row_begin + rows), each row_numel floats: all rows unless sharded, else the
// torch.chunk rows of its rank in the stage group. exp_avg / exp_avg_sq point at those rows only.
// `primary` is false for copies a checkpoint must not save twice: the last stage's copy of the
// tied wte when stage 0 sits on another rank, and every parameter of a replicated (not sharded)
// replica other than the stage group's rank 0.
struct ParamView {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  float* param = nullptr;
  int64_t row_begin = 0, rows = 0, row_numel = 0;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  bool primary = true;
};

// The data-parallel side of a pipeline rank (see the top of this file).
struct DataParallel {
  comm::ProcessGroup* group = nullptr;  // the stage group; borrowed; null or size 1: one replica
  bool shard = false;                   // reduce-scatter + sharded AdamW state (else all-reduce)
};

struct PipelineOptions {
  BufferPoolOptions pool;
  kernels::AdamWOptions adamw;
  absl::Duration timeout = absl::Minutes(5);  // for each wait on a receive, send or all-reduce
  DataParallel data;
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
  ~PipelineGpt();

  // One training step (forward, backward, AdamW) on tokens/targets [micro_batches *
  // micro_batch_size, T] (int32), this replica's batch, the same on every rank of the replica:
  // micro-batch k is rows [k*mbs, (k+1)*mbs). Returns the mean loss over every replica's batch, on
  // every rank (broadcast from the last stage, averaged over the stage group).
  absl::StatusOr<double> Step(const kernels::ExecContext& ctx, const int32_t* tokens,
                              const int32_t* targets);

  // This rank's parameters in its layout order (checkpoints). Writing through the views between
  // steps changes the model (resume); the tied wte must then be written on both of its ranks.
  std::vector<ParamView> Params();
  int64_t optimizer_step() const { return adam_step_; }    // AdamW steps taken (bias correction)
  void set_optimizer_step(int64_t step) { adam_step_ = step; }
  void set_learning_rate(float lr) { opts_.adamw.lr = lr; }  // for the following steps

  const BufferPool& pool() const { return *pool_; }
  const StepTiming& last_step_timing() const { return timing_; }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  // The stages this rank holds, in increasing order.
  const std::vector<int>& stages() const { return stage_ids_; }

 private:
  struct StageState;
  using Key = std::tuple<int, int, int>;  // ActionType, stage, micro-batch
  PipelineGpt() = default;
  absl::Status Forward(const kernels::ExecContext& ctx, const Action& a, const int32_t* tokens,
                       const int32_t* targets);
  // Backward or BackwardInput (by a.type) of one stage and micro-batch.
  absl::Status Backward(const kernels::ExecContext& ctx, const Action& a, const int32_t* tokens);
  absl::Status BackwardWeight(const kernels::ExecContext& ctx, const Action& a);
  // The buffer holding the received data of `recv` once its receive completed.
  absl::StatusOr<const float*> Received(const Action& recv);
  // Where a compute writes the output that crosses to `peer_stage`: a pool send buffer, or a local
  // hand-over buffer when that stage is on this rank.
  absl::StatusOr<float*> OutputFor(ActionType send_type, int stage, int mb, int peer_stage);
  StageState& Local(int stage);
  // Assigns each parameter's rows and AdamW state (Create; `owner`: per layout_ entry, its stage).
  absl::Status PlanReductions(const std::vector<int>& owner, DataParallel data);
  // ReduceGrad: packs the stage's gradients and issues their stage-group reduction.
  absl::Status IssueReduce(int stage);
  // Optimizer: waits for the reductions, sums the tied wte, AdamW, all-gathers (sharded).
  absl::Status OptimizerStep(const kernels::ExecContext& ctx);
  float* P(int64_t offset) { return params_.data() + offset; }
  float* G(int64_t offset) { return grads_.data() + offset; }

  model::GptConfig cfg_;
  Schedule schedule_;
  comm::ProcessGroup* pg_ = nullptr;
  int rank_ = 0;
  int64_t mbs_ = 0, T_ = 0, N_ = 0;  // micro-batch rows, sequence length, tokens per micro-batch
  PipelineOptions opts_;
  std::vector<int> stage_ids_;
  std::vector<std::unique_ptr<StageState>> local_stages_;
  int64_t wte_ = -1, wpe_ = -1, lnf_ = -1;  // offsets into params_/grads_, -1: not on this rank
  int64_t head_ = -1;  // last stage: the LM head (wte_ when tied, lm_head.weight when not)
  std::vector<std::pair<model::ParamSpec, int64_t>> layout_;  // every parameter and its offset
  // Per layout_ entry: the rows this rank updates and where they sit in gshard_ / adam_m_ / adam_v_
  // (`chunk` rows reserved, zero-padded), and the stage whose ReduceGrad reduces it.
  struct Slot {
    int stage = 0;
    int64_t total_rows = 0, row_begin = 0, rows = 0, row_numel = 0, chunk = 0, shard_off = 0;
    // Stage-group rank j's rows [begin, end).
    std::pair<int64_t, int64_t> Chunk(int j) const {
      return {std::min(j * chunk, total_rows), std::min((j + 1) * chunk, total_rows)};
    }
  };
  std::vector<Slot> slots_;
  // Per local stage: its layout_ indices, its block [base, base + packed) of gshard_, the
  // reduce-scatter input / all-gather output (dp x packed; sharded only) and the reduction in flight.
  struct Reduction {
    std::vector<int> params;
    int64_t base = 0, packed = 0;
    std::vector<float> wide;
    std::shared_ptr<comm::Work> work;
  };
  std::map<int, Reduction> reductions_;
  DataParallel dp_;
  int dp_rank_ = 0, dp_size_ = 1;
  std::vector<float> params_, grads_;
  std::vector<float> gshard_, adam_m_, adam_v_;  // reduced gradient rows, AdamW state (rows)
  int64_t adam_step_ = 0;
  std::unique_ptr<comm::ProcessGroup> tied_;  // {rank of stage 0, rank of the last stage}
  std::unique_ptr<BufferPool> pool_;

  // Per step.
  std::map<Key, std::pair<std::shared_ptr<comm::Work>, float*>> recvs_;
  std::map<Key, float*> outputs_;                    // send buffers written by a compute
  std::map<Key, std::vector<float>> handover_;       // same-rank stage to stage
  std::map<std::pair<int, int>, std::vector<model::BlockActivationsPtr>> acts_;
  std::map<int, kernels::Tensor> head_dx_;           // last stage: dloss/dx per micro-batch
  // ZB-H1: (stage, micro-batch) -> per block, last to first, what BackwardWeight needs.
  std::map<std::pair<int, int>, std::vector<model::BlockWeightGradsPtr>> wgrads_;
  double loss_sum_ = 0;
  StepTiming timing_;
  double recv_wait_s_ = 0;  // of the current compute
};

}  // namespace ember::pipeline

#endif  // EMBER_RUNTIME_PIPELINE_STAGE_H_
