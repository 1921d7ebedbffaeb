#include "runtime/fsdp/fsdp.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cross_entropy.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status_macros.h"

namespace ember::fsdp {

using kernels::ExecContext;
using kernels::Tensor;

int64_t ChunkRows(int64_t rows, int world) { return (rows + world - 1) / world; }

std::pair<int64_t, int64_t> ShardRows(int64_t rows, int world, int rank) {
  const int64_t c = ChunkRows(rows, world);
  return {std::min(rank * c, rows), std::min((rank + 1) * c, rows)};
}

int64_t CommBytes::total() const {
  int64_t t = 0;
  for (const auto* m : {&all_gather, &reduce_scatter, &all_reduce})
    for (const auto& [k, v] : *m) t += v;
  return t;
}

namespace {

// n fp32 values -> n values of `t` at `out`.
void Encode(const float* in, int64_t n, DataType t, void* out) {
  if (t == DataType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    if (t == DataType::kBF16) {
      base::CastF32ToBf16(in, o, static_cast<size_t>(n));
    } else {
      base::CastF32ToF16(in, o, static_cast<size_t>(n));
    }
  }
}

void Decode(const void* in, DataType t, float* out, int64_t n) {
  if (t == DataType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(in);
    if (t == DataType::kBF16) {
      base::CastBf16ToF32(p, out, static_cast<size_t>(n));
    } else {
      base::CastF16ToF32(p, out, static_cast<size_t>(n));
    }
  }
}

const char* At(const Tensor& t, int64_t elems, DataType dt) {
  return static_cast<const char*>(const_cast<Tensor&>(t).raw()) + elems * comm::DTypeSize(dt);
}
char* At(Tensor& t, int64_t elems, DataType dt) {
  return static_cast<char*>(t.raw()) + elems * comm::DTypeSize(dt);
}

}  // namespace

struct FsdpGpt::Param {
  model::ParamSpec spec;
  int64_t rows = 0, row_numel = 0, chunk = 0, begin = 0, end = 0;
  ParamPrecision prec;
  Tensor master, grad, m, v;  // [chunk * row_numel] fp32, zero padded
  Tensor full;                // [rows * row_numel] fp32 compute values, while gathered
  Tensor full_grad;           // [rows * row_numel] fp32, from the first backward until the sync
  std::vector<float> dbg_gathered, dbg_reduced, dbg_local;
  int64_t shard_numel() const { return chunk * row_numel; }
};

namespace {
struct Group {
  DataType dt;
  std::vector<FsdpGpt::Param*> params;
  int64_t shard_numel = 0;  // sum of the params' padded shard sizes
};
struct Pending {
  const Group* group;
  Tensor send, recv;
  std::shared_ptr<comm::Work> work;
};
}  // namespace

struct FsdpGpt::Unit {
  std::string name;
  std::vector<Param*> params;
  std::vector<Group> ag, rs;  // by param dtype / by reduce dtype, in order of first appearance
  std::vector<Pending> ag_pending, rs_pending;
  bool gathered = false;
  int64_t rs_numel = 0;
};

FsdpGpt::FsdpGpt(const model::GptConfig& cfg, Groups g, const FsdpOptions& o)
    : cfg_(cfg), groups_(g), opts_(o) {}

FsdpGpt::~FsdpGpt() {
  // Collectives write into our buffers: let them finish before the buffers go.
  for (auto& u : units_) {
    for (auto& p : u->ag_pending) p.work->Wait().IgnoreError();
    for (auto& p : u->rs_pending) p.work->Wait().IgnoreError();
  }
}

absl::StatusOr<std::unique_ptr<FsdpGpt>> FsdpGpt::Create(const model::GptConfig& cfg, Groups groups,
                                                         const FsdpOptions& opts) {
  RETURN_IF_ERROR(cfg.Validate());
  if (groups.world == nullptr) return absl::InvalidArgumentError("FsdpGpt: no world group");
  if (groups.reduce_scatter && (groups.reduce_scatter->size() != groups.world->size() ||
                                groups.reduce_scatter->rank() != groups.world->rank())) {
    return absl::InvalidArgumentError("FsdpGpt: reduce-scatter group differs from the world group");
  }
  std::unique_ptr<FsdpGpt> m(new FsdpGpt(cfg, groups, opts));
  RETURN_IF_ERROR(m->Init());
  return m;
}

absl::Status FsdpGpt::Init() {
  rank_ = groups_.world->rank();
  world_ = groups_.world->size();
  const auto specs = model::ParamSpecs(cfg_);
  std::map<std::string, Param*> by_name;
  for (const auto& s : specs) {
    auto p = std::make_unique<Param>();
    p->spec = s;
    p->rows = s.shape[0];
    p->row_numel = s.numel() / p->rows;
    p->chunk = ChunkRows(p->rows, world_);
    std::tie(p->begin, p->end) = ShardRows(p->rows, world_, rank_);
    p->prec = opts_.mp.Resolve(s.name);
    for (Tensor* t : {&p->master, &p->grad, &p->m, &p->v})
      *t = Tensor::Zeros(kernels::DType::kF32, {p->shard_numel()});
    model::InitParam(s, opts_.seed, p->begin * p->row_numel, (p->end - p->begin) * p->row_numel,
                     p->master.data<float>());
    by_name[s.name] = p.get();
    params_.push_back(std::move(p));
  }
  auto add_unit = [&](std::string name, const std::vector<std::string>& names) {
    auto u = std::make_unique<Unit>();
    u->name = std::move(name);
    for (const auto& n : names) u->params.push_back(by_name.at(n));
    auto add = [](std::vector<Group>& gs, DataType dt, Param* p) {
      for (auto& g : gs)
        if (g.dt == dt) {
          g.params.push_back(p);
          g.shard_numel += p->shard_numel();
          return;
        }
      gs.push_back({dt, {p}, p->shard_numel()});
    };
    for (Param* p : u->params) {
      add(u->ag, p->prec.param_dtype, p);
      add(u->rs, p->prec.reduce_dtype, p);
      u->rs_numel += p->shard_numel();
    }
    units_.push_back(std::move(u));
  };
  add_unit("root", model::RootParamNames(cfg_));
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    std::vector<std::string> names;
    for (const auto& s : model::BlockParamSpecs(cfg_, l)) names.push_back(s.name);
    add_unit(absl::StrCat("blocks.", l), names);
    blocks_.emplace_back(cfg_, l);
  }
  return absl::OkStatus();
}

