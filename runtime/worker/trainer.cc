#include "runtime/worker/trainer.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/dtype.h"
#include "checkpoint/safetensors.h"
#include "kernels/cast.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/store_rendezvous.h"
#include "runtime/flight/recorder.h"
#include "runtime/store/client.h"
#include "runtime/worker/stop_watch.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
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

absl::StatusOr<Plan> Prepare(const WorkerEnv& env, const std::string& spec_path) {
  Plan p;
  p.env = env;
  std::string path = !spec_path.empty() ? spec_path
                     : !env.job_spec.empty() ? env.job_spec
                                             : absl::StrCat(env.job_dir, "/job.yaml");
  ASSIGN_OR_RETURN(p.spec, spec::LoadJobSpec(path));
  const spec::JobSpec& s = p.spec;
  if (env.device != "cpu") {
    return Bad("EMBER_DEVICE", absl::StrCat("'", env.device, "': this ember-worker build has CPU kernels only; use cpu"));
  }
  const auto& par = s.parallelism();
  if (par.strategy() == "pipeline") return Bad("parallelism.strategy", "'pipeline' is not implemented by ember-worker; use fsdp or none");
  if (par.strategy() == "none" && env.world_size != 1) {
    return Bad("parallelism.strategy", absl::StrCat("'none' needs one rank, EMBER_WORLD_SIZE is ", env.world_size));
  }
  if (par.world_size() != 0 && par.world_size() != env.world_size) {
    return Bad("parallelism.world_size", absl::StrCat(par.world_size(), " does not match EMBER_WORLD_SIZE=", env.world_size));
  }
  if (!par.backend().empty() && par.backend() != "cpu") {
    return Bad("parallelism.backend", absl::StrCat("'", par.backend(), "' needs a device build; use cpu"));
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
  data::TokenLoader probe(p.tokens, {.seq_len = p.model.context, .batch = s.batch_size(), .rank = env.rank,
                                     .world = env.world_size, .seed = p.fsdp.seed, .shuffle = true,
                                     .start_token = d.start_position()});
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

// Copies this rank's rows of every parameter and its AdamW state from the checkpoint in step
// directory `dir` (any world size: ReadShard asks for our torch.chunk rows). Returns its step.
absl::StatusOr<int64_t> Restore(const std::string& dir, fsdp::FsdpGpt& m, data::TokenLoader& loader) {
  ASSIGN_OR_RETURN(auto reader, ckpt::CheckpointReader::Open(dir));
  const ckpt::Metadata& meta = reader->metadata();
  for (const fsdp::ShardView& v : m.Shards()) {
    const std::pair<std::string, float*> parts[] = {{v.name, v.param},
                                                    {absl::StrCat("optim.", v.name, ".exp_avg"), v.exp_avg},
                                                    {absl::StrCat("optim.", v.name, ".exp_avg_sq"), v.exp_avg_sq}};
    for (const auto& [name, dst] : parts) {
      const ckpt::TensorMeta* t = meta.Find(name);
      if (t == nullptr) return absl::NotFoundError(absl::StrCat(reader->dir(), ": no tensor ", name));
      if (t->shape != v.global_shape) {
        return absl::FailedPreconditionError(absl::StrCat(reader->dir(), ": ", name, " has another shape than the model"));
      }
      ASSIGN_OR_RETURN(std::string rows, reader->ReadShard(name, m.rank(), m.world(), ckpt::DType::kF32));
      if (static_cast<int64_t>(rows.size()) != v.rows * v.row_numel * 4) {
        return absl::DataLossError(absl::StrCat(name, ": shard of ", rows.size(), " bytes, want ", v.rows * v.row_numel * 4));
      }
      std::memcpy(dst, rows.data(), rows.size());
    }
  }
  ASSIGN_OR_RETURN(std::string ds, reader->ReadBlob(0, "data_loader"));
  RETURN_IF_ERROR(loader.RestoreState(ds));
  auto it = meta.extra.find("optimizer_step");
  m.set_optimizer_step(it != meta.extra.end() ? std::stoll(it->second) : meta.step);
  spdlog::info("resumed from {} (step {}, saved by {} ranks, now {}{})", reader->dir(), meta.step,
               meta.world_size, m.world(), meta.world_size != m.world() ? ": resharded" : "");
  return meta.step;
}

// Initialises this rank's parameter shards from safetensors weights named like the model's
// parameters (a single file or a model.safetensors.index.json set; F32, BF16 or F16). Optimizer
// state starts at zero. Every model parameter must be present with the model's shape.
absl::Status InitFromSafetensors(const std::string& path, fsdp::FsdpGpt& m) {
  ASSIGN_OR_RETURN(auto set, ckpt::SafetensorsSet::Open(path));
  size_t used = 0;
  for (const fsdp::ShardView& v : m.Shards()) {
    auto found = set->Find(v.name);
    if (!found.ok()) {
      return absl::NotFoundError(absl::StrCat(path, ": no tensor '", v.name,
                                              "' (checkpoint.init_from_safetensors needs every "
                                              "model parameter; see docs/model.md for names)"));
    }
    const auto [file, info] = *found;
    if (info->shape != v.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": tensor '", v.name, "' has shape [", absl::StrJoin(info->shape, ","),
          "], the model wants [", absl::StrJoin(v.global_shape, ","), "]"));
    }
    const size_t elem = ckpt::DTypeSize(info->dtype);
    absl::string_view bytes = file->Data(*info);
    const int64_t n = v.rows * v.row_numel;
    absl::string_view rows = bytes.substr(static_cast<size_t>(v.row_begin * v.row_numel) * elem,
                                          static_cast<size_t>(n) * elem);
    if (info->dtype == ckpt::DType::kF16) {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, rows.data() + i * 2, 2);
        v.param[i] = kernels::F16ToF32(h);
      }
    } else {
      absl::Status st = ckpt::ConvertDType(info->dtype, rows.data(), ckpt::DType::kF32, v.param,
                                           static_cast<size_t>(n));
      if (!st.ok()) return base::Annotate(st, absl::StrCat(path, ": tensor '", v.name, "'"));
    }
    ++used;
  }
  spdlog::info("initialised {} parameters from {} ({} tensors in the file{})", used, path,
               set->names().size(), set->names().size() > used ? "; extra tensors ignored" : "");
  return absl::OkStatus();
}

