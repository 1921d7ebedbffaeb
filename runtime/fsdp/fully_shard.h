// FullyShard: FSDP (ZeRO-3, PyTorch FSDP2 `fully_shard` semantics) applied to a part of a model.
//
// FullyShard(model, part, groups, options) shards the parameters of a model part (any model::Model,
// runtime/model/model.h; the part is the whole model, or one pipeline stage: driver.h) over a
// group and returns a ShardedPart, which is
// the part's model::UnitHooks: run the part with model::Driver and the hooks gather each unit's
// parameters just in time, free them after, and reduce-scatter the gradients.
//
// Sharding units: each block is one unit; the embedding and the head share the "root" unit (for
// GPT: wte, [wpe], ln_f, [lm_head]; a tied parameter once), gathered once per micro-batch and kept
// until its last forward use. Every parameter is sharded on dim 0 with torch.chunk semantics: c = ceil(rows/N) rows per
// rank, rank r holds rows [min(r c, rows), min((r+1) c, rows)), zero-padded to c rows so every
// collective moves equal blocks. Each rank owns fp32 master shards, fp32 gradient shards and AdamW
// state for its rows only.
//
// Per micro-batch (the driver's hooks): a unit is all-gathered before its forward (one all-gather
// per param dtype in the unit; see policy.h), freed after its last forward use (when
// reshard_after_forward; the last block of a part with the head stays gathered: its backward comes
// right away), gathered again for its backward and freed after its last backward use. Gradients
// accumulate unsharded in fp32 until a reduction: with `reduce_on_backward` (plain FSDP) a unit's
// reduce-scatter is issued right after its last backward use in a micro-batch begun with sync; else
// the caller issues them all with ReduceGradients (a pipeline stage's ReduceGrad action). Overlap:
// with `prefetch`, the next unit's all-gather is issued before a unit computes (forward order, and
// backward order in the backward); reduce-scatters on `groups.reduce_scatter` run on its own
// executor thread. FinishReduce waits for them, adds the reduced rows / divisor into the gradient
// shards and, with a replicate group (HSDP), all-reduces the gradient shards across replicas.
//
// Block outputs are rounded to the policy's output_dtype after each block's forward.
//
// Every rank of the group must make the same calls in the same order (collectives are matched by
// order). Thread safety: thread-compatible (one training thread); the process groups are borrowed
// and must outlive the object.
//
//   std::shared_ptr<const model::Model> m = model::MakeGptModel(cfg);
//   ASSIGN_OR_RETURN(auto sharded, FullyShard(m, model::Part::Whole(*m), {.shard = pg}, opts));
//   model::Driver driver(m, model::Part::Whole(*m));
//   sharded->BeginMicroBatch(/*backward=*/true, /*sync=*/true);
//   ... driver.Forward(ctx, *sharded, args, &mb, nullptr); driver.Backward(ctx, *sharded, &mb, ...);
//   RETURN_IF_ERROR(sharded->FinishReduce(/*divisor=*/world));
//   double sumsq = sharded->GradSumSquares();   // all-reduce it over the shard group
//   sharded->Step(ctx, adamw, step, /*grad_scale=*/1.0f);
#ifndef EMBER_RUNTIME_FSDP_FULLY_SHARD_H_
#define EMBER_RUNTIME_FSDP_FULLY_SHARD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/exec_context.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "runtime/comm/process_group.h"
#include "runtime/fsdp/policy.h"
#include "runtime/model/driver.h"
#include "runtime/model/gpt.h"
#include "runtime/model/model.h"

namespace ember::fsdp {

// torch.chunk on dim 0: rows per rank (ceil) and rank r's [begin, end).
int64_t ChunkRows(int64_t rows, int world);
std::pair<int64_t, int64_t> ShardRows(int64_t rows, int world, int rank);

struct ShardGroups {
  comm::ProcessGroup* shard = nullptr;           // all-gathers and reduce-scatters; null: one rank
  comm::ProcessGroup* reduce_scatter = nullptr;  // same ranks, own stream; null: on `shard`
  comm::ProcessGroup* replicate = nullptr;       // HSDP: gradient all-reduce across replicas
};

struct ShardOptions {
  bool reshard_after_forward = true;
  bool prefetch = true;
  bool reduce_on_backward = true;  // see the top of this file
  MixedPrecisionPolicy mp;
  uint64_t seed = 0;               // parameter init (model::InitParam)
  // Each collective's timeout: zero = the group's (GroupOptions::timeout, the job's
  // collective_timeout_s, after which the watchdog aborts the group).
  absl::Duration timeout = absl::ZeroDuration();
  bool keep_debug_copies = false;  // TEST_: keep last gathered params / reduced grads
};

// Bytes moved by collectives, by dtype. For all-gather and reduce-scatter this is the unsharded
// (padded) buffer size, world * shard; a ring puts (N-1)/N of it on each rank's wire.
struct CommBytes {
  std::map<std::string, int64_t> all_gather;      // dtype name -> bytes
  std::map<std::string, int64_t> reduce_scatter;
  std::map<std::string, int64_t> all_reduce;
  // What the reduce-scatters would have moved under PyTorch's rule (a unit whose gradients have
  // mixed dtypes is reduced entirely in fp32).
  int64_t reduce_scatter_promoted = 0;
  int64_t total() const;
  void Add(const CommBytes& o);
};

// A view of one parameter's local shard (checkpoints, publishing). Pointers stay valid for the
// life of the owner; `rows` valid rows start at global row `row_begin`; padding rows are zero.
// `primary` is false for a copy a checkpoint must not save twice (a pipeline's second wte, or an
// HSDP replica other than the first).
struct ShardView {
  std::string name;
  std::vector<int64_t> global_shape;
  int64_t row_begin = 0, rows = 0, row_numel = 0;
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  bool primary = true;
};

class ShardedPart final : public model::UnitHooks {
 public:
  ~ShardedPart() override;

