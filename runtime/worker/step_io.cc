#include "runtime/worker/step_io.h"

#include "runtime/worker/model_state.h"

#include <sys/resource.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proto/jobs.pb.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/keys.h"
#include "runtime/jobspec/pipeline_layout.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
namespace {

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

double TokensPerStep(const Plan& plan) {
  const spec::JobSpec& s = plan.spec;
  const spec::PipelineLayout pl = spec::PipelineLayoutOf(s);
  const double per_replica = static_cast<double>(s.batch_size()) * plan.model.context *
                             (pl.enabled() ? pl.micro_batches : s.parallelism().micro_batches());
  return per_replica * plan.env.world_size / pl.ranks;
}

Reporter::Reporter(const Plan& plan, store::Client& attempt, int64_t state_bytes,
                   int64_t first_step)
    : plan_(plan), attempt_(attempt), state_bytes_(state_bytes), first_(first_step),
      start_(absl::Now()) {
  (void)base::MakeDirs(absl::StrCat(plan.env.job_dir, "/metrics"));  // best effort: open reports it
  metrics_.open(plan.metrics_path, std::ios::app);
}

void Reporter::Start() const {
  spdlog::info("{} | rank {}/{} | {} params, {} state bytes/rank | {} threads | from step {}",
               spec::Summarize(plan_.spec), plan_.env.rank, plan_.env.world_size,
               model::ParamSpecs(plan_.model).size(), state_bytes_, plan_.threads, first_);
}

bool Reporter::Due(int64_t step) const {
  return step % plan_.spec.log_every() == 0 || step == plan_.spec.steps();
}

absl::Status Reporter::Report(const StepResult& r) {
  const spec::JobSpec& s = plan_.spec;
  const double tps = TokensPerStep(plan_) / r.seconds;
  const double avg = absl::ToDoubleSeconds(absl::Now() - start_) / static_cast<double>(r.step - first_);
  const double eta = avg * static_cast<double>(s.steps() - r.step);
  const auto& b = r.bytes;
  const int64_t rss = PeakRssBytes();
  spdlog::info("step {}/{} loss {:.4f} lr {:.3g} grad_norm {:.3f} tok/s {:.0f}{} eta {} peak_rss {:.1f}MB "
               "comm_wait {:.0f}% ag[{}] rs[{}]{}",
               r.step, s.steps(), r.loss, r.lr, r.grad_norm, tps,
               r.mfu < 0 ? "" : absl::StrFormat(" mfu %.2f%%", 100 * r.mfu),
               absl::FormatDuration(absl::Seconds(std::round(eta))), rss / 1e6,
               100 * r.comm_wait_s / r.seconds, BytesHuman(b.all_gather), BytesHuman(b.reduce_scatter),
               r.device_memory_bytes < 0 ? "" : absl::StrCat(" device_mem ", r.device_memory_bytes / 1000000, "MB (peak ",
                                                             r.device_peak_memory_bytes / 1000000, "MB)"));
  jobs::v1::Progress p;
  p.set_step(r.step);
  p.set_steps(s.steps());
  p.set_loss(r.loss);
  p.set_lr(r.lr);
  p.set_grad_norm(r.grad_norm);
  p.set_tokens_per_s(tps);
  p.set_eta_s(eta);
  p.set_peak_rss_bytes(rss);
  p.set_comm_memory_bytes(r.comm_memory_bytes);
  p.set_step_seconds(r.seconds);
  p.set_comm_wait_seconds(r.comm_wait_s);
  if (r.publish) {
    p.mutable_publish()->set_published(r.publish->published);
    p.mutable_publish()->set_skipped(r.publish->skipped);
    p.mutable_publish()->set_dropped(r.publish->dropped);
  }
  if (r.replicas) {
    auto* rs = p.mutable_replicas();
    rs->set_resumed_from(r.replicas->resumed_from);
    rs->set_resumed_step(r.replicas->resumed_step);
    rs->set_disk_checkpoint_reads(r.replicas->disk_checkpoint_reads);
    rs->set_memory_bytes(r.replicas->memory_bytes);
    rs->set_committed_step(r.replicas->committed_step);
    rs->set_save_seconds(r.replicas->save_seconds);
  }
  RETURN_IF_ERROR(attempt_.Set(job::keys::ProgressOf(plan_.env.rank), p.SerializeAsString()));
  metrics_ << absl::StrCat(
                  "{\"step\":", r.step, ",\"loss\":", Num(r.loss), ",\"local_loss\":", Num(r.local_loss),
                  ",\"lr\":", Num(r.lr), ",\"grad_norm\":", Num(r.grad_norm), ",\"tokens_per_s\":", Num(tps),
                  ",\"step_s\":", Num(r.seconds), ",\"comm_wait_s\":", Num(r.comm_wait_s),
                  ",\"peak_rss_bytes\":", rss, ",\"state_bytes\":", state_bytes_,
                  ",\"comm_memory_bytes\":", r.comm_memory_bytes,
                  ",\"bytes\":{\"all_gather\":", BytesJson(b.all_gather),
                  ",\"reduce_scatter\":", BytesJson(b.reduce_scatter),
                  ",\"all_reduce\":", BytesJson(b.all_reduce),
                  ",\"reduce_scatter_promoted\":", b.reduce_scatter_promoted, "}",
                  r.checkpoint_save_s >= 0 ? absl::StrCat(",\"checkpoint_save_s\":", Num(r.checkpoint_save_s)) : "",
                  r.flight_entries >= 0 ? absl::StrCat(",\"flight_entries\":", r.flight_entries) : "",
                  r.device_memory_bytes >= 0 ? absl::StrCat(",\"device_memory_bytes\":", r.device_memory_bytes,
                                                            ",\"device_peak_memory_bytes\":", r.device_peak_memory_bytes) : "",
                  r.mfu >= 0 ? absl::StrCat(",\"mfu\":", Num(r.mfu)) : "",
                  r.replicas ? absl::StrCat(",\"replicas\":{\"resumed_from\":\"", r.replicas->resumed_from,
                                            "\",\"resumed_step\":", r.replicas->resumed_step,
                                            ",\"disk_checkpoint_reads\":", r.replicas->disk_checkpoint_reads,
                                            ",\"memory_bytes\":", r.replicas->memory_bytes,
                                            ",\"committed_step\":", r.replicas->committed_step,
                                            ",\"save_s\":", Num(r.replicas->save_seconds), "}")
                            : "",
                  ",\"attempt\":", plan_.env.attempt, ",\"unix_ms\":", absl::ToUnixMillis(absl::Now()), "}")
           << "\n"
           << std::flush;
  return absl::OkStatus();
}

void Reporter::Done(int64_t step) const {
  spdlog::info("done: {} steps in {}", step - first_, absl::FormatDuration(absl::Now() - start_));
}

Checkpointer::Checkpointer(const Plan& plan, store::Client& attempt, SnapshotFn snapshot)
    : plan_(plan), snapshot_(std::move(snapshot)),
      protocol_(std::make_shared<ckpt::StoreCommitProtocol>(attempt)),
      options_{.root = plan.checkpoint_root, .rank = plan.env.rank, .world_size = plan.env.world_size,
               .keep_last = std::max(1, plan.spec.checkpoint().keep_last()),
               .commit_timeout = absl::Seconds(plan.spec.collective_timeout_s())} {
  (void)base::MakeDirs(plan.checkpoint_root);  // best effort: a failure shows at the first save
  if (plan.spec.checkpoint().async()) async_ = std::make_unique<ckpt::AsyncSaver>(options_, protocol_);
}

bool Checkpointer::Due(int64_t step) const {
  const int every = plan_.spec.checkpoint().every_steps();
  return (every > 0 && step % every == 0) || step == plan_.spec.steps();
}

absl::Status Checkpointer::Save(int64_t step) {
  const absl::Time t0 = absl::Now();
  ckpt::RankState st = snapshot_(step);
  RecordModel(plan_.model, &st);  // so `emberctl ckpt export --format hf` needs no job spec
  if (async_) {
    RETURN_IF_ERROR(async_->Start(st));
  } else {
    RETURN_IF_ERROR(ckpt::SaveCheckpoint(options_, st, protocol_.get()));
  }
  last_save_s_ = absl::ToDoubleSeconds(absl::Now() - t0);
  spdlog::info("checkpoint step {} {} in {}", step, async_ ? "started" : "committed",
               absl::FormatDuration(absl::Now() - t0));
  return absl::OkStatus();
}

}  // namespace ember::worker