ckpt::RankState Snapshot(fsdp::FsdpGpt& m, const data::TokenLoader& loader, int64_t step, uint64_t seed) {
  ckpt::RankState st;
  st.step = step;
  auto view = [](const float* p, int64_t n) {
    return absl::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n) * 4);
  };
  for (const fsdp::ShardView& v : m.Shards()) {
    const int64_t n = v.rows * v.row_numel;
    st.tensors.push_back({v.name, ckpt::DType::kF32, v.global_shape, v.row_begin, view(v.param, n)});
    st.tensors.push_back({absl::StrCat("optim.", v.name, ".exp_avg"), ckpt::DType::kF32, v.global_shape,
                          v.row_begin, view(v.exp_avg, n)});
    st.tensors.push_back({absl::StrCat("optim.", v.name, ".exp_avg_sq"), ckpt::DType::kF32,
                          v.global_shape, v.row_begin, view(v.exp_avg_sq, n)});
  }
  // The only randomness of a step is the data order, which (seed, position) determines.
  st.rng_state = absl::StrCat("seed=", seed);
  st.data_loader_state = loader.SaveState();
  st.extra["optimizer_step"] = absl::StrCat(m.optimizer_step());
  st.parallelism["fsdp"] = absl::StrCat(m.world());
  return st;
}

}  // namespace

