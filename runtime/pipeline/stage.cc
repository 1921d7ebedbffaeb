#include "runtime/pipeline/stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"

namespace ember::pipeline {

namespace {

using Key = std::tuple<int, int, int>;
Key KeyOf(ActionType t, int stage, int mb) { return {static_cast<int>(t), stage, mb}; }

Action Make(ActionType t, int stage, int mb) {
  Action a{t};
  a.stage = stage;
  a.micro_batch = mb;
  return a;
}

bool IsCompute(ActionType t) {
  return t == ActionType::kForward || t == ActionType::kBackward ||
         t == ActionType::kBackwardInput || t == ActionType::kBackwardWeight;
}

}  // namespace

PipelineGpt::~PipelineGpt() = default;

absl::StatusOr<std::unique_ptr<PipelineGpt>> PipelineGpt::Create(
    const model::GptConfig& cfg, uint64_t seed, const Schedule& schedule, comm::ProcessGroup* pg,
    int64_t micro_batch_size, int64_t T, PipelineOptions options) {
  RETURN_IF_ERROR(cfg.Validate());
  return Create(model::MakeGptModel(cfg), seed, schedule, pg, micro_batch_size, T, std::move(options));
}

absl::StatusOr<std::unique_ptr<PipelineGpt>> PipelineGpt::Create(
    std::shared_ptr<const model::Model> model, uint64_t seed, const Schedule& schedule, comm::ProcessGroup* pg,
    int64_t micro_batch_size, int64_t T, PipelineOptions options) {
  if (model == nullptr) return absl::InvalidArgumentError("pipeline: no model");
  RETURN_IF_ERROR(ValidateLayout(schedule.options));
  const int S = schedule.options.stages, R = schedule.options.ranks;
  if (model->NumBlocks() % S != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: n_layer (", model->NumBlocks(), ") is not divisible by ", S,
        " stages; use a multiple of ", S, " layers or another stage count"));
  }
  if (micro_batch_size <= 0 || T <= 0 || T > model->Context()) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline: micro-batch ", micro_batch_size,
                                                   " x ", T, " vs context ", model->Context()));
  }
  if (pg == nullptr || pg->size() != R) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: the process group has ", pg ? pg->size() : 0, " ranks, the schedule ", R));
  }
  std::unique_ptr<PipelineGpt> p(new PipelineGpt());
  p->model_ = model;
  p->schedule_ = schedule;
  p->pg_ = pg;
  p->rank_ = pg->rank();
  p->mbs_ = micro_batch_size;
  p->T_ = T;
  p->N_ = micro_batch_size * T;
  DataParallel& dp = options.data;
  if (dp.replicate != nullptr && dp.replicate->size() <= 1) dp.replicate = nullptr;
  if (dp.replicate != nullptr && !dp.shard) {
    return absl::InvalidArgumentError("pipeline: DataParallel::replicate needs shard (HSDP within the stage)");
  }
  if (dp.group == nullptr || dp.group->size() <= 1) {
    // One shard per replica: replicas of whole parameters over the replicate group, if any.
    dp = dp.replicate != nullptr ? DataParallel{dp.replicate, false, nullptr} : DataParallel{};
  }
  p->opts_ = options;
  p->dp_size_ = (dp.group ? dp.group->size() : 1) * (dp.replicate ? dp.replicate->size() : 1);

  fsdp::ShardGroups groups;
  if (dp.group != nullptr) {
    (dp.shard ? groups.shard : groups.replicate) = dp.group;
  }
  if (dp.replicate != nullptr) groups.replicate = dp.replicate;
  fsdp::ShardOptions so;
  so.reshard_after_forward = options.reshard_after_forward;
  so.prefetch = options.prefetch;
  so.reduce_on_backward = false;  // the schedule's ReduceGrad action reduces
  so.mp = options.mp;
  so.seed = seed;
  so.timeout = options.timeout;
  for (int st = p->rank_; st < S; st += R) {
    StageState ss;
    ss.stage = st;
    const model::Part part = model::Part::Stage(*model, st, S);
    ss.driver = std::make_unique<model::Driver>(model, part);
    ASSIGN_OR_RETURN(ss.sharded, fsdp::FullyShard(model, part, groups, so));
    p->stage_ids_.push_back(st);
    p->local_stages_.push_back(std::move(ss));
  }
  // A parameter of both the embedding and the head (GPT's tied wte): a second copy on the last
  // stage when the stages differ.
  for (int e : model->UnitParams(0))
    for (int h : model->UnitParams(model::UnitCount(*model) - 1))
      if (e == h) p->tied_name_ = model->ParamSpecs()[e].name;
  p->tied_copy_ = S > 1 && !p->tied_name_.empty();
  const int first_rank = schedule.RankOfStage(0), last_rank = schedule.RankOfStage(S - 1);
  if (p->tied_copy_ && first_rank != last_rank) {
    ASSIGN_OR_RETURN(p->tied_, pg->NewGroup({first_rank, last_rank}));
  }
  ASSIGN_OR_RETURN(p->pool_, BufferPool::Create(schedule, p->rank_, p->N_ * model->Width(), options.pool));
  return p;
}

