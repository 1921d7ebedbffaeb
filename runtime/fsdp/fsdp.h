// FSDP (ZeRO-3, PyTorch FSDP2 `fully_shard` semantics) for the GPT of runtime/model.
//
// Units: unit 0 is the root (wte, [wpe], ln_f, [lm_head]: gathered once per micro-batch for the embeddings
// and the tied LM head, freed after the backward), units 1..L are the transformer blocks. Every
// parameter is sharded on dim 0 across the group with torch.chunk semantics: c = ceil(rows/N)
// rows per rank, rank r holds rows [min(r c, rows), min((r+1) c, rows)), zero-padded to c rows so
// every collective moves equal blocks. Each rank owns fp32 master shards, fp32 gradient shards and
// AdamW state for its rows only, so params + grads + optimizer state shrink ~1/N.
//
// Per micro-batch: all-gather a unit just before its forward (one all-gather per param dtype in
// the unit), free it after the forward (reshard_after_forward), gather it again for the backward,
// accumulate full fp32 gradients, and on the last micro-batch (sync) reduce-scatter them (one
// reduce-scatter per reduce dtype in the unit: see policy.h) into the fp32 gradient shards.
// Overlap: with `prefetch`, unit l+1's all-gather is issued before unit l computes (forward), and
// unit l-1's before unit l's backward. With `separate_reduce_scatter`, reduce-scatters run on a
// second process group (its own executor thread), so they overlap the next unit's backward instead
// of queueing behind all-gathers; they are waited for at the end of the backward.
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
#include "runtime/fsdp/policy.h"
#include "runtime/model/gpt.h"

namespace ember::fsdp {

// torch.chunk on dim 0: rows per rank (ceil) and rank r's [begin, end).
int64_t ChunkRows(int64_t rows, int world);
std::pair<int64_t, int64_t> ShardRows(int64_t rows, int world, int rank);

struct Groups {
  comm::ProcessGroup* world = nullptr;           // all-gathers, loss/norm all-reduces
  comm::ProcessGroup* reduce_scatter = nullptr;  // null: reduce-scatters go on `world`
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
};

// A view of one parameter's local shard (for checkpoints). Pointers stay valid for the life of
// the FsdpGpt; `rows` valid rows start at global row `row_begin`; padding rows are zero.
struct ShardView {
  std::string name;
  std::vector<int64_t> global_shape;
  int64_t row_begin = 0, rows = 0, row_numel = 0;
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

class FsdpGpt {
 public:
  // Validates cfg and the groups (same size), shards and initialises parameters from opts.seed.
  static absl::StatusOr<std::unique_ptr<FsdpGpt>> Create(const model::GptConfig& cfg, Groups groups,
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

  const model::GptConfig& config() const { return cfg_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  int64_t optimizer_step() const { return opt_step_; }
  void set_optimizer_step(int64_t s) { opt_step_ = s; }
  std::vector<ShardView> Shards();
  // Bytes of this rank's persistent state: fp32 param, grad, exp_avg, exp_avg_sq shards.
  int64_t state_bytes() const;
  const CommBytes& comm_bytes() const { return bytes_; }
  void ResetCommBytes() { bytes_ = CommBytes(); }
  // Time the training thread spent in collectives since the last reset: issuing them (the group
  // runs small ones, <= GroupOptions::inline_max_bytes, inline on this thread) plus blocked in
  // Wait().
  absl::Duration comm_wait() const { return comm_wait_; }
  void ResetCommWait() { comm_wait_ = absl::ZeroDuration(); }

  // TEST_: last gathered fp32 compute values / last reduced gradient shard (as received, widened
  // to fp32, before averaging) of a parameter; needs keep_debug_copies.
  std::vector<float> TEST_gathered(const std::string& name) const;
  std::vector<float> TEST_reduced(const std::string& name) const;
  // This rank's unsharded fp32 gradient as it went into the last reduce-scatter.
  std::vector<float> TEST_local_grad(const std::string& name) const;
  ParamPrecision TEST_precision(const std::string& name) const;

  struct Param;
  struct Unit;

 private:
  FsdpGpt(const model::GptConfig& cfg, Groups g, const FsdpOptions& o);
  absl::Status Init();
  void IssueGather(Unit& u);
  absl::Status FinishGather(Unit& u);
  absl::Status EnsureGathered(Unit& u);
  void Reshard(Unit& u);
  void IssueReduceScatter(Unit& u);
  absl::Status FinishReduceScatters();
  absl::Status Wait(const std::shared_ptr<comm::Work>& w);
  absl::StatusOr<float> Run(const kernels::ExecContext& ctx, const int32_t* tokens,
                            const int32_t* targets, int64_t B, int64_t T, bool backward, bool sync);
  std::vector<const float*> Weights(const Unit& u) const;
  std::vector<float*> Grads(Unit& u);

  const model::GptConfig cfg_;
  const Groups groups_;
  const FsdpOptions opts_;
  int rank_ = 0, world_ = 1;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Unit>> units_;  // 0 = root, 1..L = blocks
  std::vector<model::Block> blocks_;
  int64_t opt_step_ = 0;
  int accum_ = 0;  // micro-batches accumulated since the last sync
  std::vector<Unit*> rs_inflight_;
  CommBytes bytes_;
  absl::Duration comm_wait_;
};

}  // namespace ember::fsdp

#endif  // EMBER_RUNTIME_FSDP_FSDP_H_
