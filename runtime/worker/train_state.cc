#include "runtime/worker/train_state.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/jobspec/enums.h"
#include "runtime/jobspec/pipeline_layout.h"
#include "runtime/pipeline/schedule.h"
#include "runtime/pipeline/stage.h"

namespace ember::worker {

int64_t Groups::CommMemoryBytes() const {
  size_t n = 0;
  for (const auto* g : {world.get(), reduce_scatter.get(), pipeline.get(), stage.get(), shard.get(), replicate.get()})
    if (g != nullptr) n += g->CommMemoryBytes();
  return static_cast<int64_t>(n);
}

namespace {

// FSDP / HSDP: M micro-batches of forward+backward (the last one reduce-scatters), the loss
// averaged over every rank, the optimizer update.
class FsdpState final : public TrainState {
 public:
  FsdpState(const Plan& plan, std::unique_ptr<fsdp::FsdpGpt> model)
      : plan_(plan), model_(std::move(model)), tok_(plan.spec.batch_size() * plan.model.context),
        tgt_(tok_.size()) {}

  absl::StatusOr<StepResult> Step(const kernels::ExecContext& ctx, data::TokenLoader& loader, int64_t step,
                                  float lr) override {
    const int64_t B = plan_.spec.batch_size(), T = plan_.model.context;
    const int64_t M = plan_.spec.parallelism().micro_batches();
    StepResult r;
    r.set_step(step);
    r.set_lr(lr);
    model_->ResetCommBytes();
    model_->ResetCommWait();
    const absl::Time t0 = absl::Now();
    for (int64_t k = 0; k < M; ++k) {
      RETURN_IF_ERROR(loader.Next(tok_.data(), tgt_.data()));
      ASSIGN_OR_RETURN(float l, model_->ForwardBackward(ctx, tok_.data(), tgt_.data(), B, T, k == M - 1));
      r.set_local_loss(r.local_loss() + static_cast<double>(l) / M);
    }
    ASSIGN_OR_RETURN(const double loss, model_->AllReduceMean(r.local_loss()));
    r.set_loss(loss);
    ASSIGN_OR_RETURN(const double grad_norm, model_->OptimizerStep(ctx, lr));
    r.set_grad_norm(grad_norm);
    r.set_step_s(absl::ToDoubleSeconds(absl::Now() - t0));
    r.set_comm_wait_s(absl::ToDoubleSeconds(model_->comm_wait()));
    SetCommBytes(model_->comm_bytes(), &r);
    return r;
  }

  std::vector<fsdp::ShardView> Shards() override { return model_->Shards(); }
  int64_t optimizer_step() const override { return model_->optimizer_step(); }
  void set_optimizer_step(int64_t s) override { model_->set_optimizer_step(s); }
  int64_t state_bytes() const override { return model_->state_bytes(); }
  std::pair<std::string, std::string> Layout() const override {
    if (model_->shard_world() == model_->world()) return {"fsdp", absl::StrCat(model_->world())};
    return {"hsdp", absl::StrCat("dp_replicate=", model_->world() / model_->shard_world(),
                                 ",dp_shard=", model_->shard_world())};
  }
  absl::StatusOr<double> AllReduceMean(double v) override { return model_->AllReduceMean(v); }
  const model::GptConfig& config() const override { return plan_.model; }

 private:
  const Plan& plan_;
  std::unique_ptr<fsdp::FsdpGpt> model_;
  std::vector<int32_t> tok_, tgt_;
};

// A pipeline replica's rank: PipelineGpt::Step runs the rank's schedule (its stages FSDP-sharded
// over the stage group); the loss it returns is the mean over the global batch on every rank.
class PipelineState final : public TrainState {
 public:
  PipelineState(const Plan& plan, comm::ProcessGroup* world, std::string layout,
                std::unique_ptr<pipeline::PipelineGpt> model)
      : plan_(plan), world_(world), layout_(std::move(layout)), model_(std::move(model)) {
    const spec::PipelineLayout pl = spec::PipelineLayoutOf(plan.spec);
    const size_t n = static_cast<size_t>(plan.spec.batch_size() * pl.micro_batches * plan.model.context);
    tok_.resize(n);
    tgt_.resize(n);
  }

