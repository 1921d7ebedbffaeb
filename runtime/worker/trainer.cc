#include "runtime/worker/trainer.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <deque>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "kernels/gemm.h"
#include "proto/jobs.pb.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/comm/store_rendezvous.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/keys.h"
#include "runtime/jobspec/enums.h"
#include "runtime/jobspec/pipeline_layout.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/model/from_spec.h"
#include "runtime/pipeline/schedule.h"
#include "runtime/pipeline/stage.h"
#include "runtime/store/client.h"
#include "runtime/worker/cuda_trainer.h"
#include "runtime/worker/model_state.h"
#include "runtime/worker/publisher.h"
#include "runtime/worker/replicas.h"
#include "runtime/worker/step_io.h"
#include "runtime/worker/stop_watch.h"
#include "runtime/worker/train_state.h"
#include "runtime/model/registry.h"
#include "spdlog/spdlog.h"

namespace ember::worker {

// comm names the flight-recorder dump key itself (it knows nothing of jobs); it is the job's key.
static_assert(comm::kDumpRequestKey == job::keys::kDumpRequest, "runtime/comm/env_knobs.h and runtime/job/keys.h disagree");

namespace {

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

std::string Resolve(const std::string& job_dir, const std::string& p) {
  return p.empty() || p[0] == '/' ? p : absl::StrCat(job_dir, "/", p);
}

// The token file's tokenizer (header) against the spec: model.vocab_size must cover the
// tokenizer's vocabulary, and data.tokenizer (when set) must name the same tokenizer.
absl::Status CheckTokenizer(const spec::JobSpec& s, const data::TokenFile& f) {
  const data::TokenizerInfo text{"bytes", "", 256, ""};  // data.text_path: read as bytes
  const data::TokenizerInfo& t = s.data().path().empty() ? text : f.tokenizer();
  const std::string field = s.data().path().empty() ? "data.text_path" : "data.path";
  if (!t.kind.empty() && s.model().vocab_size() < t.vocab_size) {
    return Bad("model.vocab_size", absl::StrCat(s.model().vocab_size(), " is below the ", t.vocab_size, " tokens of ", f.path(),
                                                "'s tokenizer ", t.Describe(), "; set model.vocab_size >= ", t.vocab_size));
  }
  const auto& want = s.data().tokenizer();
  if (!want.kind().empty() && t.kind.empty()) {
    return Bad("data.tokenizer", absl::StrCat(f.path(), " records no tokenizer (made by an older make-tokens, or "
                                              "--header=false); remake it with make-tokens or drop data.tokenizer"));
  }
  if (!want.kind().empty() && want.kind() != t.kind) {
    return Bad("data.tokenizer.kind", absl::StrCat("'", want.kind(), "', but ", field, " ", f.path(), " was made with ", t.Describe()));
  }
  if (!want.sha256().empty() && want.sha256() != t.sha256) {
    return Bad("data.tokenizer.sha256", absl::StrCat(want.sha256(), ", but ", field, " ", f.path(), " was made with the model of sha256 ",
                                                     t.sha256, " (", t.model, "): another SentencePiece model"));
  }
  return absl::OkStatus();
}

}  // namespace

kernels::AdamWOptions AdamWOptionsFor(const spec::JobSpec& s) {
  const auto& o = s.optimizer();
  kernels::AdamWOptions a;
  a.lr = o.lr();
  a.beta1 = o.beta1();
  a.beta2 = o.beta2();
  a.eps = o.eps();
  a.weight_decay = o.weight_decay();
  return a;
}

namespace {

// A precision dtype of the spec (spec::ParseDtype, the one parser) as FSDP's element type.
absl::StatusOr<fsdp::DataType> DtypeOf(const std::string& field, const std::string& text) {
  ASSIGN_OR_RETURN(const spec::Dtype d, spec::ParseDtype(field, text));
  switch (d) {
    case spec::Dtype::kBF16: return fsdp::DataType::kBF16;
    case spec::Dtype::kF16: return fsdp::DataType::kF16;
    case spec::Dtype::kF32: break;
  }
  return fsdp::DataType::kF32;
}

absl::StatusOr<fsdp::MixedPrecisionPolicy> Policy(const spec::v1::PrecisionPolicy& p) {
  fsdp::MixedPrecisionPolicy mp;
  ASSIGN_OR_RETURN(mp.param_dtype, DtypeOf("precision.param_dtype", p.param_dtype()));
  ASSIGN_OR_RETURN(mp.output_dtype, DtypeOf("precision.output_dtype", p.output_dtype()));
  if (!p.reduce_dtype().empty()) {
    ASSIGN_OR_RETURN(mp.reduce_dtype, DtypeOf("precision.reduce_dtype", p.reduce_dtype()));
  }
  for (int i = 0; i < p.overrides_size(); ++i) {
    const auto& o = p.overrides(i);
    const std::string f = absl::StrCat("precision.overrides[", i, "].");
    fsdp::PrecisionOverride po{o.pattern(), std::nullopt, std::nullopt};
    if (!o.param_dtype().empty()) {
      ASSIGN_OR_RETURN(po.param_dtype, DtypeOf(f + "param_dtype", o.param_dtype()));
    }
    if (!o.reduce_dtype().empty()) {
      ASSIGN_OR_RETURN(po.reduce_dtype, DtypeOf(f + "reduce_dtype", o.reduce_dtype()));
    }
    mp.overrides.push_back(std::move(po));
  }
  return mp;
}

}  // namespace

float LearningRate(const spec::JobSpec& s, int64_t step) {
  const auto& o = s.optimizer();
  const double lr = o.lr();
  const int64_t warm = o.warmup_steps();
  if (warm > 0 && step <= warm) return static_cast<float>(lr * step / warm);
  if (o.schedule() != "cosine") return static_cast<float>(lr);
  const double span = std::max<int64_t>(1, s.steps() - warm);
  const double progress = std::min(1.0, static_cast<double>(step - warm) / span);
  const double floor = lr * o.min_lr_ratio();
  return static_cast<float>(floor + (lr - floor) * 0.5 * (1 + std::cos(M_PI * progress)));
}


// This rank's data order: a deterministic shuffle of (seed, position), resumable. The loader reads
// this rank's data shard (ParallelDims: its dp index of dp ranks; every rank of a pipeline replica
// reads its replica's slice, the step's pipeline micro-batches of batch_size sequences each).
data::LoaderOptions LoaderFor(const Plan& p) {
  const spec::PipelineLayout pl = spec::PipelineLayoutOf(p.spec);
  const spec::ParallelDims::DataShard shard = p.dims->DataShardOf(p.env.rank);
  return {.seq_len = p.model.context, .batch = p.spec.batch_size() * (pl.enabled() ? pl.micro_batches : 1),
          .rank = shard.rank, .world = shard.world, .seed = p.fsdp.seed, .shuffle = true,
          .start_token = p.spec.data().start_position()};
}


absl::StatusOr<Plan> Prepare(const job::WorkerEnv& env, const std::string& spec_path) {
  Plan p;
  p.env = env;
  std::string path = !spec_path.empty() ? spec_path
                     : !env.job_spec.empty() ? env.job_spec
                                             : absl::StrCat(env.job_dir, "/job.yaml");
  // The daemon's resolved spec, taken as written (no defaults applied again); a job.yaml that was
  // never resolved (no `resolved` marker: a hand-run worker, an old job directory) is resolved
  // once here, against this rank's world (docs/job-spec.md, "Resolution").
  spec::Facts facts;
  facts.world_size = env.world_size;
  bool resolved_here = false;
  ASSIGN_OR_RETURN(p.spec, spec::LoadWorkerSpec(path, facts, &resolved_here));
  if (resolved_here) {
    spdlog::info("{}: no resolved marker (not written by emberd's Submit); resolved it for {} ranks: {}", path,
                 env.world_size, p.spec.resolved().layout());
  }
  const spec::JobSpec& s = p.spec;
  ASSIGN_OR_RETURN(const int gpu, CudaDeviceIndex(env.device));  // cuda:N; -1 for another name
  if (env.device != "cpu" && gpu < 0) {
    return Bad(job::kEnvDevice, absl::StrCat("'", env.device, "': this ember-worker trains on cpu or cuda:N; use one of those"));
  }
  const auto& par = s.parallelism();
  // The spec's checks and the support matrix ran at Submit (spec::Resolve) and again in
  // LoadWorkerSpec; here only that this rank's world is the one the spec was resolved for.
  RETURN_IF_ERROR(spec::CheckResolvedFor(s, env.world_size));
  if (gpu < 0 && !par.backend().empty() && par.backend() != "cpu") {
    return Bad("parallelism.backend", absl::StrCat("'", par.backend(), "' needs CUDA kernels, which this ember-worker lacks (the nccl backends exist in runtime/comm, but training runs on cpu only); use cpu"));
  }
  if (spec::IsBuiltinArch(s.model().arch())) {
    ASSIGN_OR_RETURN(p.model, model::ConfigFromSpec(s));
  } else {
    // A registered architecture (registry.h): the training stack uses only p.arch; p.model keeps
    // the spec's shape for the data loader and the logs (the support matrix keeps it off cuda).
    p.model.vocab_size = s.model().vocab_size();
    p.model.context = s.model().context_length();
    p.model.n_layer = s.model().n_layers();
    p.model.n_head = s.model().n_heads();
    p.model.d_model = s.model().d_model();
  }
  ASSIGN_OR_RETURN(p.fsdp.mp, Policy(s.precision()));
  // Precision override patterns that match no parameter (and the model's own checks), as Submit.
  RETURN_IF_ERROR(model::CheckModel(s));
  // Unset switches default to on (runtime/jobspec ApplyDefaults); each is taken as written.
  p.fsdp.reshard_after_forward = !par.has_reshard_after_forward() || par.reshard_after_forward();
  p.fsdp.prefetch = !par.has_prefetch() || par.prefetch();
  p.separate_reduce_scatter = !par.has_separate_reduce_scatter() || par.separate_reduce_scatter();
  p.fsdp.adamw = AdamWOptionsFor(s);
  p.fsdp.clip_norm = s.optimizer().grad_clip();
  p.fsdp.seed = static_cast<uint64_t>(s.seed());
  p.dp_replicate = std::max(1, par.dp_replicate());  // HSDP replicas, as resolved (ParallelDims)
  ASSIGN_OR_RETURN(p.dims, spec::ParallelDims::FromSpec(s, env.world_size));
  {
    absl::StatusOr<std::shared_ptr<const model::Model>> arch = model::MakeModel(s);
    if (!arch.ok()) return base::Annotate(arch.status(), "model");
    p.arch = *arch;
  }
  if (gpu >= 0) RETURN_IF_ERROR(CheckCudaPlan(p));  // fp32, data parallel, a model GptCuda supports

  const auto& d = s.data();
  if (d.path().empty() && d.text_path().empty()) {
    return Bad("data.path", "required (a token file; or data.text_path for a text file read as bytes)");
  }
  if (!d.path().empty()) {
    ASSIGN_OR_RETURN(data::TokenDtype dt, data::ParseTokenDtype(d.token_dtype()));
    auto f = data::TokenFile::Open(Resolve(env.upload_dir, d.path()), dt);
    if (!f.ok()) return base::Annotate(f.status(), "data.path");
    p.tokens = *f;
  } else {
    auto f = data::TokenFile::Open(Resolve(env.upload_dir, d.text_path()), data::TokenDtype::kU8);
    if (!f.ok()) return base::Annotate(f.status(), "data.text_path");
    p.tokens = *f;
  }
  RETURN_IF_ERROR(CheckTokenizer(s, *p.tokens));
  if (p.tokens->max_token() >= static_cast<uint32_t>(p.model.vocab_size)) {
    return Bad(d.path().empty() ? "data.text_path" : "data.path",
               absl::StrCat("token id ", p.tokens->max_token(), " >= model.vocab_size ", p.model.vocab_size));
  }
  data::TokenLoader probe(p.tokens, LoaderFor(p));
  if (absl::Status st = probe.Validate(); !st.ok()) return base::Annotate(st, "data");
  p.checkpoint_root = Resolve(env.job_dir, s.checkpoint().dir().empty() ? "checkpoints" : s.checkpoint().dir());
  p.metrics_path = job::MetricsPath(env.job_dir, env.rank);
  if (!s.checkpoint().init_from_safetensors().empty()) {
    p.init_safetensors = Resolve(env.upload_dir, s.checkpoint().init_from_safetensors());
  }
  if (!s.checkpoint().init_from().empty()) p.init_hf = Resolve(env.upload_dir, s.checkpoint().init_from());
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.threads = s.threads() > 0 ? s.threads() : std::max(1, hw / env.local_world_size);
  return p;
}

namespace {

// kEnvWorkerFault "hang:rank=R,step=S[,attempt=A]": the step at which this rank hangs, or -1.
int64_t HangStep(const job::WorkerEnv& env) {
  if (!absl::StartsWith(env.fault, "hang:")) return -1;
  int64_t rank = -1, step = -1, attempt = 0;
  for (absl::string_view kv : absl::StrSplit(env.fault.substr(5), ',')) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    int64_t v = 0;
    if (!absl::SimpleAtoi(p.second, &v)) continue;
    if (p.first == "rank") rank = v;
    if (p.first == "step") step = v;
    if (p.first == "attempt") attempt = v;
  }
  return rank == env.rank && attempt == env.attempt ? step : -1;
}

// Fault injection (tests): alive, never joining the next collective, until the job stops us.
[[noreturn]] void Hang(const job::WorkerEnv& env, int64_t step) {
  spdlog::warn("fault injection: rank {} hangs at step {} ({})", env.rank, step, job::kEnvWorkerFault);
  for (;;) absl::SleepFor(absl::Seconds(1));
}

}  // namespace

