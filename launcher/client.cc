#include "launcher/client.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/wire_probe.h"
#include "runtime/worker/subscriber.h"

namespace ember {

namespace v1 = jobs::v1;

bool IsTerminalState(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

Client::Client(ClientOptions o, std::shared_ptr<grpc::Channel> ch)
    : opts_(std::move(o)),
      channel_(std::move(ch)),
      jobs_(v1::Jobs::NewStub(channel_)),
      nodes_(v1::Nodes::NewStub(channel_)) {}

absl::StatusOr<Client> Client::Connect(const ClientOptions& options) {
  ASSIGN_OR_RETURN(auto creds, base::MakeChannelCredentials(options.tls));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(options.address, creds, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    // A TLS/plaintext mismatch or a refused handshake never connects: say so rather than only
    // "is it running?".
    base::TlsDiagnosis d =
        base::DiagnoseTls(base::ProbeWireProtocol(options.address), options.tls.enabled());
    if (d.mismatch) {
      return absl::FailedPreconditionError(
          absl::StrCat("emberd at ", options.address, ": ", d.text));
    }
    if (!d.text.empty()) {
      return absl::UnavailableError(absl::StrCat("cannot connect to emberd at ", options.address,
                                                 ": ", d.text));
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot reach emberd at ", options.address, " within ",
        absl::FormatDuration(options.connect_timeout),
        " (is it running? check --address / $EMBER_ADDRESS)"));
  }
  return Client(options, std::move(channel));
}

void Client::Prepare(grpc::ClientContext* ctx, bool unary) const {
  if (!opts_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + opts_.token);
  if (unary) ctx->set_deadline(absl::ToChronoTime(absl::Now() + opts_.call_timeout));
}

absl::Status Client::Convert(const grpc::Status& s) const {
  absl::Status st = base::FromGrpcStatus(s);
  if (absl::IsUnauthenticated(st)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "emberd at ", opts_.address, " rejected the token (", st.message(),
        "); pass the cluster token with --token-file or $EMBER_TOKEN_FILE"));
  }
  if (absl::IsUnavailable(st)) {
    return absl::UnavailableError(
        absl::StrCat("emberd at ", opts_.address, " is unavailable: ", st.message()));
  }
  return st;
}

absl::StatusOr<v1::SubmitResponse> Client::Submit(const std::string& spec_yaml,
                                                  const std::string& submission_id,
                                                  const std::map<std::string, std::string>& files) {
  v1::SubmitRequest req;
  req.set_spec_yaml(spec_yaml);
  req.set_submission_id(submission_id);
  for (const auto& [k, v] : files) (*req.mutable_files())[k] = v;
  v1::SubmitResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(jobs_->Submit(&ctx, req, &resp)));
  return resp;
}

absl::StatusOr<v1::Job> Client::Get(const std::string& id) {
  v1::GetJobRequest req;
  req.set_id(id);
  v1::Job job;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(jobs_->Get(&ctx, req, &job)));
  return job;
}

absl::StatusOr<std::vector<v1::Job>> Client::List(bool active_only, int limit) {
  v1::ListJobsRequest req;
  req.set_active_only(active_only);
  req.set_limit(limit);
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(jobs_->List(&ctx, req, &resp)));
  return std::vector<v1::Job>(resp.jobs().begin(), resp.jobs().end());
}

absl::StatusOr<v1::Job> Client::Cancel(const std::string& id, bool checkpoint) {
  v1::CancelJobRequest req;
  req.set_id(id);
  req.set_checkpoint(checkpoint);
  v1::Job job;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(jobs_->Cancel(&ctx, req, &job)));
  return job;
}

absl::StatusOr<v1::DumpResponse> Client::Dump(const std::string& id) {
  v1::DumpRequest req;
  req.set_id(id);
  v1::DumpResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(jobs_->DumpFlightRecorder(&ctx, req, &resp)));
  return resp;
}

absl::StatusOr<v1::Series> Client::GetSeries(const std::string& id, const std::string& metric,
                                             int max_points, int attempt) {
  v1::GetSeriesRequest req;
  req.set_id(id);
  req.set_metric(metric);
  req.set_max_points(max_points);
  if (attempt >= 0) req.set_attempt(attempt);
  v1::Series resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(jobs_->GetSeries(&ctx, req, &resp)));
  return resp;
}

absl::StatusOr<std::vector<v1::Node>> Client::Nodes() {
  v1::ListNodesRequest req;
  v1::ListNodesResponse resp;
  grpc::ClientContext ctx;
  Prepare(&ctx, true);
  RETURN_IF_ERROR(Convert(nodes_->List(&ctx, req, &resp)));
  return std::vector<v1::Node>(resp.nodes().begin(), resp.nodes().end());
}

absl::Status Client::StreamLogs(const std::string& id, int rank, bool follow, int tail_lines,
                                const std::function<bool(const v1::LogLine&)>& on_line) {
  v1::StreamLogsRequest req;
  req.set_id(id);
  req.set_rank(rank);
  req.set_follow(follow);
  req.set_tail_lines(tail_lines);
  req.set_attempt(-1);
  grpc::ClientContext ctx;
  Prepare(&ctx, false);
  auto reader = jobs_->StreamLogs(&ctx, req);
  v1::LogLine line;
  while (reader->Read(&line)) {
    if (!on_line(line)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return Convert(s);
}

absl::Status Client::StreamMetrics(const std::string& id, bool follow, int interval_ms,
                                   const std::function<bool(const v1::MetricsUpdate&)>& on_update) {
  v1::StreamMetricsRequest req;
  req.set_id(id);
  req.set_follow(follow);
  req.set_interval_ms(interval_ms);
  grpc::ClientContext ctx;
  Prepare(&ctx, false);
  auto reader = jobs_->StreamMetrics(&ctx, req);
  v1::MetricsUpdate u;
  while (reader->Read(&u)) {
    if (!on_update(u)) {
      ctx.TryCancel();
      break;
    }
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return Convert(s);
}

absl::StatusOr<v1::Job> Client::Wait(const std::string& id, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    ASSIGN_OR_RETURN(v1::Job job, Get(id));
    if (IsTerminalState(job.state())) return job;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job ", id, " still ",
                                                      v1::JobState_Name(job.state()), " after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<int64_t> Client::SubscribeWeights(
    const std::string& id, const std::string& store_address, const std::string& out_dir,
    int64_t steps, std::function<void(int64_t, const std::string&)> on_snapshot) {
  RETURN_IF_ERROR(Get(id).status());  // NOT_FOUND names the job
  worker::SubscribeOptions o;
  o.store_address = store_address;
  o.token = opts_.token;
  o.tls = opts_.tls;
  o.job = id;
  o.out_dir = out_dir;
  o.steps = steps;
  o.on_snapshot = std::move(on_snapshot);
  return worker::SubscribeWeights(o);
}

}  // namespace ember