absl::Status FsdpGpt::Wait(const std::shared_ptr<comm::Work>& w) {
  const absl::Time t0 = absl::Now();
  absl::Status s = w->Wait();
  comm_wait_ += absl::Now() - t0;
  return s;
}

void FsdpGpt::IssueGather(Unit& u) {
  if (u.gathered || !u.ag_pending.empty()) return;
  for (const Group& g : u.ag) {
    Pending p{&g, Tensor::Empty(g.dt, {g.shard_numel}),
              Tensor::Empty(g.dt, {world_ * g.shard_numel}), nullptr};
    int64_t off = 0;
    for (Param* q : g.params) {
      Encode(q->master.data<float>(), q->shard_numel(), g.dt, At(p.send, off, g.dt));
      off += q->shard_numel();
    }
    comm::OpOptions o;
    o.tag = absl::StrCat(u.name, ".all_gather");
    // Issue time counts as comm wait: the group runs small collectives inline on this thread.
    const absl::Time t0 = absl::Now();
    p.work = groups_.world->AllGatherSingle(p.send.raw(), p.recv.raw(), g.shard_numel, g.dt, o);
    comm_wait_ += absl::Now() - t0;
    bytes_.all_gather[comm::DTypeName(g.dt)] +=
        world_ * g.shard_numel * static_cast<int64_t>(comm::DTypeSize(g.dt));
    u.ag_pending.push_back(std::move(p));
  }
}