absl::StatusOr<Groups> CreateGroups(const Plan& plan, std::shared_ptr<comm::Rendezvous> rdzv,
                                    flight::FlightRecorder* recorder) {
  const job::WorkerEnv& env = plan.env;
  comm::GroupOptions go;
  go.name = "world";
  go.timeout = absl::Seconds(plan.spec.collective_timeout_s());
  go.recorder = recorder;
  go.dump_dir = env.fr_dump_dir;
  go.global_rank = env.rank;
  Groups g;
  g.rdzv = rdzv;
  g.recorder = recorder;
  ASSIGN_OR_RETURN(g.world, comm::ProcessGroup::Create(rdzv, env.rank, env.world_size, go));
  using Dims = spec::ParallelDims;
  const Dims& dims = *plan.dims;
  auto split = [&](Dims::Group kind) { return g.world->Split(dims.SplitOf(kind, env.rank).color,
                                                              dims.SplitOf(kind, env.rank).key,
                                                              dims.SplitOf(kind, env.rank).name); };
  if (dims.pipeline()) {
    // "pipeline<d>" (replica d's pp ranks) and "stage<p>" (pp rank p's replicas, over which its
    // stages are sharded); with one replica the pipeline group is the world.
    if (dims.dp() > 1) {
      ASSIGN_OR_RETURN(g.pipeline, split(Dims::Group::kPipeline));
      if (dims.hsdp()) {  // PP x HSDP: the stage's rows sharded in "shard<p>.<r>", replicated across "replicate<p>.<s>"
        ASSIGN_OR_RETURN(g.shard, split(Dims::Group::kShard));
        ASSIGN_OR_RETURN(g.replicate, split(Dims::Group::kReplicate));
      } else {
        ASSIGN_OR_RETURN(g.stage, split(Dims::Group::kDp));
      }
    }
    return g;
  }
  // HSDP: rows sharded within "shard<p>.<r>", gradient shards all-reduced across
  // "replicate<p>.<s>" (ParallelDims' layout: dp index = replicate x dp_shard + shard).
  comm::ProcessGroup* shard = g.world.get();
  if (dims.hsdp()) {
    ASSIGN_OR_RETURN(g.shard, split(Dims::Group::kShard));
    ASSIGN_OR_RETURN(g.replicate, split(Dims::Group::kReplicate));
    shard = g.shard.get();
  }
  // (Not for cuda ranks: their host mirror never reduce-scatters, cuda_loop.cc.)
  if (plan.separate_reduce_scatter && shard->size() > 1 && plan.env.device == "cpu") {
    if (dims.hsdp()) {
      ASSIGN_OR_RETURN(g.reduce_scatter,
                       shard->Split(0, shard->rank(), absl::StrCat(dims.SplitOf(Dims::Group::kShard, env.rank).name, ".reduce_scatter")));
    } else {
      go.name = "reduce_scatter";
      ASSIGN_OR_RETURN(g.reduce_scatter, comm::ProcessGroup::Create(rdzv, env.rank, env.world_size, go));
    }
  }
  return g;
}