  // Starts a micro-batch: `backward` says whether a backward follows the forward (else units are
  // freed right after their last forward use); `sync` marks the micro-batch whose backward
  // reduce-scatters (reduce_on_backward).
  void BeginMicroBatch(bool backward, bool sync);

  // model::UnitHooks.
  absl::Status Before(model::Phase phase, int unit) override;
  absl::Status After(model::Phase phase, int unit, float* x, int64_t n) override;
  const float* Weight(int p) override;
  float* Grad(int p) override;

  // Issues the reduce-scatter of every unit that holds gradients (a pipeline's ReduceGrad).
  absl::Status ReduceGradients();
  // Waits for the reduce-scatters in flight and adds their rows / divisor into the gradient shards;
  // with a replicate group, then all-reduces (sums) the gradient shards across the replicas before
  // dividing. No-op when nothing is in flight.
  absl::Status FinishReduce(double divisor);

  // Sum of squares of this rank's gradient shards (fp64), parameters named in `skip` left out.
  double GradSumSquares(const std::set<std::string>& skip = {}) const;
  // The gradient shard of parameter `name` (rows x row_numel, padded to the chunk); null if absent.
  float* GradShard(const std::string& name);
  int64_t GradShardNumel(const std::string& name) const;
  // Scales the gradient shards by grad_scale (clipping; 1: none), then AdamW step `step` on the
  // master shards, then zeroes the gradient shards.
  void Step(const kernels::ExecContext& ctx, const kernels::AdamWOptions& adamw, int64_t step,
            float grad_scale);

  std::vector<ShardView> Shards();
  int rank() const { return rank_; }
  int world() const { return world_; }
  // Bytes of this rank's persistent state: fp32 param, grad, exp_avg, exp_avg_sq shards.
  int64_t state_bytes() const;
  // Bytes of parameters gathered right now (unsharded compute copies) and their high-water mark.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  const CommBytes& comm_bytes() const { return bytes_; }
  void ResetCommBytes() { bytes_ = CommBytes(); }
  // Time the training thread spent in collectives since the last reset: issuing them (the group
  // runs small ones inline on this thread) plus blocked in Wait().
  absl::Duration comm_wait() const { return comm_wait_; }
  void ResetCommWait() { comm_wait_ = absl::ZeroDuration(); }
  void AddCommWait(absl::Duration d) { comm_wait_ += d; }

  std::vector<float> TEST_gathered(const std::string& name) const;
  std::vector<float> TEST_reduced(const std::string& name) const;
  std::vector<float> TEST_local_grad(const std::string& name) const;
  ParamPrecision TEST_precision(const std::string& name) const;

  struct Param;
  struct Unit;

 private:
  friend absl::StatusOr<std::unique_ptr<ShardedPart>> FullyShard(std::shared_ptr<const model::Model>,
                                                                  model::Part, ShardGroups, const ShardOptions&);
  ShardedPart(std::shared_ptr<const model::Model> model, model::Part part, ShardGroups g, const ShardOptions& o);
  bool IsBlock(int unit) const { return unit >= 1 && unit <= model_->NumBlocks(); }
  absl::Status Init();
  Unit* UnitOf(int driver_unit) const;
  void IssueGather(Unit& u);
  absl::Status FinishGather(Unit& u);
  absl::Status EnsureGathered(Unit& u);
  void Reshard(Unit& u);
  void IssueReduceScatter(Unit& u);
  absl::Status Wait(const std::shared_ptr<comm::Work>& w);
  const Param* Find(const std::string& name) const;

  const std::shared_ptr<const model::Model> model_;
  const model::Part part_;
  const ShardGroups groups_;
  const ShardOptions opts_;
  int rank_ = 0, world_ = 1;
  std::vector<std::unique_ptr<Param>> params_;
  std::map<int, Param*> by_index_;             // ParamSpecs index -> param
  std::vector<std::unique_ptr<Unit>> units_;   // root (when the part has embed or head), blocks
  std::map<int, Unit*> unit_of_;               // driver unit -> sharding unit
  std::map<Unit*, int> first_use_, last_use_;  // driver units using it, first and last
  bool backward_ = true, sync_ = true;
  std::vector<Unit*> rs_inflight_;
  CommBytes bytes_;
  absl::Duration comm_wait_;
  int64_t gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
};

// Shards `part` of `model` over groups.shard, initialising this rank's rows from options.seed
// (model::InitParam: exactly as model::Gpt::Create(cfg, seed) initialises a GPT). InvalidArgument
// when the part is not within the model or the reduce-scatter group has other ranks.
absl::StatusOr<std::unique_ptr<ShardedPart>> FullyShard(std::shared_ptr<const model::Model> model, model::Part part,
                                                        ShardGroups groups, const ShardOptions& options);

}  // namespace ember::fsdp

#endif  // EMBER_RUNTIME_FSDP_FULLY_SHARD_H_
