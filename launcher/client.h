// ember::Client: the C++ client of the Ember job API (proto/jobs.proto), what emberctl uses.
//
//   ASSIGN_OR_RETURN(ember::Client c, ember::Client::Connect({.address = "127.0.0.1:29400",
//                                                            .token = token}));
//   ASSIGN_OR_RETURN(auto job, c.Submit(yaml_text, /*submission_id=*/"my-run-1"));
//   ASSIGN_OR_RETURN(auto done, c.Wait(job.id(), absl::Minutes(10)));
//
// Errors: UNAVAILABLE ("cannot reach emberd at ADDR ...") when the daemon is not answering;
// FAILED_PRECONDITION when it serves TLS and this client does not, or the reverse;
// UNAUTHENTICATED when the token is wrong or missing; the daemon's own codes otherwise
// (INVALID_ARGUMENT naming a spec field, PERMISSION_DENIED for paths, NOT_FOUND for a job).
// Copyable and thread-safe (a gRPC channel underneath).
#ifndef EMBER_LAUNCHER_CLIENT_H_
#define EMBER_LAUNCHER_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/jobs.grpc.pb.h"
#include "runtime/base/auth.h"

namespace ember {

struct ClientOptions {
  std::string address = "127.0.0.1:29400";
  std::string token;                       // "" = send none
  base::TlsOptions tls;                    // ca_file (+ cert/key for mTLS)
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration call_timeout = absl::Seconds(30);  // unary calls
};

class Client {
 public:
  // Waits up to connect_timeout for the channel; UNAVAILABLE naming the address otherwise.
  static absl::StatusOr<Client> Connect(const ClientOptions& options);

  absl::StatusOr<jobs::v1::SubmitResponse> Submit(
      const std::string& spec_yaml, const std::string& submission_id = "",
      const std::map<std::string, std::string>& files = {});
  absl::StatusOr<jobs::v1::Job> Get(const std::string& id);
  absl::StatusOr<std::vector<jobs::v1::Job>> List(bool active_only = false, int limit = 0);
  // `checkpoint`: the running attempt's ranks checkpoint an agreed step and stop; the job ends
  // CANCELLED once they have (poll Get). Without a running attempt: a plain cancel.
  absl::StatusOr<jobs::v1::Job> Cancel(const std::string& id, bool checkpoint = false);
  absl::StatusOr<jobs::v1::DumpResponse> Dump(const std::string& id);
  absl::StatusOr<std::vector<jobs::v1::Node>> Nodes();
  // `metric` of every rank, downsampled to at most max_points per rank (0 = 1000); attempt < 0 =
  // every attempt. INVALID_ARGUMENT names an unknown metric.
  absl::StatusOr<jobs::v1::Series> GetSeries(const std::string& id, const std::string& metric,
                                             int max_points = 0, int attempt = -1);

  // Streams until the job ends (follow) or the log is exhausted; `on_line` returns false to stop.
  absl::Status StreamLogs(const std::string& id, int rank, bool follow, int tail_lines,
                          const std::function<bool(const jobs::v1::LogLine&)>& on_line);
  absl::Status StreamMetrics(const std::string& id, bool follow, int interval_ms,
                             const std::function<bool(const jobs::v1::MetricsUpdate&)>& on_update);

  // Live weights (docs/onesided.md "Live weight publishing"): checks that job `id` exists, then
  // connects to the cluster's store at `store_address` with this client's token and TLS files and
  // writes <out_dir>/step-<N>/model.safetensors for each step the job publishes (its spec needs
  // publish.every_steps > 0), `steps` of them (0: until the job's ranks exit). `on_snapshot` is
  // called after each file is written. Returns the number written.
  absl::StatusOr<int64_t> SubscribeWeights(
      const std::string& id, const std::string& store_address, const std::string& out_dir,
      int64_t steps, std::function<void(int64_t step, const std::string& path)> on_snapshot = nullptr);

  // Polls Get until the job is SUCCEEDED, FAILED or CANCELLED; DEADLINE_EXCEEDED after `timeout`.
  absl::StatusOr<jobs::v1::Job> Wait(const std::string& id, absl::Duration timeout);

  const std::string& address() const { return opts_.address; }

 private:
  Client(ClientOptions o, std::shared_ptr<grpc::Channel> ch);
  void Prepare(grpc::ClientContext* ctx, bool unary) const;
  absl::Status Convert(const grpc::Status& s) const;

  ClientOptions opts_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<jobs::v1::Jobs::Stub> jobs_;
  std::shared_ptr<jobs::v1::Nodes::Stub> nodes_;
};

bool IsTerminalState(jobs::v1::JobState s);

}  // namespace ember

#endif  // EMBER_LAUNCHER_CLIENT_H_