absl::StatusOr<std::unique_ptr<TrainState>> MakeTrainState(const Plan& plan, const Groups& groups) {
  if (spec::PipelineLayoutOf(plan.spec).enabled()) return MakePipelineState(plan, groups);
  if (plan.env.device != "cpu") {
    const CudaStateFn make_cuda = GetCudaState();
    if (make_cuda == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(job::kEnvDevice, "=", plan.env.device, ": this binary has no GPU training step; run ember-worker-cuda (built and installed beside ember-worker)"));
    }
    return make_cuda(plan, groups);
  }
  return MakeFsdpState(plan, groups);
}

namespace {

// The step to continue after: the newest checkpoint that verifies (a damaged `latest` falls back,
// logged; steps newer than the one resumed are never deleted, SaveOptions::keep_last), else 0 after
// the optional safetensors or Hugging Face initialisation.
absl::StatusOr<int64_t> ResumeOrInit(const Plan& plan, store::Client& attempt, TrainState& state,
                                     data::TokenLoader& loader, Replicas* replicas) {
  // fault_tolerance.replicas: memory: the newest step every rank holds in memory first (replicas.h).
  if (replicas != nullptr) {
    ASSIGN_OR_RETURN(std::optional<int64_t> at, ResumeFromReplicas(plan, attempt, *replicas, state, loader));
    if (at.has_value()) {
      RETURN_IF_ERROR(state.SyncDevice());
      return *at;
    }
  }
  absl::StatusOr<std::string> resume = ckpt::FindResumeCheckpoint(plan.checkpoint_root);
  if (!resume.ok() && !absl::IsNotFound(resume.status())) return resume.status();
  int64_t step = 0;
  if (resume.ok()) {
    const absl::Time t0 = absl::Now();
    ASSIGN_OR_RETURN(step, Restore(*resume, state, loader));
    // recovery_bench reads this line: the restart time it reports excludes the load.
    spdlog::info("checkpoint load took {}", absl::FormatDuration(absl::Now() - t0));
    if (replicas != nullptr) {
      replicas->counts().resumed_step = step;
      replicas->counts().disk_checkpoint_reads = 1;
    }
  } else {
    if (!plan.init_safetensors.empty()) RETURN_IF_ERROR(InitFromSafetensors(plan.init_safetensors, state));
    if (!plan.init_hf.empty()) RETURN_IF_ERROR(InitFromHf(plan.init_hf, state));
  }
  RETURN_IF_ERROR(state.SyncDevice());
  return step;
}

}  // namespace

