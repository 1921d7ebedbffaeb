#include "launcher/standalone.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/flight/verdict.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/env.h"
#include "runtime/jobspec/enums.h"
#include "runtime/jobspec/spec.h"
#include "spdlog/spdlog.h"

namespace ember {

namespace fs = std::filesystem;

absl::StatusOr<std::string> FindWorkerBinary(const std::string& argv0, const std::string& name) {
  std::vector<std::string> tried;
  auto ok = [&](const std::string& p) {
    tried.push_back(p);
    return !p.empty() && ::access(p.c_str(), X_OK) == 0;
  };
  if (const char* env = getenv("EMBER_WORKER")) {
    if (ok(env)) return std::string(env);
  }
  std::vector<std::string> candidates;
  if (const char* rf = getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(rf, "/ember/runtime/worker/", name));
  }
  if (!argv0.empty()) {
    std::error_code ec;
    fs::path self = fs::absolute(argv0, ec);
    candidates.push_back(absl::StrCat(self.string(), ".runfiles/ember/runtime/worker/", name));
    candidates.push_back((self.parent_path().parent_path() / "runtime/worker" / name).string());
    candidates.push_back((self.parent_path() / name).string());
  }
  candidates.push_back(absl::StrCat("/usr/local/bin/", name));
  for (const auto& c : candidates) {
    if (ok(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat("no ", name, " found (tried ", absl::StrJoin(tried, ", "),
                                          "); build //runtime/worker:", name, " or pass --worker"));
}

absl::StatusOr<std::unique_ptr<StandaloneCluster>> StandaloneCluster::Start(
    StandaloneOptions options, const std::string& spec_yaml) {
  ASSIGN_OR_RETURN(spec::JobSpec spec, spec::ParseJobSpec(spec_yaml));
  return Start(std::move(options), spec);
}

absl::StatusOr<std::unique_ptr<StandaloneCluster>> StandaloneCluster::Start(
    StandaloneOptions options, const spec::JobSpec& spec) {
  daemon::DaemonOptions o;
  o.node_name = "standalone";
  o.host_store = true;
  o.work_root = options.work_root;
  bool cuda = spec.resources().device_type() == "cuda" ||
              spec::IsNccl(spec::BackendOf(spec));
  if (options.emulate_gpus < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--emulate-gpus ", options.emulate_gpus, ": want N >= 1"));
  }
  if (options.emulate_gpus > 0) {
    if (spec.resources().device_type() != "cuda" || spec::IsScriptJob(spec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resources.device_type: '", spec.resources().device_type(), "'", spec::IsScriptJob(spec) ? " (a script job)" : "",
          " with --emulate-gpus ", options.emulate_gpus, ": emulated GPUs run ember-worker's cuda jobs; set "
          "resources.device_type: cuda, or drop --emulate-gpus"));
    }
    // Every rank gets EMBER_EMULATE_GPUS=1; only ember-worker-cuda-interp accepts it.
    o.worker_env.push_back({job::kEnvEmulateGpus, "1"});
  }
  if (options.worker_binary.empty()) {
    auto found = FindWorkerBinary(options.argv0, options.emulate_gpus > 0 ? "ember-worker-cuda-interp" : "ember-worker");
    // A script job never runs ember-worker; the daemon still wants an executable to offer.
    if (!found.ok() && spec::IsScriptJob(spec)) found = std::string("/bin/false");
    ASSIGN_OR_RETURN(options.worker_binary, std::move(found));
  }
  o.allow_root_scripts = options.allow_root_scripts;
  o.script_user = options.script_user;
  o.reap_orphans = options.reap_orphans;
  // emberd as root refuses script jobs unless allow_root_scripts: it runs other users' scripts.
  // A standalone run is the invoking user's own script on their own machine, in this process:
  // no boundary is crossed when it runs as root too (issue 30).
  const bool implied_root = ::geteuid() == 0 && spec::IsScriptJob(spec) && !o.allow_root_scripts;
  if (implied_root) {
    o.allow_root_scripts = true;
    spdlog::info("standalone as root: allow_root_scripts implied (the invoking user's own script)");
  }
  o.worker_binary = options.worker_binary;
  o.analyze_flight = FlightVerdict;
  int ranks = options.ranks > 0 ? options.ranks : std::max(1, spec.parallelism().world_size());
  if (!cuda) {
    const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    const long limit = options.max_ranks > 0 ? options.max_ranks : kRanksPerCore * cores;
    if (ranks > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parallelism.world_size: ", ranks, " CPU ranks is more than a standalone run starts on "
          "this machine (at most ", limit,
          options.max_ranks > 0 ? " from --max-ranks"
                                : absl::StrCat(" = ", kRanksPerCore, " x ", cores, " cores"),
          "); lower world_size or --nproc, pass --max-ranks N to allow more, or submit to a "
          "cluster"));
    }
  }
  o.inventory.cpu_slots = cuda ? 0 : ranks;
  // Emulated: N counted devices, never detected (a CPU-only machine has none).
  o.inventory.cuda_devices = options.emulate_gpus > 0 ? options.emulate_gpus : cuda ? -1 : 0;
  o.workers_die_with_daemon = true;  // a killed launcher leaves no worker behind
  o.http_listen = options.http_listen;
  o.job_page_open = true;  // nobody outside this process knows the one-time token
  o.state_dir = absl::StrCat(options.work_root, "/.emberd/standalone-", getpid());
  auto cluster = std::unique_ptr<StandaloneCluster>(new StandaloneCluster());
  cluster->root_script_ = implied_root && o.script_user.empty();
  cluster->token_ = base::GenerateToken();
  o.auth_token = cluster->token_;
  ASSIGN_OR_RETURN(cluster->daemon_, daemon::Daemon::Start(o));
  return cluster;
}

StandaloneCluster::~StandaloneCluster() {
  if (daemon_) daemon_->Drain();
}

absl::StatusOr<Client> StandaloneCluster::Connect() const {
  ClientOptions o;
  o.address = daemon_->address();
  o.token = token_;
  return Client::Connect(o);
}

}  // namespace ember
