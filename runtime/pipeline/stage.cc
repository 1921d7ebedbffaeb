#include "runtime/pipeline/stage.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"

namespace ember::pipeline {

struct PipelineGpt::StageState {
  int stage = 0;
  std::vector<model::Block> blocks;
  std::vector<std::vector<int64_t>> offsets;  // per block: its parameters' offsets, in spec order
};

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
  RETURN_IF_ERROR(ValidateLayout(schedule.options));
  const int S = schedule.options.stages, R = schedule.options.ranks;
  if (cfg.n_layer % S != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: n_layer (", cfg.n_layer, ") is not divisible by ", S,
        " stages; use a multiple of ", S, " layers or another stage count"));
  }
  if (micro_batch_size <= 0 || T <= 0 || T > cfg.context) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline: micro-batch ", micro_batch_size,
                                                   " x ", T, " vs context ", cfg.context));
  }
  if (pg == nullptr || pg->size() != R) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: the process group has ", pg ? pg->size() : 0, " ranks, the schedule ", R));
  }
  std::unique_ptr<PipelineGpt> p(new PipelineGpt());
  p->cfg_ = cfg;
  p->schedule_ = schedule;
  p->pg_ = pg;
  p->rank_ = pg->rank();
  p->mbs_ = micro_batch_size;
  p->T_ = T;
  p->N_ = micro_batch_size * T;
  p->opts_ = options;

  // Parameter layout of this rank: [wte, wpe] if it holds stage 0, its stages' blocks, then
  // [ln_f, wte] if it holds the last stage (wte once per rank).
  const std::vector<model::ParamSpec> all = model::ParamSpecs(cfg);
  std::vector<std::pair<model::ParamSpec, int64_t>> layout;
  std::vector<int> owner;  // per layout entry: the stage whose ReduceGrad reduces it
  int64_t total = 0;
  int cur = 0;
  auto add = [&](const model::ParamSpec& spec) {
    layout.emplace_back(spec, total);
    owner.push_back(cur);
    total += spec.numel();
    return layout.back().second;
  };
  const int first_rank = schedule.RankOfStage(0), last_rank = schedule.RankOfStage(S - 1);
  auto spec_named = [&](const std::string& name) {
    for (const model::ParamSpec& sp : all)
      if (sp.name == name) return sp;
    return model::ParamSpec{};
  };
  if (p->rank_ == first_rank) {
    p->wte_ = add(all[0]);
    if (cfg.arch == model::GptConfig::Arch::kGpt) p->wpe_ = add(spec_named("wpe.weight"));
  }
  const int64_t per_stage = cfg.n_layer / S;
  for (int st = p->rank_; st < S; st += R) {
    cur = st;
    auto ss = std::make_unique<StageState>();
    ss->stage = st;
    for (int64_t l = st * per_stage; l < (st + 1) * per_stage; ++l) {
      ss->blocks.emplace_back(cfg, l);
      std::vector<int64_t> offs;
      for (const model::ParamSpec& spec : model::BlockParamSpecs(cfg, l)) offs.push_back(add(spec));
      ss->offsets.push_back(std::move(offs));
    }
    p->stage_ids_.push_back(st);
    p->local_stages_.push_back(std::move(ss));
  }
  if (p->rank_ == last_rank) {
    cur = S - 1;
    p->lnf_ = add(spec_named("ln_f.weight"));
    if (cfg.tie_embeddings) {
      if (p->wte_ < 0) p->wte_ = add(all[0]);
      p->head_ = p->wte_;
    } else {
      p->head_ = add(spec_named("lm_head.weight"));
    }
  }
  p->layout_ = layout;
  p->params_.assign(total, 0.0f);
  for (const auto& [spec, off] : layout) model::InitParam(spec, seed, 0, spec.numel(), p->P(off));
  p->grads_.assign(total, 0.0f);
  RETURN_IF_ERROR(p->PlanReductions(owner, options.data));

  if (first_rank != last_rank && cfg.tie_embeddings) {
    ASSIGN_OR_RETURN(p->tied_, pg->NewGroup({first_rank, last_rank}));
  }
  ASSIGN_OR_RETURN(p->pool_, BufferPool::Create(schedule, p->rank_, p->N_ * cfg.d_model,
                                                options.pool));
  return p;
}