absl::Status FsdpGpt::FinishGather(Unit& u) {
  for (Pending& p : u.ag_pending) {
    RETURN_IF_ERROR(Wait(p.work));
    const Group& g = *p.group;
    int64_t off = 0;
    for (Param* q : g.params) {
      q->full = Tensor::Empty(kernels::DType::kF32, {q->rows * q->row_numel});
      for (int r = 0; r < world_; ++r) {
        auto [b, e] = ShardRows(q->rows, world_, r);
        Decode(At(p.recv, r * g.shard_numel + off, g.dt), g.dt, q->full.data<float>() + b * q->row_numel,
               (e - b) * q->row_numel);
      }
      if (opts_.keep_debug_copies)
        q->dbg_gathered.assign(q->full.data<float>(), q->full.data<float>() + q->full.numel());
      off += q->shard_numel();
    }
  }
  u.ag_pending.clear();
  u.gathered = true;
  return absl::OkStatus();
}

absl::Status FsdpGpt::EnsureGathered(Unit& u) {
  if (u.gathered) return absl::OkStatus();
  IssueGather(u);
  return FinishGather(u);
}

void FsdpGpt::Reshard(Unit& u) {
  for (Param* q : u.params) q->full.Reset();
  u.gathered = false;
}

void FsdpGpt::IssueReduceScatter(Unit& u) {
  comm::ProcessGroup* pg = groups_.reduce_scatter ? groups_.reduce_scatter : groups_.world;
  for (const Group& g : u.rs) {
    Pending p{&g, Tensor::Zeros(g.dt, {world_ * g.shard_numel}),
              Tensor::Empty(g.dt, {g.shard_numel}), nullptr};
    for (int r = 0; r < world_; ++r) {
      int64_t off = 0;
      for (Param* q : g.params) {
        auto [b, e] = ShardRows(q->rows, world_, r);
        Encode(q->full_grad.data<float>() + b * q->row_numel, (e - b) * q->row_numel, g.dt,
               At(p.send, r * g.shard_numel + off, g.dt));
        off += q->shard_numel();
      }
    }
    comm::OpOptions o;
    o.tag = absl::StrCat(u.name, ".reduce_scatter");
    const absl::Time t0 = absl::Now();  // inline collectives run inside the call (see above)
    p.work = pg->ReduceScatterSingle(p.send.raw(), p.recv.raw(), g.shard_numel, g.dt,
                                     comm::ReduceOp::kSum, o);
    comm_wait_ += absl::Now() - t0;
    const int64_t bytes = world_ * g.shard_numel * static_cast<int64_t>(comm::DTypeSize(g.dt));
    bytes_.reduce_scatter[comm::DTypeName(g.dt)] += bytes;
    if (u.rs.size() == 1) bytes_.reduce_scatter_promoted += bytes;
    u.rs_pending.push_back(std::move(p));
  }
  if (u.rs.size() > 1) bytes_.reduce_scatter_promoted += world_ * u.rs_numel * 4;
  for (Param* q : u.params) {
    if (opts_.keep_debug_copies)
      q->dbg_local.assign(q->full_grad.data<float>(), q->full_grad.data<float>() + q->full_grad.numel());
    q->full_grad.Reset();
  }
  rs_inflight_.push_back(&u);
}

absl::Status FsdpGpt::FinishReduceScatters() {
  const float scale = 1.0f / static_cast<float>(world_ * std::max(accum_, 1));
  std::vector<float> tmp;
  for (Unit* u : rs_inflight_) {
    for (Pending& p : u->rs_pending) {
      RETURN_IF_ERROR(Wait(p.work));
      int64_t off = 0;
      for (Param* q : p.group->params) {
        const int64_t n = q->shard_numel();
        tmp.resize(n);
        Decode(At(p.recv, off, p.group->dt), p.group->dt, tmp.data(), n);
        if (opts_.keep_debug_copies) q->dbg_reduced = tmp;
        float* g = q->grad.data<float>();
        for (int64_t i = 0; i < n; ++i) g[i] += tmp[i] * scale;
        off += n;
      }
    }
    u->rs_pending.clear();
  }
  rs_inflight_.clear();
  accum_ = 0;
  return absl::OkStatus();
}

std::vector<const float*> FsdpGpt::Weights(const Unit& u) const {
  std::vector<const float*> w;
  for (const Param* q : u.params) w.push_back(q->full.data<float>());
  return w;
}