namespace {

// EMBER_WORKER_FAULT "hang:rank=R,step=S[,attempt=A]": the step at which this rank hangs, or -1.
int64_t HangStep(const WorkerEnv& env) {
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

absl::Status TrainLoop(const Plan& plan, store::Client& job, flight::FlightRecorder& recorder);

}  // namespace

absl::Status Train(const Plan& plan) {
  const WorkerEnv& env = plan.env;
  store::ClientOptions co;
  co.address = env.store_addr;
  if (!env.auth_token_file.empty()) {
    std::ifstream f(env.auth_token_file);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("EMBER_AUTH_TOKEN_FILE '", env.auth_token_file, "' is unreadable"));
    std::string tok((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    co.auth_token = std::string(absl::StripAsciiWhitespace(tok));
  }
  if (env.tls.enabled()) {
    ASSIGN_OR_RETURN(co.credentials, base::MakeChannelCredentials(env.tls));
  }
  ASSIGN_OR_RETURN(store::Client client, store::Client::Connect(co));
  store::Client job = client.WithPrefix(env.prefix());

  // Stop within ~0.1 s when the job is told to stop (a peer died, cancel, node lost), dumping the
  // flight recorder first; see stop_watch.h.
  flight::FlightRecorder recorder;
  StopWatcher watcher(job, &recorder, env.fr_dump_dir, env.rank);
  watcher.Start();
  absl::Status st = TrainLoop(plan, job, recorder);
  if (!st.ok() && ShouldWaitForStop(st)) {
    // A peer's death surfaces here first as UNAVAILABLE/ABORTED; the daemon that saw the death
    // sets the stop key within a poll interval. Exiting now would race the real root cause.
    spdlog::warn("rank {}: {}; waiting for the job's stop decision", env.rank, st.ToString());
    watcher.AwaitStop(absl::Seconds(3));
  }
  if (!st.ok()) watcher.Dump(absl::StrCat("error: ", st.ToString()));
  // For a daemon that re-attached to this process (it cannot wait() for a non-child).
  store::CallOptions o;
  o.timeout = absl::Seconds(2);
  (void)job.Set(absl::StrCat("worker_exit/", env.rank), st.ok() ? "0" : "1", o);
  return st;
}

namespace {

absl::Status TrainLoop(const Plan& plan, store::Client& job, flight::FlightRecorder& recorder) {
  const WorkerEnv& env = plan.env;
  const spec::JobSpec& s = plan.spec;
  comm::GroupOptions go;
  go.name = "world";
  go.timeout = absl::Seconds(s.collective_timeout_s());
  go.recorder = &recorder;
  go.dump_dir = env.fr_dump_dir;
  go.global_rank = env.rank;
  auto rdzv = comm::MakeStoreRendezvous(job);
  ASSIGN_OR_RETURN(auto world, comm::ProcessGroup::Create(rdzv, env.rank, env.world_size, go));
  std::unique_ptr<comm::ProcessGroup> rs;
  if (plan.separate_reduce_scatter && env.world_size > 1) {
    go.name = "reduce_scatter";
    ASSIGN_OR_RETURN(rs, comm::ProcessGroup::Create(rdzv, env.rank, env.world_size, go));
  }
  ASSIGN_OR_RETURN(auto model, fsdp::FsdpGpt::Create(plan.model, {world.get(), rs.get()}, plan.fsdp));

  const int64_t B = s.batch_size(), T = plan.model.context, M = s.parallelism().micro_batches();
  data::TokenLoader loader(plan.tokens, {.seq_len = T, .batch = B, .rank = env.rank, .world = env.world_size,
                                         .seed = plan.fsdp.seed, .shuffle = true,
                                         .start_token = s.data().start_position()});
  int64_t step = 0;
  // A damaged `latest` falls back to the newest checkpoint that verifies (logged); only a root
  // without any committed step starts from 0. Steps newer than the one resumed are never deleted
  // (SaveOptions::keep_last).
  absl::StatusOr<std::string> resume = ckpt::FindResumeCheckpoint(plan.checkpoint_root);
  if (!resume.ok() && !absl::IsNotFound(resume.status())) return resume.status();
  if (resume.ok()) {
    const absl::Time t0 = absl::Now();
    ASSIGN_OR_RETURN(step, Restore(*resume, *model, loader));
    // recovery_bench reads this line: the restart time it reports excludes the load.
    spdlog::info("checkpoint load took {}", absl::FormatDuration(absl::Now() - t0));
  } else if (!plan.init_safetensors.empty()) {
    RETURN_IF_ERROR(InitFromSafetensors(plan.init_safetensors, *model));
  }
  // Best effort, as before: a directory that cannot be made fails at the first save or open.
  (void)base::MakeDirs(plan.checkpoint_root);
  (void)base::MakeDirs(absl::StrCat(env.job_dir, "/metrics"));
  std::ofstream metrics(plan.metrics_path, std::ios::app);

  auto protocol = std::make_shared<ckpt::StoreCommitProtocol>(job);
  ckpt::SaveOptions so{.root = plan.checkpoint_root, .rank = env.rank, .world_size = env.world_size,
                       .keep_last = std::max(1, s.checkpoint().keep_last()),
                       .commit_timeout = absl::Seconds(s.collective_timeout_s())};
  std::unique_ptr<ckpt::AsyncSaver> async;
  if (s.checkpoint().async()) async = std::make_unique<ckpt::AsyncSaver>(so, protocol);
  auto save = [&](int64_t at) -> absl::Status {
    const absl::Time t0 = absl::Now();
    ckpt::RankState st = Snapshot(*model, loader, at, plan.fsdp.seed);
    if (async) {
      RETURN_IF_ERROR(async->Start(st));
    } else {
      RETURN_IF_ERROR(ckpt::SaveCheckpoint(so, st, protocol.get()));
    }
    spdlog::info("checkpoint step {} {} in {}", at, async ? "started" : "committed", absl::FormatDuration(absl::Now() - t0));
    return absl::OkStatus();
  };

  kernels::ThreadPool pool(plan.threads);
  kernels::ExecContext ctx{&pool, s.deterministic()};
  spdlog::info("{} | rank {}/{} | {} params, {} state bytes/rank | {} threads | from step {}",
               spec::Summarize(s), env.rank, env.world_size, model::ParamSpecs(plan.model).size(),
               model->state_bytes(), plan.threads, step);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  const absl::Time start = absl::Now();
  const int64_t first = step;
  int64_t saved = step;
  const int64_t hang_at = HangStep(env);
  while (step < s.steps()) {
    ++step;
    if (step == hang_at) {
      spdlog::warn("fault injection: rank {} hangs at step {} (EMBER_WORKER_FAULT)", env.rank, step);
      for (;;) absl::SleepFor(absl::Seconds(1));
    }
    const float lr = LearningRate(s, step);
    model->ResetCommBytes();
    model->ResetCommWait();
    const absl::Time t0 = absl::Now();
    double loss = 0;
    for (int64_t k = 0; k < M; ++k) {
      RETURN_IF_ERROR(loader.Next(tok.data(), tgt.data()));
      ASSIGN_OR_RETURN(float l, model->ForwardBackward(ctx, tok.data(), tgt.data(), B, T, k == M - 1));
      loss += static_cast<double>(l) / M;
    }
    ASSIGN_OR_RETURN(double mean, model->AllReduceMean(loss));
    ASSIGN_OR_RETURN(double norm, model->OptimizerStep(ctx, lr));
    const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
    const double tps = static_cast<double>(env.world_size * B * T * M) / dt;
    const double avg = absl::ToDoubleSeconds(absl::Now() - start) / static_cast<double>(step - first);
    const double eta = avg * static_cast<double>(s.steps() - step);
    if (!std::isfinite(mean)) return absl::InternalError(absl::StrCat("loss is ", mean, " at step ", step));
    if (step % s.log_every() == 0 || step == s.steps()) {
      const auto& b = model->comm_bytes();
      const int64_t rss = PeakRssBytes();
      spdlog::info("step {}/{} loss {:.4f} lr {:.3g} grad_norm {:.3f} tok/s {:.0f} peak_rss {:.1f}MB "
                   "comm_wait {:.0f}% ag[{}] rs[{}]",
                   step, s.steps(), mean, lr, norm, tps, rss / 1e6,
                   100 * absl::ToDoubleSeconds(model->comm_wait()) / dt, BytesHuman(b.all_gather),
                   BytesHuman(b.reduce_scatter));
      const std::string progress = absl::StrCat(
          "{\"step\":", step, ",\"steps\":", s.steps(), ",\"loss\":", Num(mean), ",\"lr\":", Num(lr),
          ",\"grad_norm\":", Num(norm), ",\"tokens_per_s\":", Num(tps), ",\"eta_s\":", Num(eta),
          ",\"peak_rss_bytes\":", rss, "}");
      RETURN_IF_ERROR(job.Set(absl::StrCat("progress/", env.rank), progress));
      metrics << absl::StrCat(
                     "{\"step\":", step, ",\"loss\":", Num(mean), ",\"local_loss\":", Num(loss),
                     ",\"lr\":", Num(lr), ",\"grad_norm\":", Num(norm), ",\"tokens_per_s\":", Num(tps),
                     ",\"step_s\":", Num(dt), ",\"comm_wait_s\":", Num(absl::ToDoubleSeconds(model->comm_wait())),
                     ",\"peak_rss_bytes\":", rss, ",\"state_bytes\":", model->state_bytes(),
                     ",\"bytes\":{\"all_gather\":", BytesJson(b.all_gather),
                     ",\"reduce_scatter\":", BytesJson(b.reduce_scatter),
                     ",\"all_reduce\":", BytesJson(b.all_reduce),
                     ",\"reduce_scatter_promoted\":", b.reduce_scatter_promoted, "}}")
              << "\n"
              << std::flush;
    }
    const int every = s.checkpoint().every_steps();
    if ((every > 0 && step % every == 0) || step == s.steps()) {
      RETURN_IF_ERROR(save(step));
      saved = step;
    }
  }
  if (async) RETURN_IF_ERROR(async->Wait());
  (void)saved;
  spdlog::info("done: {} steps in {}", step - first, absl::FormatDuration(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace

}  // namespace ember::worker
