// The Jobs and Nodes RPC handlers (gRPC sync API: every handler is short except the two streams,
// which poll files and the store and end when the client cancels or the job ends).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/daemon/memory_estimate.h"
#include "runtime/daemon/spec_policy.h"
#include "runtime/job/env.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/jobspec/spec.h"
#include "runtime/model/from_spec.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {
namespace {

using base::ToGrpcStatus;
namespace v1 = jobs::v1;

constexpr size_t kMaxUploadBytes = 8 << 20;

std::string JobIdFor(const std::string& name) {
  std::string base;
  for (char c : name) {
    c = absl::ascii_tolower(c);
    base += (absl::ascii_isalnum(c) || c == '-') ? c : '-';
  }
  if (base.empty()) base = "job";
  if (base.size() > 40) base.resize(40);
  return absl::StrCat(base, "-", ember::base::GenerateToken().substr(0, 6));
}

bool ValidSubmissionId(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.')) return false;
  }
  return true;
}

class JobsService final : public v1::Jobs::Service {
 public:
  explicit JobsService(Daemon::Impl* d) : d_(d) {}

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req,
                      v1::SubmitResponse* resp) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.Submit");
    if (!auth.ok()) return auth;
    absl::Status s = DoSubmit(ctx, *req, resp);
    if (!s.ok()) {
      spdlog::warn("Submit from {} rejected: {}", ctx->peer(), s.ToString());
    }
    return ToGrpcStatus(s);
  }

  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::Job* out) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.Get");
    if (!auth.ok()) return auth;
    auto rec = GetJob(req->id());
    if (!rec.ok()) return ToGrpcStatus(rec.status());
    *out = *rec;
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                    v1::ListJobsResponse* out) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.List");
    if (!auth.ok()) return auth;
    auto listed = ListJobs(d_, req->active_only());
    if (!listed.ok()) return ToGrpcStatus(listed.status());
    std::vector<v1::Job>& jobs = *listed;
    size_t limit = req->limit() > 0 ? req->limit() : 100;
    for (size_t i = 0; i < jobs.size() && i < limit; ++i) {
      d_->FillProgress(&jobs[i]);
      jobs[i].clear_spec();  // listings stay small; Get has it
      *out->add_jobs() = jobs[i];
    }
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                      v1::Job* out) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.Cancel");
    if (!auth.ok()) return auth;
    int stop_attempt = -1, drain_attempt = -1;
    auto job = d_->UpdateRecord(req->id(), [&](v1::Job* j) {
      if (IsTerminal(j->state())) return false;
      if (req->checkpoint() && j->state() == v1::RUNNING && j->attempts_size() > 0) {
        // The ranks checkpoint and exit 76; the scheduler then marks the job CANCELLED.
        drain_attempt = j->attempts(j->attempts_size() - 1).number();
        j->set_reason("cancelling: checkpoint requested");
        return true;
      }
      if (j->attempts_size() > 0) stop_attempt = j->attempts(j->attempts_size() - 1).number();
      j->set_state(v1::CANCELLED);
      j->set_reason("cancelled");
      j->set_end_unix_ms(NowMs());
      return true;
    });
    if (!job.ok()) return ToGrpcStatus(NotFoundNamed(job.status(), req->id()));
    if (drain_attempt >= 0) {
      absl::Status st = d_->store->Set(keys::Drain(req->id(), drain_attempt), absl::StrCat("cancel --checkpoint from ", ctx->peer()));
      if (!st.ok()) return ToGrpcStatus(base::Annotate(st, "writing the job's drain key"));
      spdlog::info("job {} attempt {}: checkpoint-and-stop requested by {}", req->id(), drain_attempt, ctx->peer());
      *out = *job;
      return grpc::Status::OK;
    }
    if (stop_attempt >= 0) (void)d_->store->Set(keys::Stop(req->id(), stop_attempt), "cancelled");
    spdlog::info("job {} cancelled by {}", req->id(), ctx->peer());
    *out = *job;
    return grpc::Status::OK;
  }

  grpc::Status StreamLogs(grpc::ServerContext* ctx, const v1::StreamLogsRequest* req,
                          grpc::ServerWriter<v1::LogLine>* writer) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.StreamLogs");
    if (!auth.ok()) return auth;
    auto job = GetJob(req->id());
    if (!job.ok()) return ToGrpcStatus(job.status());
    std::vector<int> ranks;
    for (int r = 0; r < job->world_size(); ++r) {
      if (req->rank() < 0 || req->rank() == r) ranks.push_back(r);
    }
    if (req->rank() >= job->world_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("rank: ", req->rank(), " is not in 0..",
                                       job->world_size() - 1));
    }
    std::string dir = d_->JobDir(req->id());
    // Ranks whose log is on another node (no shared work root) are forwarded to that node.
    if (!req->local_only() && job->attempts_size() > 0) {
      const auto& at = job->attempts(job->attempts_size() - 1);
      for (const auto& na : at.assignment().nodes()) {
        if (na.node() == d_->opts.node_name) continue;
        for (int i = 0; i < na.devices_size(); ++i) {
          int r = na.first_rank() + i;
          struct stat st;
          if (std::find(ranks.begin(), ranks.end(), r) != ranks.end() &&
              ::stat(absl::StrCat(dir, "/logs/rank-", r, ".log").c_str(), &st) != 0) {
            return Forward(ctx, *req, na.daemon_address(), writer);
          }
        }
      }
    }
    std::map<int, int64_t> offset;
    std::map<int, std::string> partial;
    for (int pass = 0;; ++pass) {
      bool ended = false;
      if (pass > 0) {
        auto j = GetJob(req->id());
        ended = !j.ok() || IsTerminal(j->state());
      }
      for (int r : ranks) {
        // In the daemon's own logs/ directory, never through a symlink (job_files.h).
        auto f = OpenFileBelow(d_->opts.work_root, absl::StrCat(req->id(), "/logs/rank-", r, ".log"),
                               O_RDONLY, 0, /*own_dir=*/true);
        struct stat st;
        if (!f.ok() || ::fstat(f->get(), &st) != 0) continue;
        const int64_t size = st.st_size;
        if (size < offset[r]) offset[r] = 0;  // rotated (copy-truncate)
        std::string chunk(size - offset[r], '\0');
        const ssize_t got = ::pread(f->get(), chunk.data(), chunk.size(), offset[r]);
        chunk.resize(got > 0 ? got : 0);
        offset[r] += chunk.size();
        std::string text = partial[r] + chunk;
        std::vector<std::string> lines;
        size_t start = 0;
        for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
          lines.push_back(text.substr(start, nl - start));
        }
        partial[r] = text.substr(start);
        size_t from = 0;
        if (pass == 0 && req->tail_lines() > 0 && lines.size() > size_t(req->tail_lines())) {
          from = lines.size() - req->tail_lines();
        }
        for (size_t i = from; i < lines.size(); ++i) {
          v1::LogLine l;
          l.set_rank(r);
          l.set_line(lines[i]);
          if (!writer->Write(l)) return grpc::Status::OK;
        }
      }
      if (!req->follow() || ended || ctx->IsCancelled() || d_->stop.HasBeenNotified()) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return grpc::Status::OK;
  }

  grpc::Status StreamMetrics(grpc::ServerContext* ctx, const v1::StreamMetricsRequest* req,
                             grpc::ServerWriter<v1::MetricsUpdate>* writer) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.StreamMetrics");
    if (!auth.ok()) return auth;
    absl::Duration every = absl::Milliseconds(req->interval_ms() > 0 ? req->interval_ms() : 500);
    std::string last;
    for (;;) {
      auto rec = d_->ReadRecord(req->id());
      if (!rec.ok()) return ToGrpcStatus(NotFoundNamed(rec.status(), req->id()));
      const v1::Job& job = rec->first;
      v1::MetricsUpdate u;
      u.set_state(job.state());
      u.set_reason(job.reason());
      if (job.attempts_size() > 0) {
        int n = job.attempts(job.attempts_size() - 1).number();
        u.set_attempt(n);
        std::vector<std::string> ks;
        for (int r = 0; r < job.world_size(); ++r) ks.push_back(keys::Progress(job.id(), n, r));
        auto vals = d_->store->MultiGet(ks);
        if (vals.ok()) {
          for (int r = 0; r < job.world_size(); ++r) {
            v1::Progress p;
            if ((*vals)[r] && p.ParseFromString(*(*vals)[r])) {
              (*u.mutable_ranks())[r] = p;
            }
          }
        }
      }
      std::string bytes = u.SerializeAsString();
      if (bytes != last) {
        if (!writer->Write(u)) break;
        last = bytes;
      }
      if (!req->follow() || IsTerminal(job.state()) || ctx->IsCancelled() ||
          d_->stop.HasBeenNotified()) {
        break;
      }
      absl::SleepFor(every);
    }
    return grpc::Status::OK;
  }

  grpc::Status DumpFlightRecorder(grpc::ServerContext* ctx, const v1::DumpRequest* req,
                                  v1::DumpResponse* out) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.DumpFlightRecorder");
    if (!auth.ok()) return auth;
    auto rec = d_->ReadRecord(req->id());
    if (!rec.ok()) return ToGrpcStatus(NotFoundNamed(rec.status(), req->id()));
    const v1::Job& job = rec->first;
    if (job.state() != v1::RUNNING || job.attempts_size() == 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("job ", job.id(), " is ", v1::JobState_Name(job.state()),
                                       "; only a running job can dump"));
    }
    int n = job.attempts(job.attempts_size() - 1).number();
    std::string request_id = base::GenerateToken().substr(0, 12);
    absl::Status s = d_->store->Set(keys::DumpRequest(job.id(), n), request_id);
    if (!s.ok()) return ToGrpcStatus(s);
    out->set_directory(absl::StrCat(d_->JobDir(job.id()), "/flight/attempt-", n));
    out->set_request_id(request_id);
    out->set_attempt(n);
    return grpc::Status::OK;
  }

  grpc::Status GetSeries(grpc::ServerContext* ctx, const v1::GetSeriesRequest* req,
                         v1::Series* out) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Jobs.GetSeries");
    if (!auth.ok()) return auth;
    auto job = d_->ReadRecord(req->id());
    if (!job.ok()) return ToGrpcStatus(NotFoundNamed(job.status(), req->id()));
    return ToGrpcStatus(ReadSeries(d_, job->first, req->metric(), req->max_points(),
                                   req->has_attempt() ? req->attempt() : -1, out));
  }

 private:
  static absl::Status NotFoundNamed(const absl::Status& s, const std::string& id) {
    if (absl::IsNotFound(s)) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
    return s;
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& id) {
    auto rec = d_->ReadRecord(id);
    if (!rec.ok()) return NotFoundNamed(rec.status(), id);
    v1::Job job = rec->first;
    d_->FillProgress(&job);
    return job;
  }

  grpc::Status Forward(grpc::ServerContext* ctx, v1::StreamLogsRequest req,
                       const std::string& address, grpc::ServerWriter<v1::LogLine>* writer) {
    auto creds = base::MakeChannelCredentials(d_->opts.tls);
    if (!creds.ok()) return ToGrpcStatus(creds.status());
    auto stub = v1::Jobs::NewStub(grpc::CreateChannel(address, *creds));
    grpc::ClientContext cc;
    if (!d_->opts.auth_token.empty()) {
      cc.AddMetadata("authorization", "Bearer " + d_->opts.auth_token);
    }
    req.set_local_only(true);
    auto reader = stub->StreamLogs(&cc, req);
    v1::LogLine line;
    while (reader->Read(&line)) {
      if (ctx->IsCancelled() || !writer->Write(line)) {
        cc.TryCancel();
        break;
      }
    }
    return reader->Finish();
  }

  absl::Status DoSubmit(grpc::ServerContext* ctx, const v1::SubmitRequest& req,
                        v1::SubmitResponse* resp) {
    if (d_->draining) return absl::UnavailableError("this daemon is draining; submit elsewhere");
    if (req.spec_yaml().size() > (1 << 20)) {
      return absl::InvalidArgumentError("spec_yaml: larger than 1 MiB");
    }
    // The spec resolved once (runtime/model/from_spec.h): defaults, the device's backend, the
    // world (from the node inventory when the spec leaves it open), the parallel dims, the support
    // matrix and the model's checks. Everything a rank would refuse at start is refused here,
    // naming the field; what is stored (and written as <job>/job.yaml) is this resolved spec.
    spec::JobSpec spec;
    {
      ASSIGN_OR_RETURN(spec::JobSpec parsed, spec::ParseJobSpec(req.spec_yaml()));
      ASSIGN_OR_RETURN(auto nodes, d_->ReadNodes());
      spec::Facts facts;
      for (const auto& n : nodes)
        for (const auto& dv : n.devices()) ++facts.devices[dv.kind()];
      ASSIGN_OR_RETURN(spec, spec::Resolve(parsed, facts));
    }
    RETURN_IF_ERROR(CheckSpecPaths(spec, d_->opts.data_roots));
    if (spec::IsScriptJob(spec)) {  // the node that runs it checks again before it forks
      RETURN_IF_ERROR(CheckScriptEnv(spec));
      RETURN_IF_ERROR(
          ScriptIdentityFor(::geteuid(), d_->opts.script_user, d_->opts.allow_root_scripts)
              .status());
    }
    size_t total = 0;
    for (const auto& [name, data] : req.files()) {
      RETURN_IF_ERROR(CheckUploadName(name));
      total += data.size();
    }
    if (total > kMaxUploadBytes) {
      return absl::InvalidArgumentError("files: more than 8 MiB in total; use a --data-root");
    }
    std::string sid = req.submission_id().empty() ? base::GenerateToken().substr(0, 24)
                                                   : req.submission_id();
    if (!ValidSubmissionId(sid)) {
      return absl::InvalidArgumentError(
          "submission_id: 1-128 characters of [A-Za-z0-9._-] expected");
    }

    v1::Job job;
    job.set_id(JobIdFor(spec.name()));
    if (d_->opts.job_id_from_submission && !req.submission_id().empty()) {  // run --slurm
      std::string tail;  // as JobIdFor spells a name: [a-z0-9-]
      for (char c : sid) tail += absl::ascii_isalnum(c) ? absl::ascii_tolower(c) : '-';
      job.set_id(absl::StrCat(job.id().substr(0, job.id().rfind('-')), "-", tail));
    }
    job.set_name(spec.name());
    job.set_submission_id(sid);
    job.set_state(v1::PENDING);
    *job.mutable_spec() = spec;
    job.set_job_dir(d_->JobDir(job.id()));
    job.set_submit_unix_ms(NowMs());
    job.set_user(ctx->peer());
    const std::string type = spec.resources().device_type();
    job.set_device_type(type);
    const int world = spec.parallelism().world_size();
    job.set_world_size(world);
    // Refuse what no set of the registered nodes could ever hold: it would wait forever.
    {
      ASSIGN_OR_RETURN(auto nodes, d_->ReadNodes());
      RETURN_IF_ERROR(CheckEverPlaceable(RequestOf(job), type, Snapshot(nodes, {})));
      // And a model and batch that cannot fit a node's memory (an estimate, memory_estimate.h).
      if (!spec::IsScriptJob(spec)) RETURN_IF_ERROR(CheckMemoryFits(spec, world, type, nodes));
    }

    // Idempotency: the first submission with this id wins; later ones get its job back.
    ASSIGN_OR_RETURN(store::CompareSetResult cas,
                     d_->store->CompareSet(keys::Submission(sid), std::nullopt, job.id()));
    if (!cas.swapped) {
      for (int i = 0; i < 100; ++i) {  // the winner may still be writing its record
        auto existing = GetJob(cas.current);
        if (existing.ok()) {
          *resp->mutable_job() = *existing;
          resp->set_already_existed(true);
          return absl::OkStatus();
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
      return absl::UnavailableError("submission " + sid + " is being created; retry");
    }
    for (const auto& [name, data] : req.files()) {
      RETURN_IF_ERROR(d_->store->Set(keys::File(job.id(), name), data));
    }
    RETURN_IF_ERROR(d_->store->Set(keys::SpecYaml(job.id()), spec::ResolvedYaml(spec)));
    RETURN_IF_ERROR(d_->store->Set(keys::Record(job.id()), job.SerializeAsString()));
    RETURN_IF_ERROR(d_->store->Set(keys::JobList(job.id()), ""));
    RETURN_IF_ERROR(d_->store->Set(keys::Active(job.id()), ""));
    spdlog::info("job {} submitted by {}: {} ranks of {}", job.id(), ctx->peer(), world, type);
    *resp->mutable_job() = job;
    return absl::OkStatus();
  }

  Daemon::Impl* d_;
};

class NodesService final : public v1::Nodes::Service {
 public:
  explicit NodesService(Daemon::Impl* d) : d_(d) {}

  grpc::Status List(grpc::ServerContext* ctx, const v1::ListNodesRequest*,
                    v1::ListNodesResponse* out) override {
    grpc::Status auth = base::CheckToken(ctx, d_->opts.auth_token, "Nodes.List");
    if (!auth.ok()) return auth;
    auto nodes = d_->ReadNodes();
    if (!nodes.ok()) return ToGrpcStatus(nodes.status());
    auto allocs = d_->ReadAllocs();
    if (!allocs.ok()) return ToGrpcStatus(allocs.status());
    for (auto& n : *nodes) {
      n.set_healthy(!n.draining() && NowMs() - n.heartbeat_unix_ms() <
                                         3 * absl::ToInt64Milliseconds(d_->opts.lease_ttl));
      for (auto& dv : *n.mutable_devices()) {
        auto it = allocs->find(absl::StrCat(n.name(), "/", dv.id()));
        if (it != allocs->end()) dv.set_job_id(it->second);
      }
      *out->add_nodes() = n;
    }
    return grpc::Status::OK;
  }

 private:
  Daemon::Impl* d_;
};

}  // namespace

