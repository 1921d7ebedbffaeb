#include "runtime/worker/step_io.h"

#include "runtime/worker/model_state.h"

#include <sys/resource.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
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

// "f32=123,bf16=456" for one collective's bytes; "-" when it moved none.
std::string BytesHuman(const jobs::v1::StepMetrics& m, absl::string_view collective) {
  std::vector<std::string> parts;
  for (const jobs::v1::CollectiveBytes& c : m.collective_bytes()) {
    if (c.collective() == collective) parts.push_back(absl::StrCat(c.dtype(), "=", c.bytes()));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

}  // namespace

void SetCommBytes(const fsdp::CommBytes& b, StepResult* r) {
  r->clear_collective_bytes();
  auto add = [r](const char* collective, const std::map<std::string, int64_t>& by_dtype) {
    for (const auto& [dtype, bytes] : by_dtype) {
      jobs::v1::CollectiveBytes* c = r->add_collective_bytes();
      c->set_collective(collective);
      c->set_dtype(dtype);
      c->set_bytes(bytes);
    }
  };
  add("all_gather", b.all_gather);
  add("reduce_scatter", b.reduce_scatter);
  add("all_reduce", b.all_reduce);
  r->set_reduce_scatter_promoted_bytes(b.reduce_scatter_promoted);
}

void SetPublishCounts(const PublishCounts& c, StepResult* r) {
  r->set_publish_published(c.published);
  r->set_publish_skipped(c.skipped);
  r->set_publish_dropped(c.dropped);
}

void SetReplicaCounts(const ReplicaCounts& c, StepResult* r) {
  r->set_replica_resumed_from_memory(c.from_memory ? 1 : 0);
  r->set_replica_resumed_step(c.resumed_step);
  r->set_replica_disk_checkpoint_reads(c.disk_checkpoint_reads);
  r->set_replica_memory_bytes(c.memory_bytes);
  if (c.committed_step >= 0) r->set_replica_committed_step(c.committed_step);
  r->set_replica_save_s(c.save_seconds);
  r->set_replica_resumed_from_network(c.from_network ? 1 : 0);
  r->set_replica_network_bytes(c.network_bytes);
}

std::string MetricsJson(const jobs::v1::StepMetrics& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;  // the stable names: step_s, not stepS
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);  // fails only on invalid UTF-8
  return out;
}

std::string LogLine(const jobs::v1::StepMetrics& m, int64_t steps, double eta_s) {
  return absl::StrCat(
      absl::StrFormat("step %d/%d loss %.4f lr %.3g grad_norm %s tok/s %.0f", m.step(), steps,
                      m.loss(), m.lr(),
                      m.has_grad_norm() ? absl::StrFormat("%.3f", m.grad_norm()) : "-",
                      m.tokens_per_s()),
      m.has_mfu() ? absl::StrFormat(" mfu %.2f%%", 100 * m.mfu()) : "",
      " eta ", absl::FormatDuration(absl::Seconds(std::round(eta_s))),
      absl::StrFormat(" peak_rss %.1fMB comm_wait %.0f%% ag[%s] rs[%s]", m.peak_rss_bytes() / 1e6,
                      m.step_s() > 0 ? 100 * m.comm_wait_s() / m.step_s() : 0.0,
                      BytesHuman(m, "all_gather"), BytesHuman(m, "reduce_scatter")),
      m.has_device_memory_bytes()
          ? absl::StrCat(" device_mem ", m.device_memory_bytes() / 1000000, "MB (peak ",
                         m.device_peak_memory_bytes() / 1000000, "MB)")
          : "");
}

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
               plan_.arch->ParamSpecs().size(), state_bytes_, plan_.threads, first_);
}

bool Reporter::Due(int64_t step) const {
  return step % plan_.spec.log_every() == 0 || step == plan_.spec.steps();
}

absl::Status Reporter::Report(StepResult r) {
  const spec::JobSpec& s = plan_.spec;
  const double avg = absl::ToDoubleSeconds(absl::Now() - start_) / static_cast<double>(r.step() - first_);
  const double eta = avg * static_cast<double>(s.steps() - r.step());
  r.set_tokens_per_s(TokensPerStep(plan_) / r.step_s());
  r.set_peak_rss_bytes(PeakRssBytes());
  r.set_state_bytes(state_bytes_);
  r.set_attempt(plan_.env.attempt);
  r.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  spdlog::info("{}", LogLine(r, s.steps(), eta));
  jobs::v1::Progress p;
  p.set_steps(s.steps());
  p.set_eta_s(eta);
  *p.mutable_metrics() = r;
  RETURN_IF_ERROR(attempt_.Set(job::keys::ProgressOf(plan_.env.rank), p.SerializeAsString()));
  metrics_ << MetricsJson(r) << "\n" << std::flush;
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
  RecordModel(plan_.spec.model().arch(), plan_.model, &st);  // so `emberctl ckpt export --format hf` needs no job spec
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