std::vector<fsdp::ShardView> PipelineGpt::Shards() {
  std::vector<fsdp::ShardView> out;
  const int S = schedule_.options.stages;
  const DataParallel& dp = opts_.data;
  const bool first_replica = dp.group == nullptr || (dp.shard ? dp.replicate == nullptr || dp.replicate->rank() == 0
                                                               : dp.group->rank() == 0);
  for (StageState& ss : local_stages_) {
    for (fsdp::ShardView& v : ss.sharded->Shards()) {
      v.primary = first_replica && !(tied_copy_ && ss.stage == S - 1 && v.name == tied_name_);
      out.push_back(std::move(v));
    }
  }
  return out;
}

int64_t PipelineGpt::state_bytes() const {
  int64_t b = 0;
  for (const StageState& ss : local_stages_) b += ss.sharded->state_bytes();
  return b;
}

int64_t PipelineGpt::peak_gathered_bytes() const {
  int64_t b = 0;
  for (const StageState& ss : local_stages_) b = std::max(b, ss.sharded->peak_gathered_bytes());
  return b;
}

fsdp::CommBytes PipelineGpt::comm_bytes() const {
  fsdp::CommBytes b;
  for (const StageState& ss : local_stages_) b.Add(ss.sharded->comm_bytes());
  return b;
}

absl::Duration PipelineGpt::comm_wait() const {
  absl::Duration d;
  for (const StageState& ss : local_stages_) d += ss.sharded->comm_wait();
  return d;
}

void PipelineGpt::ResetCommStats() {
  for (StageState& ss : local_stages_) {
    ss.sharded->ResetCommBytes();
    ss.sharded->ResetCommWait();
  }
}

absl::Status PipelineGpt::AllReduceSum(comm::ProcessGroup* g, double* v, const char* what) {
  comm::OpOptions op;
  op.timeout = opts_.timeout;
  op.tag = what;
  return base::Annotate(g->AllReduce(v, 1, comm::DataType::kF64, comm::ReduceOp::kSum, op)->Wait(opts_.timeout),
                        what);
}

