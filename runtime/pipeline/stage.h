// PipelineGpt: one rank's part of a pipelined GPT, executed action by action from a Schedule over
// a ProcessGroup (CPU backend today).
//
// Stage s holds blocks [s*L/S, (s+1)*L/S) of the model (L = n_layer, S = stages); stage 0 also
// holds the embeddings, the last stage ln_f and the LM head, which is tied to the token embedding:
// when the first and last stages sit on different ranks both hold a copy of wte, and their wte
// gradients are summed (an all-reduce on a two-rank subgroup) so both copies take the same step.
// That all-reduce runs at the Optimizer action, not at ReduceGrad: the CPU backend runs small
// collectives inline on the caller's thread, which at ReduceGrad could block a rank that still owes
// its peer activations (interleaved 1F1B). ReduceGrad is otherwise a no-op here: there is no
// data-parallel or FSDP reduction yet. Parameters are initialised exactly as
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

#include <map>
#include <memory>
#include <string>
#include <tuple>
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
// life). `primary` is false only for the last stage's copy of the tied wte when stage 0 sits on
// another rank: the two copies are equal, and a checkpoint saves the primary one.
struct ParamView {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  bool primary = true;
};

struct PipelineOptions {
  BufferPoolOptions pool;
  kernels::AdamWOptions adamw;
  absl::Duration timeout = absl::Minutes(5);  // for each wait on a receive, send or all-reduce
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
  // micro_batch_size, T] (int32), the same on every rank: micro-batch k is rows [k*mbs, (k+1)*mbs).
  // Returns the mean loss over the batch, on every rank (broadcast from the last stage).
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
  std::vector<std::pair<model::ParamSpec, int64_t>> layout_;  // every parameter and its offset
  std::vector<float> params_, grads_, adam_m_, adam_v_;
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