std::vector<float*> FsdpGpt::Grads(Unit& u) {
  std::vector<float*> g;
  for (Param* q : u.params) {
    if (!q->full_grad.defined()) q->full_grad = Tensor::Zeros(kernels::DType::kF32, {q->rows * q->row_numel});
    g.push_back(q->full_grad.data<float>());
  }
  return g;
}

absl::StatusOr<float> FsdpGpt::ForwardBackward(const ExecContext& ctx, const int32_t* tokens,
                                               const int32_t* targets, int64_t B, int64_t T,
                                               bool sync) {
  return Run(ctx, tokens, targets, B, T, /*backward=*/true, sync);
}

absl::StatusOr<float> FsdpGpt::Loss(const ExecContext& ctx, const int32_t* tokens,
                                    const int32_t* targets, int64_t B, int64_t T) {
  return Run(ctx, tokens, targets, B, T, /*backward=*/false, /*sync=*/false);
}

absl::StatusOr<float> FsdpGpt::Run(const ExecContext& ctx, const int32_t* tokens,
                                   const int32_t* targets, int64_t B, int64_t T, bool backward,
                                   bool sync) {
  const int64_t N = B * T, C = cfg_.d_model, V = cfg_.vocab_size, L = cfg_.n_layer;
  if (B <= 0 || T <= 0 || T > cfg_.context)
    return absl::InvalidArgumentError(absl::StrCat("batch ", B, "x", T, " vs context ", cfg_.context));
  for (int64_t n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V)
      return absl::InvalidArgumentError(absl::StrCat("token ", tokens[n], " at ", n, " outside [0, ", V, ")"));
  if (backward) ++accum_;
  const DataType out_dt = opts_.mp.output_dtype;

  Unit& root = *units_[0];
  RETURN_IF_ERROR(EnsureGathered(root));
  if (opts_.prefetch && L > 0) IssueGather(*units_[1]);
  // Root unit, in model::RootParamNames order: wte, [wpe (gpt)], ln_f, [lm_head (untied)].
  auto root_index = [&](const char* name) {
    for (size_t i = 0; i < root.params.size(); ++i)
      if (root.params[i]->spec.name == name) return static_cast<int>(i);
    return -1;
  };
  const int i_wte = root_index("wte.weight"), i_wpe = root_index("wpe.weight");
  const int i_lnf = root_index("ln_f.weight");
  const int i_head = cfg_.tie_embeddings ? i_wte : root_index("lm_head.weight");
  auto full = [&](int i) { return i < 0 ? nullptr : root.params[i]->full.data<float>(); };

  Tensor x = Tensor::Empty(kernels::DType::kF32, {N, C});
  RETURN_IF_ERROR(model::EmbedForward(ctx, cfg_, full(i_wte), full(i_wpe), tokens, B, T, x.data<float>()));
  std::vector<model::BlockActivationsPtr> acts(L);
  for (int64_t l = 1; l <= L; ++l) {
    Unit& u = *units_[l];
    RETURN_IF_ERROR(EnsureGathered(u));
    if (opts_.prefetch && l < L) IssueGather(*units_[l + 1]);
    ASSIGN_OR_RETURN(acts[l - 1], blocks_[l - 1].Forward(ctx, Weights(u), x.data<float>(),
                                                         x.data<float>(), B, T));
    if (!backward) acts[l - 1].reset();
    RoundTo(out_dt, x.data<float>(), N * C);
    // The last block's backward comes right away: keep it gathered (as FSDP2 does).
    if (!backward || (opts_.reshard_after_forward && l < L)) Reshard(u);
  }
  if (!backward) {
    ASSIGN_OR_RETURN(float loss, model::HeadLoss(ctx, cfg_, full(i_lnf), full(i_head), x.data<float>(),
                                                 targets, B, T, 1.0f, nullptr, nullptr, nullptr));
    Reshard(root);
    return loss;
  }
  std::vector<float*> root_grads = Grads(root);
  auto grad = [&](int i) { return i < 0 ? nullptr : root_grads[i]; };
  Tensor dx;
  ASSIGN_OR_RETURN(float loss, model::HeadLoss(ctx, cfg_, full(i_lnf), full(i_head), x.data<float>(),
                                               targets, B, T, 1.0f, &dx, grad(i_lnf), grad(i_head)));
  x.Reset();
  for (int64_t l = L; l >= 1; --l) {
    Unit& u = *units_[l];
    RETURN_IF_ERROR(EnsureGathered(u));
    if (opts_.prefetch && l > 1) IssueGather(*units_[l - 1]);
    std::vector<float*> g = Grads(u);
    RETURN_IF_ERROR(blocks_[l - 1].Backward(ctx, Weights(u), g, std::move(acts[l - 1]),
                                            dx.data<float>(), dx.data<float>()));
    Reshard(u);
    if (sync) IssueReduceScatter(u);
  }
  model::EmbedBackward(ctx, cfg_, tokens, B, T, dx.data<float>(), grad(i_wte), grad(i_wpe));
  Reshard(root);
  if (sync) {
    IssueReduceScatter(root);
    RETURN_IF_ERROR(FinishReduceScatters());
  }
  return loss;
}