absl::Status PipelineGpt::PlanReductions(const std::vector<int>& owner, DataParallel data) {
  dp_ = data;
  if (dp_.group != nullptr) {
    dp_rank_ = dp_.group->rank();
    dp_size_ = dp_.group->size();
  }
  if (dp_size_ <= 1) dp_ = {};  // one replica: nothing to reduce, every row is this rank's
  const int W = dp_.shard ? dp_size_ : 1, me = dp_.shard ? dp_rank_ : 0;
  slots_.assign(layout_.size(), {});
  int64_t total = 0;
  for (int st : stage_ids_) {
    Reduction& r = reductions_[st];
    r.base = total;
    for (size_t i = 0; i < layout_.size(); ++i) {
      if (owner[i] != st) continue;
      const model::ParamSpec& spec = layout_[i].first;
      Slot& sl = slots_[i];
      sl.stage = st;
      const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
      sl.row_numel = rows > 0 ? spec.numel() / rows : 0;
      sl.total_rows = rows;
      sl.chunk = (rows + W - 1) / W;  // torch.chunk on dim 0, as runtime/fsdp and checkpoints
      const auto [b, e] = sl.Chunk(me);
      sl.row_begin = b;
      sl.rows = e - b;
      sl.shard_off = r.base + r.packed;
      r.params.push_back(static_cast<int>(i));
      r.packed += sl.chunk * sl.row_numel;
    }
    if (dp_.shard) r.wide.assign(static_cast<size_t>(W * r.packed), 0.0f);
    total += r.packed;
  }
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (reductions_.count(owner[i]) == 0 || slots_[i].stage != owner[i]) {
      return absl::InternalError(absl::StrCat("pipeline: parameter ", layout_[i].first.name,
                                              " has no owning stage on rank ", rank_));
    }
  }
  gshard_.assign(total, 0.0f);
  adam_m_.assign(total, 0.0f);
  adam_v_.assign(total, 0.0f);
  return absl::OkStatus();
}

std::vector<ParamView> PipelineGpt::Params() {
  std::vector<ParamView> out;
  const int first_rank = schedule_.RankOfStage(0);
  for (size_t i = 0; i < layout_.size(); ++i) {
    const auto& [spec, off] = layout_[i];
    const Slot& sl = slots_[i];
    ParamView v{spec.name, spec.shape, spec.numel(), P(off), sl.row_begin, sl.rows, sl.row_numel,
                adam_m_.data() + sl.shard_off, adam_v_.data() + sl.shard_off, true};
    v.primary = !(off == wte_ && rank_ != first_rank) && (dp_.shard || dp_rank_ == 0);
    out.push_back(std::move(v));
  }
  return out;
}

absl::Status PipelineGpt::IssueReduce(int stage) {
  auto it = reductions_.find(stage);
  if (it == reductions_.end()) return absl::InternalError("ReduceGrad of a stage not on this rank");
  Reduction& r = it->second;
  // Pack rank j's chunk of every parameter into block j (sharded) or the whole gradient (else).
  const int W = dp_.shard ? dp_size_ : 1;
  float* dst = dp_.shard ? r.wide.data() : gshard_.data() + r.base;
  std::fill(dst, dst + W * r.packed, 0.0f);
  for (int i : r.params) {
    const Slot& sl = slots_[i];
    for (int j = 0; j < W; ++j) {
      const auto [b, e] = sl.Chunk(j);
      std::memcpy(dst + j * r.packed + (sl.shard_off - r.base), G(layout_[i].second) + b * sl.row_numel,
                  static_cast<size_t>((e - b) * sl.row_numel) * sizeof(float));
    }
  }
  if (!dp_.group) return absl::OkStatus();
  comm::OpOptions op;
  op.timeout = opts_.timeout;
  op.tag = absl::StrCat("pipeline ReduceGrad ", stage);
  r.work = dp_.shard ? dp_.group->ReduceScatterSingle(r.wide.data(), gshard_.data() + r.base,
                                                      r.packed, comm::DataType::kF32,
                                                      comm::ReduceOp::kAvg, op)
                     : dp_.group->AllReduce(gshard_.data() + r.base, r.packed, comm::DataType::kF32,
                                            comm::ReduceOp::kAvg, op);
  return absl::OkStatus();
}