absl::Status PipelineGpt::OptimizerStep(const kernels::ExecContext& ctx) {
  const int S = schedule_.options.stages;
  for (StageState& ss : local_stages_) {
    RETURN_IF_ERROR(base::Annotate(ss.sharded->FinishReduce(dp_size_),
                                   absl::StrCat("gradient reduction of stage ", ss.stage, " over ",
                                                dp_size_, " replicas")));
  }
  if (tied_copy_) {  // the two wte copies' gradients (the same rows on both) are summed
    float* g0 = nullptr;
    float* g1 = nullptr;
    int64_t n = 0;
    for (StageState& ss : local_stages_) {
      if (ss.stage == 0) g0 = ss.sharded->GradShard(tied_name_);
      if (ss.stage == S - 1) g1 = ss.sharded->GradShard(tied_name_);
      if (ss.stage == 0 || ss.stage == S - 1) n = ss.sharded->GradShardNumel(tied_name_);
    }
    if (g0 != nullptr && g1 != nullptr) {
      for (int64_t i = 0; i < n; ++i) g0[i] = g1[i] = g0[i] + g1[i];
    } else if (g0 != nullptr || g1 != nullptr) {
      float* g = g0 != nullptr ? g0 : g1;
      RETURN_IF_ERROR(base::Annotate(
          tied_->AllReduce(g, n, comm::DataType::kF32, comm::ReduceOp::kSum, {opts_.timeout, ""})
              ->Wait(opts_.timeout),
          "tied-embedding gradient all-reduce"));
    }
  }
  // One norm over the whole model: this rank's rows of its stages (the tied copy once), summed
  // over the stage group's shards (replicas hold the same rows) and over the pipeline's stages.
  double sumsq = 0;
  for (StageState& ss : local_stages_) {
    std::set<std::string> skip;
    if (tied_copy_ && ss.stage == S - 1) skip.insert(tied_name_);
    sumsq += ss.sharded->GradSumSquares(skip);
  }
  if (opts_.data.group != nullptr && opts_.data.shard)
    RETURN_IF_ERROR(AllReduceSum(opts_.data.group, &sumsq, "gradient norm over the stage group"));
  if (pg_->size() > 1) RETURN_IF_ERROR(AllReduceSum(pg_, &sumsq, "gradient norm over the stages"));
  grad_norm_ = std::sqrt(sumsq);
  float scale = 1.0f;
  if (opts_.clip_norm > 0 && grad_norm_ > opts_.clip_norm) {
    scale = static_cast<float>(opts_.clip_norm / (grad_norm_ + 1e-6));
  }
  ++adam_step_;
  for (StageState& ss : local_stages_) ss.sharded->Step(ctx, opts_.adamw, adam_step_, scale);
  return absl::OkStatus();
}

PipelineGpt::StageState& PipelineGpt::Local(int stage) {
  return local_stages_[stage / schedule_.options.ranks];
}

absl::StatusOr<const float*> PipelineGpt::Received(const Action& recv) {
  auto it = recvs_.find(KeyOf(recv.type, recv.stage, recv.micro_batch));
  if (it == recvs_.end()) {
    return absl::InternalError(absl::StrCat("no receive posted for ", ActionToString(recv)));
  }
  const absl::Time t0 = absl::Now();
  absl::Status st = it->second.first->Wait(opts_.timeout);
  recv_wait_s_ += absl::ToDoubleSeconds(absl::Now() - t0);  // not compute (StepTiming)
  const float* buf = it->second.second;
  recvs_.erase(it);
  RETURN_IF_ERROR(base::Annotate(st, absl::StrCat("receive for ", ActionToString(recv))));
  return buf;
}

absl::StatusOr<float*> PipelineGpt::OutputFor(ActionType send_type, int stage, int mb,
                                              int peer_stage) {
  const int64_t n = N_ * model_->Width();
  if (schedule_.RankOfStage(peer_stage) == rank_) {
    std::vector<float>& v = handover_[KeyOf(send_type, stage, mb)];
    v.resize(n);
    return v.data();
  }
  Action send = Make(send_type, stage, mb);
  send.peer = schedule_.RankOfStage(peer_stage);
  const bool grad = send_type == ActionType::kSendGrad;
  send.tag = MessageTag(grad ? stage - 1 : stage, mb, schedule_.options.micro_batches, grad);
  ASSIGN_OR_RETURN(float* buf, pool_->AcquireSend(send));
  outputs_[KeyOf(send_type, stage, mb)] = buf;
  return buf;
}