absl::StatusOr<double> FsdpGpt::AllReduceMean(double value) {
  double v = value;
  RETURN_IF_ERROR(Wait(groups_.world->AllReduce(&v, 1, DataType::kF64, comm::ReduceOp::kSum)));
  bytes_.all_reduce["f64"] += 8;
  return v / world_;
}

absl::StatusOr<double> FsdpGpt::OptimizerStep(const ExecContext& ctx, float lr) {
  RETURN_IF_ERROR(FinishReduceScatters());
  double sumsq = 0;
  for (const auto& q : params_) {
    const float* g = q->grad.data<float>();
    double s = 0;
    for (int64_t i = 0; i < q->shard_numel(); ++i) s += static_cast<double>(g[i]) * g[i];
    sumsq += s;
  }
  RETURN_IF_ERROR(Wait(groups_.world->AllReduce(&sumsq, 1, DataType::kF64, comm::ReduceOp::kSum)));
  bytes_.all_reduce["f64"] += 8;
  const double norm = std::sqrt(sumsq);
  if (opts_.clip_norm > 0 && norm > opts_.clip_norm) {
    const float scale = static_cast<float>(opts_.clip_norm / (norm + 1e-6));
    for (const auto& q : params_) {
      float* g = q->grad.data<float>();
      for (int64_t i = 0; i < q->shard_numel(); ++i) g[i] *= scale;
    }
  }
  ++opt_step_;
  kernels::AdamWOptions o = opts_.adamw;
  o.lr = lr;
  for (const auto& q : params_) {
    kernels::AdamWStep(ctx, o, opt_step_, q->master.data<float>(), q->grad.data<float>(),
                       q->m.data<float>(), q->v.data<float>(), q->shard_numel());
    std::memset(q->grad.raw(), 0, q->grad.nbytes());
  }
  return norm;
}

std::vector<ShardView> FsdpGpt::Shards() {
  std::vector<ShardView> out;
  for (const auto& q : params_) {
    out.push_back({q->spec.name, q->spec.shape, q->begin, q->end - q->begin, q->row_numel,
                   q->master.data<float>(), q->m.data<float>(), q->v.data<float>()});
  }
  return out;
}

int64_t FsdpGpt::state_bytes() const {
  int64_t b = 0;
  for (const auto& q : params_)
    b += static_cast<int64_t>(q->master.nbytes() + q->grad.nbytes() + q->m.nbytes() + q->v.nbytes());
  return b;
}

std::vector<float> FsdpGpt::TEST_gathered(const std::string& name) const {
  for (const auto& q : params_) if (q->spec.name == name) return q->dbg_gathered;
  return {};
}
std::vector<float> FsdpGpt::TEST_reduced(const std::string& name) const {
  for (const auto& q : params_) if (q->spec.name == name) return q->dbg_reduced;
  return {};
}
std::vector<float> FsdpGpt::TEST_local_grad(const std::string& name) const {
  for (const auto& q : params_) if (q->spec.name == name) return q->dbg_local;
  return {};
}
ParamPrecision FsdpGpt::TEST_precision(const std::string& name) const {
  for (const auto& q : params_) if (q->spec.name == name) return q->prec;
  return {};
}

}  // namespace ember::fsdp