absl::Status PipelineGpt::OptimizerStep(const kernels::ExecContext& ctx) {
  for (auto& [stage, r] : reductions_) {
    if (!r.work) continue;
    absl::Status st = r.work->Wait(opts_.timeout);
    r.work.reset();
    RETURN_IF_ERROR(base::Annotate(st, absl::StrCat("gradient reduction of stage ", stage, " over ",
                                                    dp_size_, " replicas")));
  }
  if (tied_) {  // the two wte copies' gradients (their rows on this rank) are summed
    for (size_t i = 0; i < layout_.size(); ++i) {
      if (layout_[i].second != wte_) continue;
      const Slot& sl = slots_[i];
      RETURN_IF_ERROR(base::Annotate(
          tied_->AllReduce(gshard_.data() + sl.shard_off, sl.rows * sl.row_numel,
                           comm::DataType::kF32, comm::ReduceOp::kSum, {opts_.timeout, ""})
              ->Wait(opts_.timeout),
          "tied-embedding gradient all-reduce"));
    }
  }
  ++adam_step_;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const Slot& sl = slots_[i];
    kernels::AdamWStep(ctx, opts_.adamw, adam_step_, P(layout_[i].second) + sl.row_begin * sl.row_numel,
                       gshard_.data() + sl.shard_off, adam_m_.data() + sl.shard_off,
                       adam_v_.data() + sl.shard_off, sl.rows * sl.row_numel);
  }
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  if (!dp_.shard) return absl::OkStatus();
  // Every replica gets every rank's updated rows back.
  comm::OpOptions op;
  op.timeout = opts_.timeout;
  for (auto& [stage, r] : reductions_) {
    std::vector<float> mine(static_cast<size_t>(r.packed), 0.0f);
    for (int i : r.params) {
      const Slot& sl = slots_[i];
      std::memcpy(mine.data() + (sl.shard_off - r.base),
                  P(layout_[i].second) + sl.row_begin * sl.row_numel,
                  static_cast<size_t>(sl.rows * sl.row_numel) * sizeof(float));
    }
    op.tag = absl::StrCat("pipeline all-gather of stage ", stage);
    RETURN_IF_ERROR(base::Annotate(dp_.group->AllGatherSingle(mine.data(), r.wide.data(), r.packed,
                                                              comm::DataType::kF32, op)
                                       ->Wait(opts_.timeout),
                                   op.tag));
    for (int i : r.params) {
      const Slot& sl = slots_[i];
      for (int j = 0; j < dp_size_; ++j) {
        const auto [b, e] = sl.Chunk(j);
        std::memcpy(P(layout_[i].second) + b * sl.row_numel,
                    r.wide.data() + j * r.packed + (sl.shard_off - r.base),
                    static_cast<size_t>((e - b) * sl.row_numel) * sizeof(float));
      }
    }
  }
  return absl::OkStatus();
}

