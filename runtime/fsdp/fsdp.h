// FsdpGpt: the whole model under FSDP. It is model::Driver over the whole model with FullyShard's
// hooks (fully_shard.h: sharding units, precision, prefetch and overlap are described there) plus
// the optimizer step: the global gradient norm over every shard, optional clipping, sharded AdamW.
// With a replicate group it is HSDP: parameters sharded within `shard` (world / replicas ranks),
// gradient shards all-reduced across `replicate` after the reduce-scatter.
//
// Every rank must call the same methods in the same order (collectives are matched by order).
// Thread safety: thread-compatible (one training thread); the process groups are borrowed and
// must outlive this object.
//
//   ASSIGN_OR_RETURN(auto m, FsdpGpt::Create(cfg, {.world = pg, .reduce_scatter = rs_pg}, opts));
//   for (int mb = 0; mb < M; ++mb)
//     ASSIGN_OR_RETURN(float loss, m->ForwardBackward(ctx, tok, tgt, B, T, /*sync=*/mb == M - 1));
//   ASSIGN_OR_RETURN(double norm, m->OptimizerStep(ctx, lr));
#ifndef EMBER_RUNTIME_FSDP_FSDP_H_
#define EMBER_RUNTIME_FSDP_FSDP_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/exec_context.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "runtime/comm/process_group.h"
#include "runtime/fsdp/fully_shard.h"
#include "runtime/fsdp/policy.h"
#include "runtime/model/gpt.h"
#include "runtime/model/model.h"

namespace ember::fsdp {

struct Groups {
  comm::ProcessGroup* world = nullptr;           // every data-parallel rank: the loss average
  comm::ProcessGroup* reduce_scatter = nullptr;  // null: reduce-scatters go on the shard group
  comm::ProcessGroup* shard = nullptr;           // HSDP: the shard group (null: `world`)
  comm::ProcessGroup* replicate = nullptr;       // HSDP: the same rows on other replicas (null: none)
};

struct FsdpOptions {
  bool reshard_after_forward = true;
  bool prefetch = true;
  MixedPrecisionPolicy mp;
  kernels::AdamWOptions adamw;
  double clip_norm = 0;     // global-norm clipping across all shards; 0 = off
  uint64_t seed = 0;        // parameter init (model::InitParam)
  bool keep_debug_copies = false;  // TEST_: keep last gathered params / reduced grads
};

class FsdpGpt {
 public:
  // Validates cfg and the groups (same size), shards and initialises parameters from opts.seed.
  static absl::StatusOr<std::unique_ptr<FsdpGpt>> Create(const model::GptConfig& cfg, Groups groups,
                                                         const FsdpOptions& opts);
  // The same for any registered architecture (runtime/model/model.h).
  static absl::StatusOr<std::unique_ptr<FsdpGpt>> Create(std::shared_ptr<const model::Model> model, Groups groups,
                                                         const FsdpOptions& opts);
  ~FsdpGpt();

  // One micro-batch: forward, loss, backward; tokens/targets [B,T] are this rank's. Gradients
  // accumulate unsharded until `sync`, which reduce-scatters them into the shards (averaged over
  // ranks and the micro-batches since the last sync). Returns this rank's loss.
  absl::StatusOr<float> ForwardBackward(const kernels::ExecContext& ctx, const int32_t* tokens,
                                        const int32_t* targets, int64_t B, int64_t T, bool sync);
  // Loss only (no gradients); gathers and frees every unit.
  absl::StatusOr<float> Loss(const kernels::ExecContext& ctx, const int32_t* tokens,
                             const int32_t* targets, int64_t B, int64_t T);

  // Global gradient norm (all-reduced), optional clipping, AdamW on the local shards at `lr`,
  // then zeroes the gradient shards. Returns the pre-clip norm.
  absl::StatusOr<double> OptimizerStep(const kernels::ExecContext& ctx, float lr);

  // Average of `value` over the world group (f64 all-reduce).
  absl::StatusOr<double> AllReduceMean(double value);

  const model::Model& model() const { return *model_; }
  // This rank's place in the shard group (its rows) and the data-parallel world (shard x
  // replicate ranks).
  int shard_rank() const { return sharded_->rank(); }
  int shard_world() const { return sharded_->world(); }
  int world() const { return world_; }
  int64_t optimizer_step() const { return opt_step_; }
  void set_optimizer_step(int64_t s) { opt_step_ = s; }
  // This rank's shards; with HSDP only the first replica's are primary.
  std::vector<ShardView> Shards();
  // Bytes of this rank's persistent state: fp32 param, grad, exp_avg, exp_avg_sq shards.
  int64_t state_bytes() const { return sharded_->state_bytes(); }
  CommBytes comm_bytes() const;
  void ResetCommBytes();
  // Time the training thread spent in collectives since the last reset: issuing them (the group
  // runs small ones, <= GroupOptions::inline_max_bytes, inline on this thread) plus blocked in
  // Wait().
  absl::Duration comm_wait() const { return sharded_->comm_wait(); }
  void ResetCommWait() { sharded_->ResetCommWait(); }
  ShardedPart& sharded() { return *sharded_; }

  // TEST_: last gathered fp32 compute values / last reduced gradient shard (as received, widened
  // to fp32, before averaging) of a parameter; needs keep_debug_copies.
  std::vector<float> TEST_gathered(const std::string& name) const;
  std::vector<float> TEST_reduced(const std::string& name) const;
  // This rank's unsharded fp32 gradient as it went into the last reduce-scatter.
  std::vector<float> TEST_local_grad(const std::string& name) const;
  ParamPrecision TEST_precision(const std::string& name) const;

 private:
  FsdpGpt(std::shared_ptr<const model::Model> model, Groups g, const FsdpOptions& o);

  const std::shared_ptr<const model::Model> model_;
  const Groups groups_;
  const FsdpOptions opts_;
  int world_ = 1;  // data-parallel ranks (shard x replicate)
  std::unique_ptr<ShardedPart> sharded_;
  std::unique_ptr<const model::Driver> driver_;
  int64_t opt_step_ = 0;
  int accum_ = 0;  // micro-batches accumulated since the last sync
  CommBytes extra_bytes_;  // the loss and norm all-reduces
};

}  // namespace ember::fsdp

#endif  // EMBER_RUNTIME_FSDP_FSDP_H_