  absl::StatusOr<StepResult> Step(const kernels::ExecContext& ctx, data::TokenLoader& loader, int64_t step,
                                  float lr) override {
    StepResult r;
    r.set_step(step);
    r.set_lr(lr);
    model_->set_learning_rate(lr);
    model_->ResetCommStats();
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(loader.Next(tok_.data(), tgt_.data()));
    ASSIGN_OR_RETURN(const double loss, model_->Step(ctx, tok_.data(), tgt_.data()));
    r.set_loss(loss);
    r.set_local_loss(loss);
    if (std::isfinite(model_->last_grad_norm())) r.set_grad_norm(model_->last_grad_norm());  // NaN: not computed
    r.set_step_s(absl::ToDoubleSeconds(absl::Now() - t0));
    r.set_comm_wait_s(absl::ToDoubleSeconds(model_->comm_wait()));
    SetCommBytes(model_->comm_bytes(), &r);
    return r;
  }

  std::vector<fsdp::ShardView> Shards() override { return model_->Shards(); }
  int64_t optimizer_step() const override { return model_->optimizer_step(); }
  void set_optimizer_step(int64_t s) override { model_->set_optimizer_step(s); }
  int64_t state_bytes() const override { return model_->state_bytes(); }
  std::pair<std::string, std::string> Layout() const override { return {"pipeline", layout_}; }
  absl::StatusOr<double> AllReduceMean(double v) override {
    double x = v;
    RETURN_IF_ERROR(world_->AllReduce(&x, 1, comm::DataType::kF64, comm::ReduceOp::kSum)->Wait());
    return x / world_->size();
  }
  const model::GptConfig& config() const override { return plan_.model; }

 private:
  const Plan& plan_;
  comm::ProcessGroup* world_;
  const std::string layout_;
  std::unique_ptr<pipeline::PipelineGpt> model_;
  std::vector<int32_t> tok_, tgt_;
};

// The pipeline's schedule for the spec's layout (the schedule name parsed once, spec::ScheduleOf).
absl::StatusOr<pipeline::Schedule> PipelineSchedule(const spec::JobSpec& s, const spec::PipelineLayout& pl) {
  using pipeline::ScheduleKind;
  ScheduleKind kind = ScheduleKind::k1F1B;
  switch (spec::ScheduleOf(s)) {
    case spec::Schedule::kGPipe: kind = ScheduleKind::kGPipe; break;
    case spec::Schedule::k1F1B: kind = ScheduleKind::k1F1B; break;
    case spec::Schedule::kInterleaved1F1B: kind = ScheduleKind::kInterleaved1F1B; break;
    case spec::Schedule::kZBH1: kind = ScheduleKind::kZBH1; break;
  }
  return pipeline::BuildSchedule({kind, pl.stages(), pl.ranks, pl.micro_batches});
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainState>> MakeFsdpState(const Plan& plan, const Groups& groups) {
  fsdp::Groups g{groups.world.get(), groups.reduce_scatter.get(), groups.shard.get(), groups.replicate.get()};
  ASSIGN_OR_RETURN(auto model, fsdp::FsdpGpt::Create(plan.arch, g, plan.fsdp));
  return std::unique_ptr<TrainState>(new FsdpState(plan, std::move(model)));
}

absl::StatusOr<std::unique_ptr<TrainState>> MakePipelineState(const Plan& plan, const Groups& groups) {
  const spec::PipelineLayout pl = spec::PipelineLayoutOf(plan.spec);
  const int dp_replicate = std::max(1, plan.dp_replicate);
  const std::string layout = absl::StrCat("stages=", pl.stages(), ",ranks=", pl.ranks, ",schedule=",
                                          pl.schedule, ",micro_batches=", pl.micro_batches,
                                          ",fsdp=", std::max(1, plan.env.world_size / pl.ranks / dp_replicate),
                                          dp_replicate > 1 ? absl::StrCat(",dp_replicate=", dp_replicate) : "");
  ASSIGN_OR_RETURN(pipeline::Schedule schedule, PipelineSchedule(plan.spec, pl));
  pipeline::PipelineOptions po;
  po.adamw = plan.fsdp.adamw;
  po.timeout = absl::Seconds(plan.spec.collective_timeout_s());
  po.data = groups.replicate ? pipeline::DataParallel{groups.shard.get(), /*shard=*/true, groups.replicate.get()}
                             : pipeline::DataParallel{groups.stage.get(), /*shard=*/true};
  po.pool.preallocate = plan.spec.parallelism().pipeline_preallocate();
  po.mp = plan.fsdp.mp;
  po.clip_norm = plan.fsdp.clip_norm;
  po.reshard_after_forward = plan.fsdp.reshard_after_forward;
  po.prefetch = plan.fsdp.prefetch;
  ASSIGN_OR_RETURN(auto model, pipeline::PipelineGpt::Create(plan.arch, plan.fsdp.seed, schedule, groups.pipe(),
                                                             plan.spec.batch_size(), plan.model.context, po));
  return std::unique_ptr<TrainState>(new PipelineState(plan, groups.world.get(), layout, std::move(model)));
}

}  // namespace ember::worker
