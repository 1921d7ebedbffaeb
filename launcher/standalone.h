// A one-machine Ember cluster inside the calling process: a store and a daemon on loopback with a
// one-time token, for `emberctl run --standalone` and benchmarks.
//
//   ASSIGN_OR_RETURN(auto cluster, StandaloneCluster::Start({.work_root = "/tmp/jobs"}, yaml));
//   ASSIGN_OR_RETURN(ember::Client c, cluster->Connect());
//   ... c.Submit(yaml) ...                 // destroying `cluster` stops every worker
//
// Thread-safe after Start.
#ifndef EMBER_LAUNCHER_STANDALONE_H_
#define EMBER_LAUNCHER_STANDALONE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/client.h"
#include "runtime/daemon/daemon.h"
#include "runtime/jobspec/spec.h"

namespace ember {

struct StandaloneOptions {
  std::string work_root;      // job directories
  std::string worker_binary;  // "" = FindWorkerBinary(argv0)
  std::string argv0;          // to find the worker next to the calling binary
  int ranks = 0;              // CPU slots to offer; 0 = the spec's world size (at least 1)
  // Refuse more CPU ranks than this before any worker is forked; 0 = kRanksPerCore x the online
  // cores (one machine cannot usefully run more, and each rank is a process with its own memory).
  int max_ranks = 0;
  // The job page (runtime/daemon/job_page.h) on this HOST:PORT ("" = none; port 0 = any). The
  // cluster's token is never shown, so the page is readable without a login: keep it on loopback.
  std::string http_listen;
  // Script jobs when emberctl runs as root (daemon::DaemonOptions::allow_root_scripts): implied
  // for a standalone run, which is the invoking user's own script (root_script() below).
  bool allow_root_scripts = false;
  std::string script_user;  // DaemonOptions::script_user
  // DaemonOptions::reap_orphans: this process becomes the ranks' subreaper (for emberctl, which
  // forks nothing else; not for a caller with children of its own).
  bool reap_orphans = false;
  // N > 0: a cuda job on N emulated GPUs (`emberctl run --standalone --emulate-gpus N`, CPU CI):
  // the node offers N cuda devices (counted, not detected), every worker gets
  // EMBER_EMULATE_GPUS=1, and the worker is ember-worker-cuda-interp (a test build whose GPU step
  // runs on the CUDA interpreter, docs/gpu-testing.md; found as ember-worker is, unless
  // worker_binary names one). INVALID_ARGUMENT for a spec that is not a cuda job.
  int emulate_gpus = 0;
};

inline constexpr int kRanksPerCore = 4;

// The worker binary `name` (ember-worker, or ember-worker-cuda-interp for emulated GPUs) to run:
// $EMBER_WORKER, then Bazel runfiles / bazel-bin next to argv0, then /usr/local/bin. NOT_FOUND
// listing where it looked.
absl::StatusOr<std::string> FindWorkerBinary(const std::string& argv0,
                                             const std::string& name = "ember-worker");

class StandaloneCluster {
 public:
  // The spec (parsed, or `spec_yaml` parsed here) sizes the node (world size, cpu or cuda); it is
  // not submitted here.
  // INVALID_ARGUMENT naming parallelism.world_size when it asks for more CPU ranks than
  // max_ranks. Every worker gets SIGKILL when the cluster's process dies, whatever kills it.
  static absl::StatusOr<std::unique_ptr<StandaloneCluster>> Start(StandaloneOptions options,
                                                                   const std::string& spec_yaml);
  static absl::StatusOr<std::unique_ptr<StandaloneCluster>> Start(StandaloneOptions options,
                                                                   const spec::JobSpec& spec);
  ~StandaloneCluster();

  absl::StatusOr<Client> Connect() const;
  daemon::Daemon* daemon() { return daemon_.get(); }
  const std::string& token() const { return token_; }
  std::string http_address() const { return daemon_->http_address(); }  // "" without http_listen
  // A script job's ranks run as root because emberctl does (no --script-user): a standalone run
  // is the invoking user's own script on their machine, so emberd's refusal of root scripts does
  // not apply to it (issue 30). The caller says so once.
  bool root_script() const { return root_script_; }

 private:
  StandaloneCluster() = default;
  std::string token_;
  bool root_script_ = false;
  std::unique_ptr<daemon::Daemon> daemon_;
};

}  // namespace ember

#endif  // EMBER_LAUNCHER_STANDALONE_H_