absl::StatusOr<std::vector<Job>> ListJobs(Daemon::Impl* d, bool active_only) {
  ASSIGN_OR_RETURN(std::vector<std::string> names,
                   d->store->ListKeys(active_only ? "active/" : "joblist/"));
  std::vector<Job> jobs;
  for (const std::string& k : names) {
    auto rec = d->ReadRecord(k.substr(k.find('/') + 1));
    if (rec.ok()) jobs.push_back(rec->first);
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return a.submit_unix_ms() > b.submit_unix_ms();
  });
  return jobs;
}

absl::Status ReadSeries(Daemon::Impl* d, const Job& job, const std::string& metric,
                        int max_points, int attempt, jobs::v1::Series* out) {
  ASSIGN_OR_RETURN(std::string m, CanonicalMetric(metric));
  if (max_points < 0 || max_points > SeriesReader::kCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("max_points: ", max_points, " is not in 0..",
                                                   SeriesReader::kCapacity));
  }
  out->set_id(job.id());
  out->set_metric(m);
  for (int r = 0; r < job.world_size(); ++r) {
    ASSIGN_OR_RETURN(Downsampled ds, d->series.Read(RankMetricsPath(d, job.id(), r), m, attempt,
                                                    max_points > 0 ? max_points : 1000));
    v1::RankSeries* rs = out->add_ranks();
    rs->set_rank(r);
    rs->set_lines(ds.lines);
    rs->set_missing(ds.missing);
    for (const Bucket& b : ds.buckets) {
      rs->add_step(b.last_step);
      rs->add_last(b.last);
      rs->add_min(b.min);
      rs->add_max(b.max);
      rs->add_first_step(b.first_step);
    }
  }
  return absl::OkStatus();
}

std::string RankMetricsPath(Daemon::Impl* d, const std::string& job, int rank) {
  return ::ember::job::MetricsPath(d->JobDir(job), rank);
}

std::unique_ptr<grpc::Service> MakeJobsService(Daemon::Impl* d) {
  return std::make_unique<JobsService>(d);
}
std::unique_ptr<grpc::Service> MakeNodesService(Daemon::Impl* d) {
  return std::make_unique<NodesService>(d);
}

}  // namespace ember::daemon