bool Bf16LinearFor(const Plan& plan, std::string* why) {
  const fsdp::MixedPrecisionPolicy& mp = plan.fsdp.mp;
  if (mp.param_dtype != fsdp::DataType::kBF16) {
    *why = "precision.param_dtype is not bf16: fp32 GEMMs";
    return false;
  }
  std::string kept;  // a matrix an override keeps out of bf16
  if (plan.arch != nullptr) {
    for (const model::ParamSpec& p : plan.arch->ParamSpecs()) {
      if (p.shape.size() == 2 && mp.Resolve(p.name).param_dtype != fsdp::DataType::kBF16) {
        kept = p.name;
        break;
      }
    }
  }
  const kernels::Bf16GemmSupport& s = kernels::Bf16GemmInfo();
  if (!kept.empty()) {
    *why = absl::StrCat("precision.param_dtype bf16: linear layers compute in fp32 on the bf16-rounded "
                        "weights, because precision.overrides keeps the matrix ", kept,
                        " out of bf16 (bf16 GEMMs are all or nothing per job)");
    return false;
  }
  if (!s.native) {
    *why = absl::StrCat("precision.param_dtype bf16: linear layers compute in fp32 on the bf16-rounded "
                        "weights, because ", s.reason);
    return false;
  }
  *why = absl::StrCat("precision.param_dtype bf16: linear layers compute in bf16 (inputs rounded to "
                      "bf16, fp32 accumulation): ", s.reason);
  return true;
}

