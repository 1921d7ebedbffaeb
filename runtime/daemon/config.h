// emberd's configuration: a YAML file whose keys are the flag names (underscores), overridden by
// flags, then checked and turned into DaemonOptions. Thread-compatible.
//
//   # /etc/ember/emberd.yaml
//   host_store: true
//   auth_token_file: /etc/ember/token
//   work_root: /var/lib/ember/jobs
//   worker_binary: /usr/local/bin/ember-worker
#ifndef EMBER_RUNTIME_DAEMON_CONFIG_H_
#define EMBER_RUNTIME_DAEMON_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/daemon/daemon.h"

namespace ember::daemon {

struct EmberdConfig {
  std::string node_name;
  std::string listen = "127.0.0.1:29400";
  std::string advertise;
  bool host_store = false;
  std::string store_listen = "127.0.0.1:29500";
  std::string store_data_dir;
  std::string store;
  std::string auth_token_file;
  bool insecure_no_auth = false;
  base::TlsOptions tls;
  std::string work_root = "/var/lib/ember/jobs";
  std::string state_dir;
  std::string worker_binary = "/usr/local/bin/ember-worker";
  int cpu_slots = -1;
  int cuda_devices = -1;
  std::vector<std::string> data_roots;
  int keep_finished_jobs = 100;    // retention of finished jobs in the store (0 = no count limit)
  double finished_job_ttl_h = 168; // and their age in hours (0 = no age limit)
  bool scheduler = true;
  double lease_ttl_s = 6;          // node lease; a node silent this long is lost
  double poll_s = 0.1;             // supervision / scheduling period
  double restart_backoff_s = 1;    // first restart delay (doubles per attempt, at most 30 s)
  bool drain_on_sigterm = false;   // SIGTERM: false = detach (workers keep running), true = drain
};

// INVALID_ARGUMENT naming the key for unknown keys or wrong types; NOT_FOUND naming the file.
absl::Status LoadEmberdConfig(const std::string& path, EmberdConfig* cfg);

// Reads the token file and the TLS files; INVALID_ARGUMENT when no token is configured and
// insecure_no_auth is off, or TLS is half configured; file errors name the file.
absl::StatusOr<DaemonOptions> ToDaemonOptions(const EmberdConfig& cfg);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_CONFIG_H_
