#include "runtime/worker/trainer.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "proto/jobs.pb.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/comm/store_rendezvous.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/worker/model_state.h"
#include "runtime/worker/stop_watch.h"
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

int64_t PeakRssBytes() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

std::string BytesJson(const std::map<std::string, int64_t>& m) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : m) parts.push_back(absl::StrCat("\"", k, "\":", v));
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

std::string BytesHuman(const std::map<std::string, int64_t>& m) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : m) parts.push_back(absl::StrCat(k, "=", v));
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

// %.9g keeps fp32 values exact in JSON.
std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace

absl::StatusOr<model::GptConfig> ModelConfig(const spec::JobSpec& s) {
  const auto& m = s.model();
  model::GptConfig c;
  c.vocab_size = m.vocab_size();
  c.context = m.context_length();
  c.n_layer = m.n_layers();
  c.n_head = m.n_heads();
  c.d_model = m.d_model();
  c.mlp = m.mlp() == "swiglu" ? model::GptConfig::Mlp::kSwiGlu
          : m.mlp() == "moe"  ? model::GptConfig::Mlp::kMoe
                              : model::GptConfig::Mlp::kGelu;
  c.d_ff = m.mlp_hidden();
  if (m.mlp() == "moe") {
    c.n_expert = m.moe_experts();
    c.top_k = m.moe_top_k();
  }
  c.window = m.attention_window();
  c.init_std = m.init_std();
  c.norm_eps = m.norm_eps();
  c.loss.label_smoothing = s.loss().label_smoothing();
  c.loss.z_loss = s.loss().z_loss();
  c.loss.ignore_index = s.loss().ignore_index();
  if (absl::Status st = c.Validate(); !st.ok()) return base::Annotate(st, "model");
  return c;
}

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