absl::Status PipelineGpt::Forward(const kernels::ExecContext& ctx, const Action& a,
                                  const int32_t* tokens, const int32_t* targets) {
  const int s = a.stage, mb = a.micro_batch, S = schedule_.options.stages;
  const int M = schedule_.options.micro_batches;
  StageState& ss = Local(s);
  model::ForwardArgs args;
  args.B = mbs_;
  args.T = T_;
  args.dloss = 1.0f / M;
  args.backward = true;
  std::vector<float> in;  // a same-rank hand-over, kept alive for the call
  if (s == 0) {
    args.tokens = tokens + mb * N_;
  } else if (schedule_.RankOfStage(s - 1) == rank_) {
    auto it = handover_.find(KeyOf(ActionType::kSendActivation, s - 1, mb));
    if (it == handover_.end()) return absl::InternalError("stage input was never produced");
    in = std::move(it->second);
    handover_.erase(it);
    args.x = in.data();
  } else {
    ASSIGN_OR_RETURN(args.x, Received(Make(ActionType::kRecvActivation, s, mb)));
  }
  float* y = nullptr;
  if (s == S - 1) {
    args.targets = targets + mb * N_;
  } else {
    ASSIGN_OR_RETURN(y, OutputFor(ActionType::kSendActivation, s, mb, s + 1));
  }
  ss.sharded->BeginMicroBatch(/*backward=*/true, /*sync=*/false);
  ASSIGN_OR_RETURN(float loss, ss.driver->Forward(ctx, *ss.sharded, args, &mbs_state_[{s, mb}], y));
  if (s == S - 1) loss_sum_ += static_cast<double>(loss) / M;
  return absl::OkStatus();
}

absl::Status PipelineGpt::Backward(const kernels::ExecContext& ctx, const Action& a) {
  const int s = a.stage, mb = a.micro_batch, S = schedule_.options.stages;
  StageState& ss = Local(s);
  auto state = mbs_state_.find({s, mb});
  if (state == mbs_state_.end()) return absl::InternalError("backward before its forward");
  const float* dy = nullptr;
  std::vector<float> in;
  if (s == S - 1) {
    // The head's gradient is in the micro-batch state.
  } else if (schedule_.RankOfStage(s + 1) == rank_) {
    auto it = handover_.find(KeyOf(ActionType::kSendGrad, s + 1, mb));
    if (it == handover_.end()) return absl::InternalError("output gradient was never produced");
    in = std::move(it->second);
    handover_.erase(it);
    dy = in.data();
  } else {
    ASSIGN_OR_RETURN(dy, Received(Make(ActionType::kRecvGrad, s, mb)));
  }
  float* dx = nullptr;
  if (s > 0) {
    ASSIGN_OR_RETURN(dx, OutputFor(ActionType::kSendGrad, s, mb, s - 1));
  }
  const model::BackwardMode mode =
      a.type == ActionType::kBackwardInput ? model::BackwardMode::kInputOnly : model::BackwardMode::kFull;
  ss.sharded->BeginMicroBatch(/*backward=*/true, /*sync=*/false);
  RETURN_IF_ERROR(ss.driver->Backward(ctx, *ss.sharded, &state->second, dy, dx, mode));
  if (mode == model::BackwardMode::kFull) mbs_state_.erase(state);
  return absl::OkStatus();
}

absl::Status PipelineGpt::BackwardWeight(const kernels::ExecContext& ctx, const Action& a) {
  auto state = mbs_state_.find({a.stage, a.micro_batch});
  if (state == mbs_state_.end()) return absl::InternalError("weight-grad before its input-grad");
  StageState& ss = Local(a.stage);
  RETURN_IF_ERROR(ss.driver->BackwardWeight(ctx, *ss.sharded, &state->second));
  mbs_state_.erase(state);
  return absl::OkStatus();
}