PipelineGpt::StageState& PipelineGpt::Local(int stage) {
  return *local_stages_[stage / schedule_.options.ranks];
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
  const int64_t n = N_ * cfg_.d_model;
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
  const int64_t n = N_ * cfg_.d_model;
  StageState& ss = Local(s);
  std::vector<float> x(n);
  if (s == 0) {
    RETURN_IF_ERROR(model::EmbedForward(ctx, cfg_, P(wte_), wpe_ < 0 ? nullptr : P(wpe_), tokens + mb * N_, mbs_, T_,
                                        x.data()));
  } else if (schedule_.RankOfStage(s - 1) == rank_) {
    auto it = handover_.find(KeyOf(ActionType::kSendActivation, s - 1, mb));
    if (it == handover_.end()) return absl::InternalError("stage input was never produced");
    x = std::move(it->second);
    handover_.erase(it);
  } else {
    ASSIGN_OR_RETURN(const float* in, Received(Make(ActionType::kRecvActivation, s, mb)));
    std::memcpy(x.data(), in, n * sizeof(float));
  }
  std::vector<model::BlockActivationsPtr>& acts = acts_[{s, mb}];
  for (size_t i = 0; i < ss.blocks.size(); ++i) {
    std::vector<const float*> w;
    for (int64_t off : ss.offsets[i]) w.push_back(P(off));
    ASSIGN_OR_RETURN(model::BlockActivationsPtr act,
                     ss.blocks[i].Forward(ctx, w, x.data(), x.data(), mbs_, T_));
    acts.push_back(std::move(act));
  }
  if (s == S - 1) {
    const int M = schedule_.options.micro_batches;
    ASSIGN_OR_RETURN(float loss, model::HeadLoss(ctx, cfg_, P(lnf_), P(head_), x.data(),
                                                 targets + mb * N_, mbs_, T_, 1.0f / M,
                                                 &head_dx_[mb], G(lnf_), G(head_)));
    loss_sum_ += static_cast<double>(loss) / M;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(float* out, OutputFor(ActionType::kSendActivation, s, mb, s + 1));
  std::memcpy(out, x.data(), n * sizeof(float));
  return absl::OkStatus();
}

absl::Status PipelineGpt::Backward(const kernels::ExecContext& ctx, const Action& a,
                                   const int32_t* tokens) {
  const int s = a.stage, mb = a.micro_batch, S = schedule_.options.stages;
  const int64_t n = N_ * cfg_.d_model;
  StageState& ss = Local(s);
  std::vector<float> dx(n);
  if (s == S - 1) {
    auto it = head_dx_.find(mb);
    if (it == head_dx_.end()) return absl::InternalError("backward before the loss");
    std::memcpy(dx.data(), it->second.data<float>(), n * sizeof(float));
    head_dx_.erase(it);
  } else if (schedule_.RankOfStage(s + 1) == rank_) {
    auto it = handover_.find(KeyOf(ActionType::kSendGrad, s + 1, mb));
    if (it == handover_.end()) return absl::InternalError("output gradient was never produced");
    dx = std::move(it->second);
    handover_.erase(it);
  } else {
    ASSIGN_OR_RETURN(const float* in, Received(Make(ActionType::kRecvGrad, s, mb)));
    std::memcpy(dx.data(), in, n * sizeof(float));
  }
  auto acts = acts_.find({s, mb});
  if (acts == acts_.end()) return absl::InternalError("backward before its forward");
  for (size_t i = ss.blocks.size(); i-- > 0;) {
    std::vector<const float*> w;
    std::vector<float*> g;
    for (int64_t off : ss.offsets[i]) {
      w.push_back(P(off));
      g.push_back(G(off));
    }
    if (a.type == ActionType::kBackwardInput) {  // weight gradients wait for BackwardWeight
      ASSIGN_OR_RETURN(model::BlockWeightGradsPtr saved,
                       ss.blocks[i].BackwardInput(ctx, w, g, std::move(acts->second[i]),
                                                  dx.data(), dx.data()));
      wgrads_[{s, mb}].push_back(std::move(saved));
      continue;
    }
    RETURN_IF_ERROR(ss.blocks[i].Backward(ctx, w, g, std::move(acts->second[i]), dx.data(),
                                          dx.data()));
  }
  acts_.erase(acts);
  if (s == 0) {
    model::EmbedBackward(ctx, cfg_, tokens + mb * N_, mbs_, T_, dx.data(), G(wte_), wpe_ < 0 ? nullptr : G(wpe_));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(float* out, OutputFor(ActionType::kSendGrad, s, mb, s - 1));
  std::memcpy(out, dx.data(), n * sizeof(float));
  return absl::OkStatus();
}

absl::Status PipelineGpt::BackwardWeight(const kernels::ExecContext& ctx, const Action& a) {
  auto it = wgrads_.find({a.stage, a.micro_batch});
  if (it == wgrads_.end()) return absl::InternalError("weight-grad before its input-grad");
  StageState& ss = Local(a.stage);
  // wgrads_ holds the blocks last to first, as BackwardInput ran them.
  for (size_t j = 0; j < it->second.size(); ++j) {
    const size_t i = ss.blocks.size() - 1 - j;
    std::vector<float*> g;
    for (int64_t off : ss.offsets[i]) g.push_back(G(off));
    RETURN_IF_ERROR(ss.blocks[i].BackwardWeight(ctx, g, std::move(it->second[j])));
  }
  wgrads_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<double> PipelineGpt::Step(const kernels::ExecContext& ctx, const int32_t* tokens,
                                         const int32_t* targets) {
  RETURN_IF_ERROR(pool_->BeginStep());
  loss_sum_ = 0;
  timing_ = {};
  const absl::Time step_start = absl::Now();
  const size_t n = static_cast<size_t>(N_ * cfg_.d_model);
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
        st = Backward(ctx, a, tokens);
        if (st.ok()) st = pool_->AfterCompute(a);
        break;
      case ActionType::kBackwardWeight:
        st = BackwardWeight(ctx, a);
        if (st.ok()) st = pool_->AfterCompute(a);
        break;
      case ActionType::kReduceGrad:
        st = IssueReduce(a.stage);
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
  if (!recvs_.empty() || !outputs_.empty() || !handover_.empty() || !acts_.empty() ||
      !head_dx_.empty() || !wgrads_.empty()) {
    return absl::InternalError(absl::StrCat("pipeline rank ", rank_,
                                            ": the step left data behind (a schedule bug)"));
  }
  double loss = loss_sum_;
  RETURN_IF_ERROR(pg_->Broadcast(&loss, 1, comm::DataType::kF64,
                                 schedule_.RankOfStage(schedule_.options.stages - 1), op)
                      ->Wait(opts_.timeout));
  if (dp_.group) {
    RETURN_IF_ERROR(base::Annotate(
        dp_.group->AllReduce(&loss, 1, comm::DataType::kF64, comm::ReduceOp::kAvg, op)
            ->Wait(opts_.timeout),
        "loss average over the replicas"));
  }
  return loss;
}

}  // namespace ember::pipeline
