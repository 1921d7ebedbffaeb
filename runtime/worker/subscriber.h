// Live weight publishing, the subscriber's side (issue 16; protocol in weights_protocol.h, overview
// in docs/onesided.md): finds the job's newest attempt that publishes, allocates one buffer for the
// whole model, announces itself under the attempt's WeightsSubscriber key, connects to every rank
// and writes each step it receives from every rank as <out_dir>/step-<N>/model.safetensors
// (F32, the model's parameter names; written to a .tmp name, then renamed; not fsynced: the
// job's checkpoints are the durable copy).
//
//   store::Client root = ...;   // the job's store (address + the cluster token)
//   ASSIGN_OR_RETURN(int64_t n, SubscribeWeights({.store = &root, .job = "j", .out_dir = "/tmp/w"}));
//
// Ends after `steps` snapshots (0: when every rank of the attempt has exited), or with an error:
// DEADLINE_EXCEEDED when no attempt publishes within manifest_timeout (publish.every_steps unset?),
// UNAVAILABLE when a rank's connection fails while the job still runs (over TCP; on one host
// the agents map memory and run without peer-failure handling, so a dead rank is seen only when
// the attempt's ranks have exited). Thread-compatible.
#ifndef EMBER_RUNTIME_WORKER_SUBSCRIBER_H_
#define EMBER_RUNTIME_WORKER_SUBSCRIBER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/base/auth.h"
#include "runtime/store/client.h"

namespace ember::worker {

struct SubscribeOptions {
  store::Client* store = nullptr;  // borrowed, unprefixed; nullptr: connect to store_address
  std::string store_address;       // with the cluster token and TLS files, as emberd does
  std::string token;
  base::TlsOptions tls;
  std::string job;
  std::string out_dir;
  int64_t steps = 0;               // snapshots to write; 0 = until the attempt's ranks exit
  std::string name;                // unique per subscriber; "" = "sub-<pid>-<time>"
  absl::Duration manifest_timeout = absl::Minutes(2);
  std::function<void(int64_t step, const std::string& path)> on_snapshot;  // optional
};

// The number of snapshots written.
absl::StatusOr<int64_t> SubscribeWeights(const SubscribeOptions& options);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_SUBSCRIBER_H_