absl::StatusOr<double> PipelineGpt::Step(const kernels::ExecContext& ctx, const int32_t* tokens,
                                         const int32_t* targets) {
  RETURN_IF_ERROR(pool_->BeginStep());
  loss_sum_ = 0;
  timing_ = {};
  const absl::Time step_start = absl::Now();
  const size_t n = static_cast<size_t>(N_ * model_->Width());
  comm::OpOptions op;
  op.timeout = opts_.timeout;
  for (const Action& a : schedule_.ranks[rank_]) {
    absl::Status st;
    const bool compute = IsCompute(a.type);
    const absl::Time t0 = compute ? absl::Now() : absl::InfinitePast();
    recv_wait_s_ = 0;
    switch (a.type) {
      case ActionType::kRecvActivation:
      case ActionType::kRecvGrad: {
        absl::StatusOr<float*> buf = pool_->AcquireRecv(a);
        if (!buf.ok()) {
          st = buf.status();
          break;
        }
        recvs_[KeyOf(a.type, a.stage, a.micro_batch)] = {
            pg_->Recv(*buf, n, comm::DataType::kF32, a.peer, a.tag, op), *buf};
        break;
      }
      case ActionType::kSendActivation:
      case ActionType::kSendGrad: {
        auto it = outputs_.find(KeyOf(a.type, a.stage, a.micro_batch));
        if (it == outputs_.end()) {
          st = absl::InternalError("nothing computed to send");
          break;
        }
        std::shared_ptr<comm::Work> w =
            pg_->Send(it->second, n, comm::DataType::kF32, a.peer, a.tag, op);
        outputs_.erase(it);
        st = pool_->HoldUntilSent(a, std::move(w));
        break;
      }
      case ActionType::kForward:
        st = Forward(ctx, a, tokens, targets);
        if (st.ok()) st = pool_->AfterCompute(a);
        break;
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        st = Backward(ctx, a);
        if (st.ok()) st = pool_->AfterCompute(a);
        break;
      case ActionType::kBackwardWeight:
        st = BackwardWeight(ctx, a);
        if (st.ok()) st = pool_->AfterCompute(a);
        break;
      case ActionType::kReduceGrad:
        st = Local(a.stage).sharded->ReduceGradients();
        break;
      case ActionType::kOptimizer:
        st = OptimizerStep(ctx);
        break;
    }
    if (compute) {
      const absl::Time t1 = absl::Now();
      timing_.compute_s += absl::ToDoubleSeconds(t1 - t0) - recv_wait_s_;
      timing_.recv_wait_s += recv_wait_s_;
      timing_.span_s = absl::ToDoubleSeconds(t1 - step_start);
    }
    RETURN_IF_ERROR(base::Annotate(
        st, absl::StrCat("pipeline rank ", rank_, " at ", ActionToString(a))));
  }
  RETURN_IF_ERROR(pool_->EndStep(opts_.timeout));
  if (!recvs_.empty() || !outputs_.empty() || !handover_.empty() || !mbs_state_.empty()) {
    return absl::InternalError(absl::StrCat("pipeline rank ", rank_,
                                            ": the step left data behind (a schedule bug)"));
  }
  double loss = loss_sum_;
  RETURN_IF_ERROR(pg_->Broadcast(&loss, 1, comm::DataType::kF64,
                                 schedule_.RankOfStage(schedule_.options.stages - 1), op)
                      ->Wait(opts_.timeout));
  if (opts_.data.group) {
    RETURN_IF_ERROR(base::Annotate(
        opts_.data.group->AllReduce(&loss, 1, comm::DataType::kF64, comm::ReduceOp::kAvg, op)
            ->Wait(opts_.timeout),
        "loss average over the replicas"));
  }
  if (opts_.data.replicate) {
    RETURN_IF_ERROR(base::Annotate(
        opts_.data.replicate->AllReduce(&loss, 1, comm::DataType::kF64, comm::ReduceOp::kAvg, op)
            ->Wait(opts_.timeout),
        "loss average over the HSDP replicate group"));
  }
  return loss;
}

}  // namespace ember::pipeline
