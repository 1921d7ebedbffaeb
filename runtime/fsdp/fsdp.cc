#include "runtime/fsdp/fsdp.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"

namespace ember::fsdp {

using kernels::ExecContext;

FsdpGpt::FsdpGpt(std::shared_ptr<const model::Model> model, Groups g, const FsdpOptions& o)
    : model_(std::move(model)), groups_(g), opts_(o) {}

FsdpGpt::~FsdpGpt() = default;

absl::StatusOr<std::unique_ptr<FsdpGpt>> FsdpGpt::Create(const model::GptConfig& cfg, Groups groups,
                                                         const FsdpOptions& opts) {
  RETURN_IF_ERROR(cfg.Validate());
  return Create(model::MakeGptModel(cfg), groups, opts);
}

absl::StatusOr<std::unique_ptr<FsdpGpt>> FsdpGpt::Create(std::shared_ptr<const model::Model> model, Groups groups,
                                                         const FsdpOptions& opts) {
  if (model == nullptr) return absl::InvalidArgumentError("FsdpGpt: no model");
  if (groups.world == nullptr) return absl::InvalidArgumentError("FsdpGpt: no world group");
  comm::ProcessGroup* shard = groups.shard ? groups.shard : groups.world;
  const int replicas = groups.replicate ? groups.replicate->size() : 1;
  if (shard->size() * replicas != groups.world->size()) {
    return absl::InvalidArgumentError(absl::StrCat("FsdpGpt: ", shard->size(), " shard ranks x ", replicas,
                                                   " replicas != ", groups.world->size(), " ranks"));
  }
  std::unique_ptr<FsdpGpt> m(new FsdpGpt(model, groups, opts));
  m->world_ = groups.world->size();
  ShardOptions so;
  so.reshard_after_forward = opts.reshard_after_forward;
  so.prefetch = opts.prefetch;
  so.reduce_on_backward = true;
  so.mp = opts.mp;
  so.seed = opts.seed;
  so.keep_debug_copies = opts.keep_debug_copies;
  const model::Part whole = model::Part::Whole(*model);
  ASSIGN_OR_RETURN(m->sharded_, FullyShard(model, whole, {shard, groups.reduce_scatter, groups.replicate}, so));
  m->driver_ = std::make_unique<const model::Driver>(model, whole);
  return m;
}

absl::StatusOr<float> FsdpGpt::ForwardBackward(const ExecContext& ctx, const int32_t* tokens,
                                               const int32_t* targets, int64_t B, int64_t T,
                                               bool sync) {
  ++accum_;
  sharded_->BeginMicroBatch(/*backward=*/true, sync);
  model::MicroBatch mb;
  ASSIGN_OR_RETURN(float loss, driver_->Forward(ctx, *sharded_, {.tokens = tokens, .targets = targets, .B = B,
                                                                  .T = T, .dloss = 1.0f, .backward = true},
                                                &mb, nullptr));
  RETURN_IF_ERROR(driver_->Backward(ctx, *sharded_, &mb, nullptr, nullptr));
  if (sync) {
    // Averaged over every data-parallel rank and the micro-batches since the last sync.
    RETURN_IF_ERROR(sharded_->FinishReduce(static_cast<double>(world_) * accum_));
    accum_ = 0;
  }
  return loss;
}

absl::StatusOr<float> FsdpGpt::Loss(const ExecContext& ctx, const int32_t* tokens,
                                    const int32_t* targets, int64_t B, int64_t T) {
  sharded_->BeginMicroBatch(/*backward=*/false, /*sync=*/false);
  model::MicroBatch mb;
  return driver_->Forward(ctx, *sharded_, {.tokens = tokens, .targets = targets, .B = B, .T = T,
                                           .dloss = 1.0f, .backward = false},
                          &mb, nullptr);
}

absl::StatusOr<double> FsdpGpt::AllReduceMean(double value) {
  double v = value;
  // Issue time counts as comm wait too: a scalar all-reduce runs inline on this thread, and its
  // issue is where a rank waits for a slower one (the straggler mark on the job page reads it).
  const absl::Time t0 = absl::Now();
  auto work = groups_.world->AllReduce(&v, 1, DataType::kF64, comm::ReduceOp::kSum);
  absl::Status st = work->Wait();
  sharded_->AddCommWait(absl::Now() - t0);
  RETURN_IF_ERROR(st);
  extra_bytes_.all_reduce["f64"] += 8;
  return v / world_;
}

absl::StatusOr<double> FsdpGpt::OptimizerStep(const ExecContext& ctx, float lr) {
  RETURN_IF_ERROR(sharded_->FinishReduce(static_cast<double>(world_) * std::max(accum_, 1)));
  accum_ = 0;
  // Replicas hold the same gradient rows: the norm sums over one shard group.
  double sumsq = sharded_->GradSumSquares();
  comm::ProcessGroup* shard = groups_.shard ? groups_.shard : groups_.world;
  const absl::Time t0 = absl::Now();  // issue time counts (inline), as in AllReduceMean
  auto work = shard->AllReduce(&sumsq, 1, DataType::kF64, comm::ReduceOp::kSum);
  absl::Status st = work->Wait();
  sharded_->AddCommWait(absl::Now() - t0);
  RETURN_IF_ERROR(st);
  extra_bytes_.all_reduce["f64"] += 8;
  const double norm = std::sqrt(sumsq);
  float scale = 1.0f;
  if (opts_.clip_norm > 0 && norm > opts_.clip_norm) scale = static_cast<float>(opts_.clip_norm / (norm + 1e-6));
  ++opt_step_;
  kernels::AdamWOptions o = opts_.adamw;
  o.lr = lr;
  sharded_->Step(ctx, o, opt_step_, scale);
  return norm;
}

std::vector<ShardView> FsdpGpt::Shards() {
  std::vector<ShardView> out = sharded_->Shards();
  const bool first_replica = groups_.replicate == nullptr || groups_.replicate->rank() == 0;
  for (ShardView& v : out) v.primary = first_replica;
  return out;
}

CommBytes FsdpGpt::comm_bytes() const {
  CommBytes b = sharded_->comm_bytes();
  b.Add(extra_bytes_);
  return b;
}

void FsdpGpt::ResetCommBytes() {
  sharded_->ResetCommBytes();
  extra_bytes_ = CommBytes();
}

std::vector<float> FsdpGpt::TEST_gathered(const std::string& name) const { return sharded_->TEST_gathered(name); }
std::vector<float> FsdpGpt::TEST_reduced(const std::string& name) const { return sharded_->TEST_reduced(name); }
std::vector<float> FsdpGpt::TEST_local_grad(const std::string& name) const { return sharded_->TEST_local_grad(name); }
ParamPrecision FsdpGpt::TEST_precision(const std::string& name) const { return sharded_->TEST_precision(name); }

}  // namespace ember::fsdp