absl::StatusOr<fsdp::MixedPrecisionPolicy> Policy(const spec::v1::PrecisionPolicy& p) {
  fsdp::MixedPrecisionPolicy mp;
  ASSIGN_OR_RETURN(mp.param_dtype, fsdp::ParseFloatDtype("precision.param_dtype", p.param_dtype()));
  ASSIGN_OR_RETURN(mp.output_dtype, fsdp::ParseFloatDtype("precision.output_dtype", p.output_dtype()));
  if (!p.reduce_dtype().empty()) {
    ASSIGN_OR_RETURN(mp.reduce_dtype, fsdp::ParseFloatDtype("precision.reduce_dtype", p.reduce_dtype()));
  }
  for (int i = 0; i < p.overrides_size(); ++i) {
    const auto& o = p.overrides(i);
    const std::string f = absl::StrCat("precision.overrides[", i, "].");
    fsdp::PrecisionOverride po{o.pattern(), std::nullopt, std::nullopt};
    if (!o.param_dtype().empty()) {
      ASSIGN_OR_RETURN(po.param_dtype, fsdp::ParseFloatDtype(f + "param_dtype", o.param_dtype()));
    }
    if (!o.reduce_dtype().empty()) {
      ASSIGN_OR_RETURN(po.reduce_dtype, fsdp::ParseFloatDtype(f + "reduce_dtype", o.reduce_dtype()));
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

namespace {

// This rank's data order: a deterministic shuffle of (seed, position), resumable.
data::LoaderOptions LoaderFor(const Plan& p) {
  return {.seq_len = p.model.context, .batch = p.spec.batch_size(), .rank = p.env.rank,
          .world = p.env.world_size, .seed = p.fsdp.seed, .shuffle = true,
          .start_token = p.spec.data().start_position()};
}

}  // namespace

absl::StatusOr<Plan> Prepare(const job::WorkerEnv& env, const std::string& spec_path) {
  Plan p;
  p.env = env;
  std::string path = !spec_path.empty() ? spec_path
                     : !env.job_spec.empty() ? env.job_spec
                                             : absl::StrCat(env.job_dir, "/job.yaml");
  ASSIGN_OR_RETURN(p.spec, spec::LoadJobSpec(path));
  const spec::JobSpec& s = p.spec;
  if (env.device != "cpu") {
    return Bad(job::kEnvDevice, absl::StrCat("'", env.device, "': this ember-worker build has CPU kernels only; use cpu"));
  }
  const auto& par = s.parallelism();
  if (par.strategy() == "pipeline") return Bad("parallelism.strategy", "'pipeline' is not implemented by ember-worker; use fsdp or none");
  if (par.strategy() == "none" && env.world_size != 1) {
    return Bad("parallelism.strategy", absl::StrCat("'none' needs one rank, ", job::kEnvWorldSize, " is ", env.world_size));
  }
  if (par.world_size() != 0 && par.world_size() != env.world_size) {
    return Bad("parallelism.world_size", absl::StrCat(par.world_size(), " does not match ", job::kEnvWorldSize, "=", env.world_size));
  }
  if (!par.backend().empty() && par.backend() != "cpu") {
    return Bad("parallelism.backend", absl::StrCat("'", par.backend(), "' needs CUDA kernels, which this ember-worker lacks (the nccl backends exist in runtime/comm, but training runs on cpu only); use cpu"));
  }
  ASSIGN_OR_RETURN(p.model, ModelConfig(s));
  ASSIGN_OR_RETURN(p.fsdp.mp, Policy(s.precision()));
  // An override that matches no parameter is almost always a wrong name (e.g. "*norm*" for the
  // norms, which are named ln1/ln2/ln_f): refuse it rather than silently training in bf16.
  const std::vector<model::ParamSpec> params = model::ParamSpecs(p.model);
  for (size_t i = 0; i < p.fsdp.mp.overrides.size(); ++i) {
    const std::string& pat = p.fsdp.mp.overrides[i].pattern;
    bool any = false;
    for (const auto& ps : params) any = any || fsdp::GlobMatch(pat, ps.name);
    if (!any) {
      return Bad(absl::StrCat("precision.overrides[", i, "].pattern"),
                 absl::StrCat("'", pat, "' matches no parameter; names look like ", params.front().name,
                              ", blocks.0.ln1.weight, ln_f.weight (docs/model.md)"));
    }
  }
  // Unset switches default to on (runtime/jobspec ApplyDefaults); each is taken as written.
  p.fsdp.reshard_after_forward = !par.has_reshard_after_forward() || par.reshard_after_forward();
  p.fsdp.prefetch = !par.has_prefetch() || par.prefetch();
  p.separate_reduce_scatter = !par.has_separate_reduce_scatter() || par.separate_reduce_scatter();
  p.fsdp.adamw = AdamWOptionsFor(s);
  p.fsdp.clip_norm = s.optimizer().grad_clip();
  p.fsdp.seed = static_cast<uint64_t>(s.seed());

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
  if (p.tokens->max_token() >= static_cast<uint32_t>(p.model.vocab_size)) {
    return Bad(d.path().empty() ? "data.text_path" : "data.path",
               absl::StrCat("token id ", p.tokens->max_token(), " >= model.vocab_size ", p.model.vocab_size));
  }
  data::TokenLoader probe(p.tokens, LoaderFor(p));
  if (absl::Status st = probe.Validate(); !st.ok()) return base::Annotate(st, "data");
  p.checkpoint_root = Resolve(env.job_dir, s.checkpoint().dir().empty() ? "checkpoints" : s.checkpoint().dir());
  p.metrics_path = absl::StrCat(env.job_dir, "/metrics/rank-", env.rank, ".jsonl");
  if (!s.checkpoint().init_from_safetensors().empty()) {
    p.init_safetensors = Resolve(env.upload_dir, s.checkpoint().init_from_safetensors());
  }
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

// The process groups of one attempt: "world", and "reduce_scatter" when the plan separates it
// (its own stream of collectives, so reduce-scatters overlap the next unit's all-gathers).
struct Groups {
  std::unique_ptr<comm::ProcessGroup> world, reduce_scatter;
  fsdp::Groups fsdp() const { return {world.get(), reduce_scatter.get()}; }
};

absl::StatusOr<Groups> CreateGroups(const Plan& plan, store::Client& attempt,
                                    flight::FlightRecorder& recorder) {
  const job::WorkerEnv& env = plan.env;
  comm::GroupOptions go;
  go.name = "world";
  go.timeout = absl::Seconds(plan.spec.collective_timeout_s());
  go.recorder = &recorder;
  go.dump_dir = env.fr_dump_dir;
  go.global_rank = env.rank;
  auto rdzv = comm::MakeStoreRendezvous(attempt);
  Groups g;
  ASSIGN_OR_RETURN(g.world, comm::ProcessGroup::Create(rdzv, env.rank, env.world_size, go));
  if (plan.separate_reduce_scatter && env.world_size > 1) {
    go.name = "reduce_scatter";
    ASSIGN_OR_RETURN(g.reduce_scatter, comm::ProcessGroup::Create(rdzv, env.rank, env.world_size, go));
  }
  return g;
}

// The step to continue after: the newest checkpoint that verifies (a damaged `latest` falls back,
// logged; steps newer than the one resumed are never deleted, SaveOptions::keep_last), else 0 after
// the optional safetensors initialisation.
absl::StatusOr<int64_t> ResumeOrInit(const Plan& plan, fsdp::FsdpGpt& model, data::TokenLoader& loader) {
  absl::StatusOr<std::string> resume = ckpt::FindResumeCheckpoint(plan.checkpoint_root);
  if (!resume.ok() && !absl::IsNotFound(resume.status())) return resume.status();
  if (resume.ok()) {
    const absl::Time t0 = absl::Now();
    ASSIGN_OR_RETURN(int64_t step, Restore(*resume, model, loader));
    // recovery_bench reads this line: the restart time it reports excludes the load.
    spdlog::info("checkpoint load took {}", absl::FormatDuration(absl::Now() - t0));
    return step;
  }
  if (!plan.init_safetensors.empty()) RETURN_IF_ERROR(InitFromSafetensors(plan.init_safetensors, model));
  return 0;
}

// Checkpoint cadence: every checkpoint.every_steps and at the last step, committed through the
// attempt's store keys (synchronously, or in the background with checkpoint.async).
class Checkpointer {
 public:
  Checkpointer(const Plan& plan, store::Client& attempt, fsdp::FsdpGpt& model, const data::TokenLoader& loader)
      : plan_(plan), model_(model), loader_(loader),
        protocol_(std::make_shared<ckpt::StoreCommitProtocol>(attempt)),
        options_{.root = plan.checkpoint_root, .rank = plan.env.rank, .world_size = plan.env.world_size,
                 .keep_last = std::max(1, plan.spec.checkpoint().keep_last()),
                 .commit_timeout = absl::Seconds(plan.spec.collective_timeout_s())} {
    (void)base::MakeDirs(plan.checkpoint_root);  // best effort: a failure shows at the first save
    if (plan.spec.checkpoint().async()) async_ = std::make_unique<ckpt::AsyncSaver>(options_, protocol_);
  }

  bool Due(int64_t step) const {
    const int every = plan_.spec.checkpoint().every_steps();
    return (every > 0 && step % every == 0) || step == plan_.spec.steps();
  }

  absl::Status Save(int64_t step) {
    const absl::Time t0 = absl::Now();
    ckpt::RankState st = Snapshot(model_, loader_, step, plan_.fsdp.seed);
    if (async_) {
      RETURN_IF_ERROR(async_->Start(st));
    } else {
      RETURN_IF_ERROR(ckpt::SaveCheckpoint(options_, st, protocol_.get()));
    }
    spdlog::info("checkpoint step {} {} in {}", step, async_ ? "started" : "committed",
                 absl::FormatDuration(absl::Now() - t0));
    return absl::OkStatus();
  }

  // Waits for a background save still in flight.
  absl::Status Finish() { return async_ ? async_->Wait() : absl::OkStatus(); }

 private:
  const Plan& plan_;
  fsdp::FsdpGpt& model_;
  const data::TokenLoader& loader_;
  std::shared_ptr<ckpt::StoreCommitProtocol> protocol_;
  ckpt::SaveOptions options_;
  std::unique_ptr<ckpt::AsyncSaver> async_;
};

// One optimizer step's numbers, as TrainStep measured them.
struct StepResult {
  int64_t step = 0;
  double loss = 0;        // mean over every rank
  double local_loss = 0;  // this rank's, over its micro-batches
  float lr = 0;
  double grad_norm = 0;
  double seconds = 0;
};

// Reporting every log_every steps and at the last: the log line (step, loss, tokens/s, ETA), the
// progress record (jobs.v1.Progress under the attempt's progress/<rank>, which emberctl shows)
// and a line of <job_dir>/metrics/rank-<r>.jsonl.
class Reporter {
 public:
  Reporter(const Plan& plan, store::Client& attempt, fsdp::FsdpGpt& model, int64_t first_step)
      : plan_(plan), attempt_(attempt), model_(model), first_(first_step), start_(absl::Now()) {
    (void)base::MakeDirs(absl::StrCat(plan.env.job_dir, "/metrics"));  // best effort, as before
    metrics_.open(plan.metrics_path, std::ios::app);
  }

  void Start() const {
    spdlog::info("{} | rank {}/{} | {} params, {} state bytes/rank | {} threads | from step {}",
                 spec::Summarize(plan_.spec), plan_.env.rank, plan_.env.world_size,
                 model::ParamSpecs(plan_.model).size(), model_.state_bytes(), plan_.threads, first_);
  }

  bool Due(int64_t step) const { return step % plan_.spec.log_every() == 0 || step == plan_.spec.steps(); }

  absl::Status Report(const StepResult& r) {
    const spec::JobSpec& s = plan_.spec;
    const double tokens = static_cast<double>(plan_.env.world_size) * s.batch_size() *
                          plan_.model.context * s.parallelism().micro_batches();
    const double tps = tokens / r.seconds;
    const double avg = absl::ToDoubleSeconds(absl::Now() - start_) / static_cast<double>(r.step - first_);
    const double eta = avg * static_cast<double>(s.steps() - r.step);
    const double comm_wait = absl::ToDoubleSeconds(model_.comm_wait());
    const auto& b = model_.comm_bytes();
    const int64_t rss = PeakRssBytes();
    spdlog::info("step {}/{} loss {:.4f} lr {:.3g} grad_norm {:.3f} tok/s {:.0f} eta {} peak_rss {:.1f}MB "
                 "comm_wait {:.0f}% ag[{}] rs[{}]",
                 r.step, s.steps(), r.loss, r.lr, r.grad_norm, tps,
                 absl::FormatDuration(absl::Seconds(std::round(eta))), rss / 1e6,
                 100 * comm_wait / r.seconds, BytesHuman(b.all_gather), BytesHuman(b.reduce_scatter));
    jobs::v1::Progress p;
    p.set_step(r.step);
    p.set_steps(s.steps());
    p.set_loss(r.loss);
    p.set_lr(r.lr);
    p.set_grad_norm(r.grad_norm);
    p.set_tokens_per_s(tps);
    p.set_eta_s(eta);
    p.set_peak_rss_bytes(rss);
    RETURN_IF_ERROR(attempt_.Set(job::keys::ProgressOf(plan_.env.rank), p.SerializeAsString()));
    metrics_ << absl::StrCat(
                    "{\"step\":", r.step, ",\"loss\":", Num(r.loss), ",\"local_loss\":", Num(r.local_loss),
                    ",\"lr\":", Num(r.lr), ",\"grad_norm\":", Num(r.grad_norm), ",\"tokens_per_s\":", Num(tps),
                    ",\"step_s\":", Num(r.seconds), ",\"comm_wait_s\":", Num(comm_wait),
                    ",\"peak_rss_bytes\":", rss, ",\"state_bytes\":", model_.state_bytes(),
                    ",\"bytes\":{\"all_gather\":", BytesJson(b.all_gather),
                    ",\"reduce_scatter\":", BytesJson(b.reduce_scatter),
                    ",\"all_reduce\":", BytesJson(b.all_reduce),
                    ",\"reduce_scatter_promoted\":", b.reduce_scatter_promoted, "}}")
             << "\n"
             << std::flush;
    return absl::OkStatus();
  }

  void Done(int64_t step) const {
    spdlog::info("done: {} steps in {}", step - first_, absl::FormatDuration(absl::Now() - start_));
  }

 private:
  const Plan& plan_;
  store::Client& attempt_;
  fsdp::FsdpGpt& model_;
  const int64_t first_;
  const absl::Time start_;
  std::ofstream metrics_;
};

// One optimizer step: M micro-batches of forward+backward, the loss averaged over every rank, the
// optimizer update. A non-finite mean loss is INTERNAL (the run has diverged).
class Stepper {
 public:
  Stepper(const Plan& plan, fsdp::FsdpGpt& model, data::TokenLoader& loader)
      : plan_(plan), model_(model), loader_(loader), pool_(plan.threads),
        ctx_{&pool_, plan.spec.deterministic()},
        tok_(plan.spec.batch_size() * plan.model.context),
        tgt_(tok_.size()) {}

  absl::StatusOr<StepResult> Step(int64_t step) {
    const int64_t B = plan_.spec.batch_size(), T = plan_.model.context, M = plan_.spec.parallelism().micro_batches();
    StepResult r;
    r.step = step;
    r.lr = LearningRate(plan_.spec, step);
    model_.ResetCommBytes();
    model_.ResetCommWait();
    const absl::Time t0 = absl::Now();
    for (int64_t k = 0; k < M; ++k) {
      RETURN_IF_ERROR(loader_.Next(tok_.data(), tgt_.data()));
      ASSIGN_OR_RETURN(float l, model_.ForwardBackward(ctx_, tok_.data(), tgt_.data(), B, T, k == M - 1));
      r.local_loss += static_cast<double>(l) / M;
    }
    ASSIGN_OR_RETURN(r.loss, model_.AllReduceMean(r.local_loss));
    ASSIGN_OR_RETURN(r.grad_norm, model_.OptimizerStep(ctx_, r.lr));
    r.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!std::isfinite(r.loss)) return absl::InternalError(absl::StrCat("loss is ", r.loss, " at step ", step));
    return r;
  }

 private:
  const Plan& plan_;
  fsdp::FsdpGpt& model_;
  data::TokenLoader& loader_;
  kernels::ThreadPool pool_;
  kernels::ExecContext ctx_;
  std::vector<int32_t> tok_, tgt_;
};

// The training loop of one attempt (stopping is StopWatcher's: it ends the process from its own
// thread when the attempt's stop key appears, see Train).
absl::Status TrainLoop(const Plan& plan, store::Client& attempt, flight::FlightRecorder& recorder) {
  ASSIGN_OR_RETURN(Groups groups, CreateGroups(plan, attempt, recorder));
  ASSIGN_OR_RETURN(auto model, fsdp::FsdpGpt::Create(plan.model, groups.fsdp(), plan.fsdp));
  data::TokenLoader loader(plan.tokens, LoaderFor(plan));
  ASSIGN_OR_RETURN(int64_t step, ResumeOrInit(plan, *model, loader));
  Checkpointer checkpoints(plan, attempt, *model, loader);
  Reporter report(plan, attempt, *model, step);
  Stepper stepper(plan, *model, loader);
  const int64_t hang_at = HangStep(plan.env);
  report.Start();
  while (step < plan.spec.steps()) {
    ++step;
    if (step == hang_at) Hang(plan.env, step);
    ASSIGN_OR_RETURN(StepResult r, stepper.Step(step));
    if (report.Due(step)) RETURN_IF_ERROR(report.Report(r));
    if (checkpoints.Due(step)) RETURN_IF_ERROR(checkpoints.Save(step));
  }
  RETURN_IF_ERROR(checkpoints.Finish());
  report.Done(step);
  return absl::OkStatus();
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

absl::StatusOr<store::Client> ConnectStore(const job::WorkerEnv& env) {
  store::ClientOptions co;
  co.address = env.store_addr;
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

}  // namespace

absl::Status Train(const Plan& plan) {
  const job::WorkerEnv& env = plan.env;
  ASSIGN_OR_RETURN(store::Client client, ConnectStore(env));
  store::Client attempt = client.WithPrefix(env.prefix());
  // Stop within ~0.1 s when the job is told to stop (a peer died, cancel, node lost), dumping the
  // flight recorder first; see stop_watch.h.
  flight::FlightRecorder recorder;
  StopWatcher watcher(attempt, &recorder, env.fr_dump_dir, env.rank);
  watcher.Start();
  absl::Status st = TrainLoop(plan, attempt, recorder);
  AwaitStopDecision(st, watcher, env.rank);
  RecordExit(st, attempt, env.rank);
  return st;
}

}  // namespace ember::worker