namespace {

// ExecContext::bf16_linear for this rank; the first rank of each node says which, and why, once.
bool Bf16Linear(const Plan& plan) {
  std::string why;
  const bool on = Bf16LinearFor(plan, &why);
  if (plan.env.local_rank == 0 && plan.fsdp.mp.param_dtype == fsdp::DataType::kBF16) {
    spdlog::info("rank {}: {}", plan.env.rank, why);
  }
  return on;
}


// The one training loop, for every layout (stopping is StopWatcher's: it ends the process from its
// own thread when the attempt's stop key appears, see Train): resume, then steps with the hang
// hook, the progress report, checkpoints on the spec's cadence and live weight publishing.
// `drain_requested` (StopWatcher): when any rank has seen the attempt's drain key, every rank
// learns it at the same step (a one-double all-reduce per step), saves that step's checkpoint and
// returns with *drained set.
absl::Status RunLoop(const Plan& plan, store::Client& attempt, flight::FlightRecorder& recorder,
                     const Groups& groups, TrainState& state, const std::function<bool()>& drain_requested,
                     bool* drained) {
  data::TokenLoader loader(plan.tokens, LoaderFor(plan));
  ASSIGN_OR_RETURN(std::unique_ptr<Replicas> replicas, Replicas::Open(plan, attempt, state));  // nullptr: off
  ASSIGN_OR_RETURN(int64_t step, ResumeOrInit(plan, attempt, state, loader, replicas.get()));
  Checkpointer checkpoints(plan, attempt, [&](int64_t at) { return Snapshot(state, loader, at, plan.fsdp.seed); });
  Reporter report(plan, attempt, state.state_bytes(), step);
  ASSIGN_OR_RETURN(std::unique_ptr<Publisher> publisher, StartPublisher(plan, attempt, state));
  kernels::ThreadPool threads(plan.threads);
  kernels::ExecContext ctx{&threads, plan.spec.deterministic()};
  ctx.bf16_linear = Bf16Linear(plan);
  const int64_t hang_at = HangStep(plan.env);
  // Cross-host replicas (replicas.h): a step is reported once every rank's buddy copy of it is
  // committed, i.e. after the next step's closing all-reduce (each rank enters it only after its
  // next Save waited for that copy), so no reported step is lost with one host. Progress then shows
  // one step late. Elsewhere a step is reported at once.
  const bool lag_reports = replicas != nullptr && replicas->cross_host();
  std::deque<StepResult> unreported;
  auto report_before = [&](int64_t before) -> absl::Status {
    while (!unreported.empty() && unreported.front().step() < before) {
      RETURN_IF_ERROR(report.Report(std::move(unreported.front())));
      unreported.pop_front();
    }
    return absl::OkStatus();
  };
  report.Start();
  while (step < plan.spec.steps()) {
    ++step;
    if (step == hang_at) Hang(plan.env, step);
    ASSIGN_OR_RETURN(StepResult r, state.Step(ctx, loader, step, LearningRate(plan.spec, step)));
    if (!std::isfinite(r.loss())) return absl::InternalError(absl::StrCat("loss is ", r.loss(), " at step ", step));
    // In-memory replicas (replicas.h): before the report, so a reported step is a committed one.
    if (replicas != nullptr && replicas->Due(step)) RETURN_IF_ERROR(SyncAndSave(*replicas, step, state, loader));
    // Plus what the state's own groups hold (set by Step: the GPU step's device group).
    r.set_comm_memory_bytes(r.comm_memory_bytes() + groups.CommMemoryBytes());
    if (checkpoints.last_save_seconds() >= 0) r.set_checkpoint_save_s(checkpoints.last_save_seconds());
    r.set_flight_entries(static_cast<int64_t>(recorder.size()));
    if (publisher != nullptr) SetPublishCounts(publisher->counts(), &r);  // up to the previous step
    if (replicas != nullptr) SetReplicaCounts(replicas->counts(), &r);
    if (report.Due(step) && lag_reports) {
      unreported.push_back(r);
    } else if (report.Due(step)) {
      RETURN_IF_ERROR(report.Report(r));
    }
    if (checkpoints.Due(step) || publisher != nullptr) RETURN_IF_ERROR(state.SyncHost());
    if (checkpoints.Due(step)) RETURN_IF_ERROR(checkpoints.Save(step));
    RETURN_IF_ERROR(PublishAt(publisher.get(), step));  // live weights (publisher.h)
    if (step < plan.spec.steps()) {
      ASSIGN_OR_RETURN(const double drain, state.AllReduceMean(drain_requested() ? 1.0 : 0.0));
      RETURN_IF_ERROR(report_before(step));
      if (drain > 0) {
        if (!checkpoints.Due(step)) {
          RETURN_IF_ERROR(state.SyncHost());
          RETURN_IF_ERROR(checkpoints.Save(step));
        }
        RETURN_IF_ERROR(checkpoints.Finish());
        if (replicas != nullptr) RETURN_IF_ERROR(replicas->Wait());
        RETURN_IF_ERROR(report_before(step + 1));
        report.Done(step);
        spdlog::info("rank {}: checkpointed step {} on request and stopping", plan.env.rank, step);
        *drained = true;
        return absl::OkStatus();
      }
    }
  }
  RETURN_IF_ERROR(checkpoints.Finish());
  if (replicas != nullptr) RETURN_IF_ERROR(replicas->Wait());
  RETURN_IF_ERROR(report_before(step + 1));
  report.Done(step);
  return absl::OkStatus();
}

// One attempt: the groups, the model state of the job's layout and device, the loop.
absl::Status TrainLoop(const Plan& plan, store::Client& attempt, flight::FlightRecorder& recorder,
                       const std::function<bool()>& drain_requested, bool* drained) {
  ASSIGN_OR_RETURN(Groups groups, CreateGroups(plan, comm::MakeStoreRendezvous(attempt), &recorder));
  ASSIGN_OR_RETURN(std::unique_ptr<TrainState> state, MakeTrainState(plan, groups));
  return RunLoop(plan, attempt, recorder, groups, *state, drain_requested, drained);
}

// A peer's death surfaces here first as UNAVAILABLE/ABORTED; the daemon that saw the death sets the
// stop key within a poll interval. Exiting at once would race the real root cause, so wait for the
// job's decision (StopNow ends the process when it comes), then dump the flight recorder.
void AwaitStopDecision(const absl::Status& st, StopWatcher& watcher, int rank) {
  if (st.ok()) return;
  if (ShouldWaitForStop(st)) {
    spdlog::warn("rank {}: {}; waiting for the job's stop decision", rank, st.ToString());
    watcher.AwaitStop(absl::Seconds(3));
  }
  watcher.Dump(absl::StrCat("error: ", st.ToString()));
}

// The worker's own exit record, for a daemon that re-attached to this process (it cannot wait()
// for a non-child). Best effort: the daemon reports "exit status unknown" without it.
void RecordExit(const absl::Status& st, store::Client& attempt, int rank) {
  jobs::v1::WorkerExit e;
  e.set_exit_code(st.ok() ? 0 : 1);  // worker_main.cc's exit code for a Train error
  if (!st.ok()) e.set_error(st.ToString());
  store::CallOptions o;
  o.timeout = absl::Seconds(2);
  (void)attempt.Set(job::keys::WorkerExitOf(rank), e.SerializeAsString(), o);
}

}  // namespace

