#include "runtime/fsdp/fully_shard.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/dtype.h"
#include "runtime/base/status_macros.h"

namespace ember::fsdp {

using kernels::ExecContext;
using kernels::Tensor;
using model::Phase;

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

void CommBytes::Add(const CommBytes& o) {
  for (const auto& [k, v] : o.all_gather) all_gather[k] += v;
  for (const auto& [k, v] : o.reduce_scatter) reduce_scatter[k] += v;
  for (const auto& [k, v] : o.all_reduce) all_reduce[k] += v;
  reduce_scatter_promoted += o.reduce_scatter_promoted;
}

namespace {

// n fp32 values -> n values of `t` at `out`.
void Encode(const float* in, int64_t n, DataType t, void* out) {
  if (t == DataType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
  } else if (t == DataType::kBF16) {
    base::CastF32ToBf16(in, static_cast<uint16_t*>(out), static_cast<size_t>(n));
  } else {
    base::CastF32ToF16(in, static_cast<uint16_t*>(out), static_cast<size_t>(n));
  }
}

void Decode(const void* in, DataType t, float* out, int64_t n) {
  if (t == DataType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
  } else if (t == DataType::kBF16) {
    base::CastBf16ToF32(static_cast<const uint16_t*>(in), out, static_cast<size_t>(n));
  } else {
    base::CastF16ToF32(static_cast<const uint16_t*>(in), out, static_cast<size_t>(n));
  }
}

const char* At(const Tensor& t, int64_t elems, DataType dt) {
  return static_cast<const char*>(const_cast<Tensor&>(t).raw()) + elems * comm::DTypeSize(dt);
}
char* At(Tensor& t, int64_t elems, DataType dt) {
  return static_cast<char*>(t.raw()) + elems * comm::DTypeSize(dt);
}

}  // namespace

struct ShardedPart::Param {
  model::ParamSpec spec;
  int64_t rows = 0, row_numel = 0, chunk = 0, begin = 0, end = 0;
  ParamPrecision prec;
  Tensor master, grad, m, v;  // [chunk * row_numel] fp32, zero padded
  Tensor full;                // [rows * row_numel] fp32 compute values, while gathered
  const float* view = nullptr;  // instead of `full`: the master itself (one rank, fp32: no copy)
  Tensor full_grad;           // [rows * row_numel] fp32, from the first backward until reduced
  std::vector<float> dbg_gathered, dbg_reduced, dbg_local;
  int64_t shard_numel() const { return chunk * row_numel; }
};

namespace {
struct Group {
  DataType dt;
  std::vector<ShardedPart::Param*> params;
  int64_t shard_numel = 0;  // sum of the params' padded shard sizes
};
struct Pending {
  const Group* group;
  Tensor send, recv;
  std::shared_ptr<comm::Work> work;
};
}  // namespace

struct ShardedPart::Unit {
  std::string name;
  std::vector<Param*> params;
  std::vector<Group> ag, rs;  // by param dtype / by reduce dtype, in order of first appearance
  std::vector<Pending> ag_pending, rs_pending;
  bool gathered = false;
  int64_t rs_numel = 0;
};

ShardedPart::ShardedPart(std::shared_ptr<const model::Model> model, model::Part part, ShardGroups g,
                         const ShardOptions& o)
    : model_(std::move(model)), part_(part), groups_(g), opts_(o) {}

ShardedPart::~ShardedPart() {
  // Collectives write into our buffers: let them finish before the buffers go.
  for (auto& u : units_) {
    for (auto& p : u->ag_pending)
      if (p.work) p.work->Wait().IgnoreError();
    for (auto& p : u->rs_pending)
      if (p.work) p.work->Wait().IgnoreError();
  }
}

absl::StatusOr<std::unique_ptr<ShardedPart>> FullyShard(std::shared_ptr<const model::Model> model, model::Part part,
                                                        ShardGroups groups, const ShardOptions& opts) {
  if (model == nullptr) return absl::InvalidArgumentError("FullyShard: no model");
  if (groups.reduce_scatter && (groups.shard == nullptr || groups.reduce_scatter->size() != groups.shard->size() ||
                                groups.reduce_scatter->rank() != groups.shard->rank())) {
    return absl::InvalidArgumentError("FullyShard: the reduce-scatter group differs from the shard group");
  }
  if (part.first < 0 || part.last >= model::UnitCount(*model) || part.first > part.last) {
    return absl::InvalidArgumentError(absl::StrCat("FullyShard: units ", part.first, "..", part.last,
                                                   " of a model with ", model::UnitCount(*model)));
  }
  std::unique_ptr<ShardedPart> m(new ShardedPart(std::move(model), part, groups, opts));
  RETURN_IF_ERROR(m->Init());
  return m;
}

absl::Status ShardedPart::Init() {
  rank_ = groups_.shard ? groups_.shard->rank() : 0;
  world_ = groups_.shard ? groups_.shard->size() : 1;
  const std::vector<model::ParamSpec>& specs = model_->ParamSpecs();
  auto param = [&](int index) {
    auto it = by_index_.find(index);
    if (it != by_index_.end()) return it->second;
    auto p = std::make_unique<Param>();
    const model::ParamSpec& s = specs[index];
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
    Param* raw = p.get();
    by_index_[index] = raw;
    params_.push_back(std::move(p));
    return raw;
  };
  auto add_params = [&](Unit* u, int du) {
    for (int index : model_->UnitParams(du)) {
      Param* p = param(index);
      bool have = false;
      for (Param* q : u->params) have = have || q == p;
      if (!have) u->params.push_back(p);
    }
    unit_of_[du] = u;
    if (first_use_.count(u) == 0) first_use_[u] = du;
    last_use_[u] = du;
  };
  const int head = model::UnitCount(*model_) - 1;
  Unit* root = nullptr;
  if (part_.has_embed() || part_.has_head(*model_)) {
    units_.push_back(std::make_unique<Unit>());
    root = units_.back().get();
    root->name = "root";
  }
  for (int du = part_.first; du <= part_.last; ++du) {
    if (du == 0 || du == head) {
      add_params(root, du);
      continue;
    }
    units_.push_back(std::make_unique<Unit>());
    units_.back()->name = model::UnitName(*model_, du);
    add_params(units_.back().get(), du);
  }
  for (auto& u : units_) {
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
  }
  return absl::OkStatus();
}

ShardedPart::Unit* ShardedPart::UnitOf(int du) const {
  auto it = unit_of_.find(du);
  return it == unit_of_.end() ? nullptr : it->second;
}

absl::Status ShardedPart::Wait(const std::shared_ptr<comm::Work>& w) {
  const absl::Time t0 = absl::Now();
  // The op itself times out (OpOptions::timeout, the group's by default).
  absl::Status s = opts_.timeout == absl::ZeroDuration() ? w->Wait() : w->Wait(opts_.timeout);
  comm_wait_ += absl::Now() - t0;
  return s;
}

void ShardedPart::IssueGather(Unit& u) {
  if (u.gathered || !u.ag_pending.empty()) return;
  for (const Group& g : u.ag) {
    if (groups_.shard == nullptr && g.dt == DataType::kF32) {
      // One rank in fp32: the master is the whole parameter already; compute reads it in place.
      for (Param* q : g.params) q->view = q->master.data<float>();
      continue;
    }
    Pending p{&g, Tensor::Empty(g.dt, {g.shard_numel}), Tensor::Empty(g.dt, {world_ * g.shard_numel}), nullptr};
    int64_t off = 0;
    for (Param* q : g.params) {
      Encode(q->master.data<float>(), q->shard_numel(), g.dt, At(p.send, off, g.dt));
      off += q->shard_numel();
    }
    comm::OpOptions o;
    o.tag = absl::StrCat(u.name, ".all_gather");
    o.timeout = opts_.timeout;
    // Issue time counts as comm wait: the group runs small collectives inline on this thread.
    if (groups_.shard == nullptr) {  // one rank: the shard is the whole parameter
      std::memcpy(p.recv.raw(), p.send.raw(), p.send.nbytes());
    } else {
      const absl::Time t0 = absl::Now();
      p.work = groups_.shard->AllGatherSingle(p.send.raw(), p.recv.raw(), g.shard_numel, g.dt, o);
      comm_wait_ += absl::Now() - t0;
    }
    if (groups_.shard != nullptr)
      bytes_.all_gather[comm::DTypeName(g.dt)] += world_ * g.shard_numel * static_cast<int64_t>(comm::DTypeSize(g.dt));
    u.ag_pending.push_back(std::move(p));
  }
}

absl::Status ShardedPart::FinishGather(Unit& u) {
  if (opts_.keep_debug_copies)
    for (Param* q : u.params)
      if (q->view != nullptr) q->dbg_gathered.assign(q->view, q->view + q->rows * q->row_numel);
  for (Pending& p : u.ag_pending) {
    if (p.work) RETURN_IF_ERROR(base::Annotate(Wait(p.work), absl::StrCat("all-gather of ", u.name)));
    const Group& g = *p.group;
    int64_t off = 0;
    for (Param* q : g.params) {
      q->full = Tensor::Empty(kernels::DType::kF32, {q->rows * q->row_numel});
      gathered_bytes_ += static_cast<int64_t>(q->full.nbytes());
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
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  u.ag_pending.clear();
  u.gathered = true;
  return absl::OkStatus();
}

absl::Status ShardedPart::EnsureGathered(Unit& u) {
  if (u.gathered) return absl::OkStatus();
  IssueGather(u);
  return FinishGather(u);
}

void ShardedPart::Reshard(Unit& u) {
  for (Param* q : u.params) {
    if (q->full.defined()) gathered_bytes_ -= static_cast<int64_t>(q->full.nbytes());
    q->full.Reset();
    q->view = nullptr;
  }
  u.gathered = false;
}

void ShardedPart::BeginMicroBatch(bool backward, bool sync) {
  backward_ = backward;
  sync_ = sync;
}

absl::Status ShardedPart::Before(Phase phase, int du) {
  Unit* u = UnitOf(du);
  if (u == nullptr) return absl::InternalError(absl::StrCat("FullyShard: unit ", du, " is not in this part"));
  if (phase == Phase::kForward) {
    RETURN_IF_ERROR(EnsureGathered(*u));
    if (opts_.prefetch) {
      for (int next = du + 1; next <= part_.last; ++next) {
        Unit* n = UnitOf(next);
        if (n == u) continue;
        IssueGather(*n);
        break;
      }
    }
    return absl::OkStatus();
  }
  // Only the blocks read weights in their backward: the embedding's backward is a scatter-add of
  // the gradient, and the head computed its gradients with its forward.
  if (phase != Phase::kBackward || !IsBlock(du)) return absl::OkStatus();
  RETURN_IF_ERROR(EnsureGathered(*u));
  if (opts_.prefetch && du - 1 >= part_.first && IsBlock(du - 1)) IssueGather(*UnitOf(du - 1));
  return absl::OkStatus();
}

absl::Status ShardedPart::After(Phase phase, int du, float* x, int64_t n) {
  Unit* u = UnitOf(du);
  if (u == nullptr) return absl::InternalError(absl::StrCat("FullyShard: unit ", du, " is not in this part"));
  if (phase == Phase::kForward) {
    if (IsBlock(du) && x != nullptr) RoundTo(opts_.mp.output_dtype, x, n);
    if (du != last_use_[u]) return absl::OkStatus();
    // The root's weights are not read in the backward (see Before): free them after their last
    // forward use. The last block of a part that ends with the head is needed again right away
    // (kept, as FSDP2 does).
    if (!IsBlock(du)) {
      Reshard(*u);
      return absl::OkStatus();
    }
    const bool backward_next = part_.has_head(*model_) && du == part_.last - 1;
    if (!backward_ || (opts_.reshard_after_forward && !backward_next)) Reshard(*u);
    return absl::OkStatus();
  }
  if (phase == Phase::kBackwardWeight && opts_.reduce_on_backward) {
    return absl::FailedPreconditionError(
        "FullyShard: a split backward needs reduce_on_backward off (the caller reduces after the weight gradients)");
  }
  if (phase != Phase::kBackward || du != first_use_[u]) return absl::OkStatus();
  if (u->gathered) Reshard(*u);
  if (opts_.reduce_on_backward && sync_) IssueReduceScatter(*u);
  return absl::OkStatus();
}

const float* ShardedPart::Weight(int p) {
  auto it = by_index_.find(p);
  if (it == by_index_.end() || (!it->second->full.defined() && it->second->view == nullptr)) {
    // A driver/hook protocol bug, never input-dependent: fail loudly rather than read freed memory.
    std::fprintf(stderr, "FullyShard: weight %d read while not gathered\n", p);
    std::abort();
  }
  return it->second->view != nullptr ? it->second->view : it->second->full.data<float>();
}

float* ShardedPart::Grad(int p) {
  auto it = by_index_.find(p);
  if (it == by_index_.end()) {
    std::fprintf(stderr, "FullyShard: gradient of parameter %d, not in this part\n", p);
    std::abort();
  }
  Param* q = it->second;
  if (!q->full_grad.defined()) q->full_grad = Tensor::Zeros(kernels::DType::kF32, {q->rows * q->row_numel});
  return q->full_grad.data<float>();
}

void ShardedPart::IssueReduceScatter(Unit& u) {
  comm::ProcessGroup* pg = groups_.reduce_scatter ? groups_.reduce_scatter : groups_.shard;
  for (Param* q : u.params)
    if (!q->full_grad.defined()) q->full_grad = Tensor::Zeros(kernels::DType::kF32, {q->rows * q->row_numel});
  for (const Group& g : u.rs) {
    Pending p{&g, Tensor::Zeros(g.dt, {world_ * g.shard_numel}), Tensor::Empty(g.dt, {g.shard_numel}), nullptr};
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
    o.timeout = opts_.timeout;
    if (pg == nullptr) {
      std::memcpy(p.recv.raw(), p.send.raw(), p.recv.nbytes());
    } else {
      const absl::Time t0 = absl::Now();  // inline collectives run inside the call (see above)
      p.work = pg->ReduceScatterSingle(p.send.raw(), p.recv.raw(), g.shard_numel, g.dt, comm::ReduceOp::kSum, o);
      comm_wait_ += absl::Now() - t0;
    }
    const int64_t bytes = pg == nullptr ? 0 : world_ * g.shard_numel * static_cast<int64_t>(comm::DTypeSize(g.dt));
    bytes_.reduce_scatter[comm::DTypeName(g.dt)] += bytes;
    if (u.rs.size() == 1) bytes_.reduce_scatter_promoted += bytes;
    u.rs_pending.push_back(std::move(p));
  }
  if (u.rs.size() > 1 && pg != nullptr) bytes_.reduce_scatter_promoted += world_ * u.rs_numel * 4;
  for (Param* q : u.params) {
    if (opts_.keep_debug_copies)
      q->dbg_local.assign(q->full_grad.data<float>(), q->full_grad.data<float>() + q->full_grad.numel());
    q->full_grad.Reset();
  }
  rs_inflight_.push_back(&u);
}

absl::Status ShardedPart::ReduceGradients() {
  for (auto& u : units_) IssueReduceScatter(*u);
  return absl::OkStatus();
}

absl::Status ShardedPart::FinishReduce(double divisor) {
  const float scale = static_cast<float>(1.0 / divisor);
  const bool hsdp = groups_.replicate != nullptr && groups_.replicate->size() > 1;
  std::vector<float> tmp;
  for (Unit* u : rs_inflight_) {
    for (Pending& p : u->rs_pending) {
      if (p.work) RETURN_IF_ERROR(base::Annotate(Wait(p.work), absl::StrCat("reduce-scatter of ", u->name)));
      const Group& g = *p.group;
      tmp.resize(g.shard_numel);
      Decode(p.recv.raw(), g.dt, tmp.data(), g.shard_numel);
      if (hsdp) {  // the replicas' sums of the same rows, summed (fp32)
        comm::OpOptions o;
        o.tag = absl::StrCat(u->name, ".replicate_all_reduce");
        o.timeout = opts_.timeout;
        const absl::Time t0 = absl::Now();
        auto w = groups_.replicate->AllReduce(tmp.data(), g.shard_numel, DataType::kF32, comm::ReduceOp::kSum, o);
        comm_wait_ += absl::Now() - t0;
        RETURN_IF_ERROR(base::Annotate(Wait(w), o.tag));
        bytes_.all_reduce["f32"] += g.shard_numel * 4;
      }
      int64_t off = 0;
      for (Param* q : g.params) {
        const int64_t n = q->shard_numel();
        if (opts_.keep_debug_copies) q->dbg_reduced.assign(tmp.data() + off, tmp.data() + off + n);
        float* gr = q->grad.data<float>();
        for (int64_t i = 0; i < n; ++i) gr[i] += tmp[off + i] * scale;
        off += n;
      }
    }
    u->rs_pending.clear();
  }
  rs_inflight_.clear();
  return absl::OkStatus();
}

double ShardedPart::GradSumSquares(const std::set<std::string>& skip) const {
  double sumsq = 0;
  for (const auto& q : params_) {
    if (skip.count(q->spec.name) != 0) continue;
    const float* g = q->grad.data<float>();
    double s = 0;
    for (int64_t i = 0; i < q->shard_numel(); ++i) s += static_cast<double>(g[i]) * g[i];
    sumsq += s;
  }
  return sumsq;
}

const ShardedPart::Param* ShardedPart::Find(const std::string& name) const {
  for (const auto& q : params_)
    if (q->spec.name == name) return q.get();
  return nullptr;
}

float* ShardedPart::GradShard(const std::string& name) {
  const Param* q = Find(name);
  return q == nullptr ? nullptr : const_cast<Param*>(q)->grad.data<float>();
}

int64_t ShardedPart::GradShardNumel(const std::string& name) const {
  const Param* q = Find(name);
  return q == nullptr ? 0 : q->shard_numel();
}

void ShardedPart::Step(const ExecContext& ctx, const kernels::AdamWOptions& adamw, int64_t step,
                       float grad_scale) {
  for (const auto& q : params_) {
    float* g = q->grad.data<float>();
    if (grad_scale != 1.0f)
      for (int64_t i = 0; i < q->shard_numel(); ++i) g[i] *= grad_scale;
    kernels::AdamWStep(ctx, adamw, step, q->master.data<float>(), g, q->m.data<float>(), q->v.data<float>(),
                       q->shard_numel());
    std::memset(q->grad.raw(), 0, q->grad.nbytes());
  }
}

std::vector<ShardView> ShardedPart::Shards() {
  std::vector<ShardView> out;
  for (const auto& q : params_) {
    out.push_back({q->spec.name, q->spec.shape, q->begin, q->end - q->begin, q->row_numel,
                   q->master.data<float>(), q->m.data<float>(), q->v.data<float>(), true});
  }
  return out;
}

int64_t ShardedPart::state_bytes() const {
  int64_t b = 0;
  for (const auto& q : params_)
    b += static_cast<int64_t>(q->master.nbytes() + q->grad.nbytes() + q->m.nbytes() + q->v.nbytes());
  return b;
}

std::vector<float> ShardedPart::TEST_gathered(const std::string& name) const {
  const Param* q = Find(name);
  return q ? q->dbg_gathered : std::vector<float>{};
}
std::vector<float> ShardedPart::TEST_reduced(const std::string& name) const {
  const Param* q = Find(name);
  return q ? q->dbg_reduced : std::vector<float>{};
}
std::vector<float> ShardedPart::TEST_local_grad(const std::string& name) const {
  const Param* q = Find(name);
  return q ? q->dbg_local : std::vector<float>{};
}
ParamPrecision ShardedPart::TEST_precision(const std::string& name) const {
  const Param* q = Find(name);
  return q ? q->prec : ParamPrecision{};
}

}  // namespace ember::fsdp
