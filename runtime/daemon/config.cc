#include "runtime/daemon/config.h"

#include <algorithm>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace ember::daemon {

absl::Status LoadEmberdConfig(const std::string& path, EmberdConfig* cfg) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("config ", path, ": cannot read"));
  YAML::Node root;
  try {
    root = YAML::Load(f);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", e.what()));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("config " + path + ": not a mapping");
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    try {
      auto s = [&](std::string* out) { *out = v.as<std::string>(); };
      if (key == "node_name") s(&cfg->node_name);
      else if (key == "listen") s(&cfg->listen);
      else if (key == "advertise") s(&cfg->advertise);
      else if (key == "host_store") cfg->host_store = v.as<bool>();
      else if (key == "store_listen") s(&cfg->store_listen);
      else if (key == "store_data_dir") s(&cfg->store_data_dir);
      else if (key == "store") s(&cfg->store);
      else if (key == "auth_token_file") s(&cfg->auth_token_file);
      else if (key == "insecure_no_auth") cfg->insecure_no_auth = v.as<bool>();
      else if (key == "tls_cert") s(&cfg->tls.cert_file);
      else if (key == "tls_key") s(&cfg->tls.key_file);
      else if (key == "tls_ca") s(&cfg->tls.ca_file);
      else if (key == "tls_verify_clients") cfg->tls.verify_clients = v.as<bool>();
      else if (key == "work_root") s(&cfg->work_root);
      else if (key == "state_dir") s(&cfg->state_dir);
      else if (key == "worker_binary") s(&cfg->worker_binary);
      else if (key == "cpu_slots") cfg->cpu_slots = v.as<int>();
      else if (key == "cuda_devices") cfg->cuda_devices = v.as<int>();
      else if (key == "data_root") cfg->data_roots = v.as<std::vector<std::string>>();
      else if (key == "keep_finished_jobs") cfg->keep_finished_jobs = v.as<int>();
      else if (key == "finished_job_ttl_h") cfg->finished_job_ttl_h = v.as<double>();
      else if (key == "cgroup_root") {
        return absl::InvalidArgumentError(absl::StrCat(
            "config ", path, ": cgroup_root was removed: it never set CPU or memory limits "
            "(per-job cgroup limits are not implemented); delete the key"));
      }
      else if (key == "scheduler") cfg->scheduler = v.as<bool>();
      else if (key == "lease_ttl_s") cfg->lease_ttl_s = v.as<double>();
      else if (key == "poll_s") cfg->poll_s = v.as<double>();
      else if (key == "restart_backoff_s") cfg->restart_backoff_s = v.as<double>();
      else if (key == "drain_on_sigterm") cfg->drain_on_sigterm = v.as<bool>();
      else return absl::InvalidArgumentError(absl::StrCat("config ", path, ": unknown key '", key, "'"));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("config ", path, ": ", key, ": wrong type (", e.what(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonOptions> ToDaemonOptions(const EmberdConfig& cfg) {
  DaemonOptions o;
  o.node_name = cfg.node_name;
  o.listen = cfg.listen;
  o.advertise = cfg.advertise;
  o.host_store = cfg.host_store;
  o.store_listen = cfg.store_listen;
  o.store_data_dir = cfg.store_data_dir;
  o.store_address = cfg.store;
  o.tls = cfg.tls;
  o.work_root = cfg.work_root;
  o.state_dir = cfg.state_dir;
  o.worker_binary = cfg.worker_binary;
  o.inventory.cpu_slots = cfg.cpu_slots;
  o.inventory.cuda_devices = cfg.cuda_devices;
  o.data_roots = cfg.data_roots;
  if (cfg.keep_finished_jobs < 0 || cfg.finished_job_ttl_h < 0) {
    return absl::InvalidArgumentError("keep_finished_jobs and finished_job_ttl_h must be >= 0");
  }
  o.keep_finished_jobs = cfg.keep_finished_jobs;
  o.finished_job_ttl = absl::Seconds(cfg.finished_job_ttl_h * 3600);
  o.scheduler = cfg.scheduler;
  if (cfg.lease_ttl_s < 0.5 || cfg.poll_s <= 0 || cfg.poll_s > 10 || cfg.restart_backoff_s < 0) {
    return absl::InvalidArgumentError(
        "lease_ttl_s must be >= 0.5, poll_s in (0, 10], restart_backoff_s >= 0");
  }
  o.lease_ttl = absl::Seconds(cfg.lease_ttl_s);
  o.heartbeat = std::min(absl::Seconds(1), o.lease_ttl / 4);
  o.poll = absl::Seconds(cfg.poll_s);
  o.restart_backoff = absl::Seconds(cfg.restart_backoff_s);
  if (!cfg.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(o.auth_token, base::ReadTokenFile(cfg.auth_token_file));
  } else if (!cfg.insecure_no_auth) {
    return absl::InvalidArgumentError(
        "auth_token_file: required (authentication is on by default; --insecure-no-auth turns it "
        "off for testing)");
  }
  if (o.tls.enabled()) {  // bad TLS files are a configuration error (exit 2), named here
    RETURN_IF_ERROR(base::MakeServerCredentials(o.tls).status());
    RETURN_IF_ERROR(base::MakeChannelCredentials(o.tls).status());
  }
  if (!o.host_store && o.store_address.empty()) {
    return absl::InvalidArgumentError("store: give --store=HOST:PORT or --host-store");
  }
  return o;
}

}  // namespace ember::daemon