absl::StatusOr<store::Client> ConnectJobStore(const job::WorkerEnv& env) {
  store::ClientOptions co;
  co.address = env.store_addr;
  // Every write carries the attempt: refused once the job's fence names a newer one (a stale
  // worker, e.g. on a host that was cut off from the store while the job moved on).
  co.fence_key = job::keys::Fence(env.job_id);
  co.fence_epoch = env.attempt;
  if (!env.auth_token_file.empty()) {
    std::ifstream f(env.auth_token_file);
    if (!f) {
      return absl::PermissionDeniedError(
          absl::StrCat(job::kEnvAuthTokenFile, " '", env.auth_token_file, "' is unreadable"));
    }
    std::string tok((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    co.auth_token = std::string(absl::StripAsciiWhitespace(tok));
  }
  if (env.tls.enabled()) {
    ASSIGN_OR_RETURN(co.credentials, base::MakeChannelCredentials(env.tls));
  }
  return store::Client::Connect(co);
}

absl::Status Train(const Plan& plan, bool* drained) {
  bool drained_here = false;
  if (drained == nullptr) drained = &drained_here;
  *drained = false;
  const job::WorkerEnv& env = plan.env;
  ASSIGN_OR_RETURN(store::Client client, ConnectJobStore(env));
  // Kept until the process ends (see trainer.h): destroying TLS channels while gRPC's own threads
  // still hold them aborted a worker after its last step in CI ("ref_counted.h: prior > 0").
  static store::Client* const keep_open = new store::Client(client);
  (void)keep_open;
  store::Client attempt = client.WithPrefix(env.prefix());
  // Stop within ~0.1 s when the job is told to stop (a peer died, cancel, node lost), dumping the
  // flight recorder first; see stop_watch.h.
  flight::FlightRecorder recorder;
  StopWatcher watcher(attempt, &recorder, env.fr_dump_dir, env.rank);
  watcher.Start();
  absl::Status st = TrainLoop(plan, attempt, recorder, [&watcher] { return watcher.drain_requested(); }, drained);
  if (store::IsFenced(st)) {
    // Superseded: nothing this process writes may land (the store refuses it); stop now.
    st = absl::FailedPreconditionError(absl::StrCat(
        "stale worker: rank ", env.rank, " of attempt ", env.attempt, " of job ", env.job_id,
        " is fenced off because a newer attempt started; exiting without writing (", st.message(),
        ")"));
    spdlog::error("{}", std::string(st.message()));
  }
  AwaitStopDecision(st, watcher, env.rank);
  RecordExit(st, attempt, env.rank);
  return st;
}

}  // namespace ember::worker
