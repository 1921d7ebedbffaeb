#include "runtime/daemon/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "runtime/base/status_macros.h"
#include "runtime/jobspec/yaml_proto.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/etcd_client.h"

namespace ember::daemon {
namespace {

using google::protobuf::FieldDescriptor;

absl::Status RejectRemoved(const EmberdConfig& cfg, const std::string& where) {
  // Through reflection: the generated accessor is deprecated (it warns at every use).
  const FieldDescriptor* removed = cfg.GetDescriptor()->FindFieldByName("cgroup_root");
  if (cfg.GetReflection()->HasField(cfg, removed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "cgroup_root was removed: it never set CPU or memory limits (per-job cgroup "
        "limits are not implemented); delete the key"));
  }
  return absl::OkStatus();
}

std::string DefaultText(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING: return f->default_value_string();
    case FieldDescriptor::CPPTYPE_BOOL: return f->default_value_bool() ? "true" : "false";
    case FieldDescriptor::CPPTYPE_INT32: return absl::StrCat(f->default_value_int32());
    case FieldDescriptor::CPPTYPE_DOUBLE: return absl::StrCat(f->default_value_double());
    default: return "";
  }
}

// `store: etcd://...`: this daemon hosts a store server on store_listen whose backend is the etcd
// cluster; its workers and itself use that server.
absl::Status UseEtcdStore(const EmberdConfig& cfg, DaemonOptions* o) {
  store::EtcdOptions e;
  if (absl::Status s = store::ParseEtcdUrl(cfg.store(), &e); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("store: ", s.message()));
  }
  if (!cfg.store_data_dir().empty()) {
    return absl::InvalidArgumentError(
        "store_data_dir does not apply to store: etcd://... (etcd keeps the data); drop one");
  }
  e.user = cfg.etcd_user();
  if (!e.user.empty()) {
    if (cfg.etcd_password_file().empty()) {
      return absl::InvalidArgumentError("etcd_user needs etcd_password_file");
    }
    ASSIGN_OR_RETURN(e.password,
                     store::ReadEtcdPasswordFile(cfg.etcd_password_file(), "etcd_password_file"));
  } else if (!cfg.etcd_password_file().empty()) {
    return absl::InvalidArgumentError("etcd_password_file needs etcd_user");
  }
  e.tls.ca_file = cfg.etcd_tls_ca();
  e.tls.cert_file = cfg.etcd_tls_cert();
  e.tls.key_file = cfg.etcd_tls_key();
  if (cfg.etcd_op_timeout_s() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd_op_timeout_s must be > 0, not ", cfg.etcd_op_timeout_s()));
  }
  e.op_timeout = absl::Seconds(cfg.etcd_op_timeout_s());
  o->host_store = true;
  o->store_address.clear();
  o->store_backend = [e](const store::BackendOptions& b, base::Clock*) {
    return store::NewEtcdBackend(e, b);
  };
  o->store_backend_name = store::DescribeEtcd(e);
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadEmberdConfig(const std::string& path, EmberdConfig* cfg) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("config ", path, ": cannot read"));
  std::stringstream text;
  text << f.rdbuf();
  const std::string where = absl::StrCat("config ", path);
  EmberdConfig file;
  absl::Status s = spec::ParseYamlInto(text.str(), &file, where);
  if (!s.ok()) {  // field errors start with the field; say which file too
    if (absl::StartsWith(s.message(), where)) return s;
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  RETURN_IF_ERROR(RejectRemoved(file, where + ": "));
  OverrideConfig(file, cfg);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ParseConfigFlags(const std::vector<std::string>& args,
                                                          EmberdConfig* flags) {
  const auto* desc = flags->GetDescriptor();
  const auto* refl = flags->GetReflection();
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i == 0 || a.size() < 2 || a[0] != '-') {
      rest.push_back(a);
      continue;
    }
    if (a == "--") {
      rest.insert(rest.end(), args.begin() + i, args.end());
      break;
    }
    std::string body = a.substr(a[1] == '-' ? 2 : 1), value;
    const size_t eq = body.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = body.substr(eq + 1);
      body.resize(eq);
    }
    std::replace(body.begin(), body.end(), '-', '_');
    const FieldDescriptor* f = desc->FindFieldByName(body);
    bool negated = false;
    for (const char* no : {"no_", "no"}) {
      if (f != nullptr || !absl::StartsWith(body, no)) continue;
      const FieldDescriptor* b = desc->FindFieldByName(body.substr(strlen(no)));
      if (b != nullptr && b->cpp_type() == FieldDescriptor::CPPTYPE_BOOL && !b->is_repeated()) {
        f = b;
        negated = true;
      }
    }
    if (f == nullptr) {  // not a setting: --config, --log_level, --help ... are absl's
      rest.push_back(a);
      continue;
    }
    const std::string flag = absl::StrCat("--", negated ? "no_" : "", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      if (has_value) RETURN_IF_ERROR(spec::SetFieldFromText(value, f, flags, flag));
      const bool v = has_value ? refl->GetBool(*flags, f) : true;
      refl->SetBool(flags, f, negated ? !v : v);  // --no_X=true is X=false, as absl had it
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(flag + " needs a value");
      value = args[++i];
    }
    if (f->is_repeated()) {
      refl->ClearField(flags, f);
      for (absl::string_view v : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        RETURN_IF_ERROR(spec::SetFieldFromText(std::string(v), f, flags, flag));
      }
    } else {
      RETURN_IF_ERROR(spec::SetFieldFromText(value, f, flags, flag));
    }
  }
  return rest;
}

void OverrideConfig(const EmberdConfig& overrides, EmberdConfig* cfg) {
  const auto* desc = overrides.GetDescriptor();
  const auto* refl = overrides.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    if (f->is_repeated() && refl->FieldSize(overrides, f) > 0) refl->ClearField(cfg, f);
  }
  cfg->MergeFrom(overrides);
}

std::string ConfigFlagsHelp() {
  std::string out;
  const auto* desc = EmberdConfig::descriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    if (f->options().deprecated()) continue;
    std::string type = f->is_repeated() ? "A,B,..." : f->cpp_type_name();
    std::string def = f->has_default_value() ? absl::StrCat(" (default ", DefaultText(f), ")") : "";
    absl::StrAppendFormat(&out, "  --%s=%s\n      %s%s\n", f->name(), type,
                          f->options().GetExtension(v1::help), def);
  }
  return out;
}

absl::StatusOr<std::string> HttpListenOf(const std::string& http_listen,
                                         const std::string& api_listen) {
  if (http_listen != "auto") return http_listen;
  const size_t colon = api_listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(api_listen.substr(colon + 1), &port) ||
      port < 0 || port > 65534) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_listen: auto needs listen as host:port, not '", api_listen,
        "'; give http_listen explicitly"));
  }
  std::string host = api_listen.substr(0, colon);
  // The HTTP server is IPv4 only (base/http_server.h): the IPv6 wildcard and loopback map over.
  if (host == "[::]") host = "0.0.0.0";
  if (host == "[::1]") host = "127.0.0.1";
  if (absl::StartsWith(host, "[")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_listen: auto cannot serve HTTP on the IPv6 address of listen '", api_listen,
        "' (the HTTP server is IPv4 only); give http_listen explicitly"));
  }
  return absl::StrCat(host, ":", port == 0 ? 0 : port + 1);
}

absl::StatusOr<DaemonOptions> ToDaemonOptions(const EmberdConfig& cfg) {
  RETURN_IF_ERROR(RejectRemoved(cfg, ""));
  DaemonOptions o;
  o.node_name = cfg.node_name();
  o.listen = cfg.listen();
  o.advertise = cfg.advertise();
  o.host_store = cfg.host_store();
  o.store_listen = cfg.store_listen();
  o.store_data_dir = cfg.store_data_dir();
  o.store_address = cfg.store();
  o.tls.cert_file = cfg.tls_cert();
  o.tls.key_file = cfg.tls_key();
  o.tls.ca_file = cfg.tls_ca();
  o.tls.verify_clients = cfg.tls_verify_clients();
  o.work_root = cfg.work_root();
  o.state_dir = cfg.state_dir();
  o.worker_binary = cfg.worker_binary();
  o.inventory.cpu_slots = cfg.cpu_slots();
  o.inventory.cuda_devices = cfg.cuda_devices();
  o.data_roots.assign(cfg.data_root().begin(), cfg.data_root().end());
  o.script_user = cfg.script_user();
  o.allow_root_scripts = cfg.allow_root_scripts();
  if (cfg.keep_finished_jobs() < 0 || cfg.finished_job_ttl_h() < 0) {
    return absl::InvalidArgumentError("keep_finished_jobs and finished_job_ttl_h must be >= 0");
  }
  o.keep_finished_jobs = cfg.keep_finished_jobs();
  o.finished_job_ttl = absl::Seconds(cfg.finished_job_ttl_h() * 3600);
  o.scheduler = cfg.scheduler();
  o.job_page_open = cfg.job_page_open();
  o.process_cgroup = cfg.process_cgroup();
  if (o.process_cgroup != "auto" && o.process_cgroup != "off" &&
      (o.process_cgroup.empty() || o.process_cgroup[0] != '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "process_cgroup: '", o.process_cgroup,
        "' must be auto, off or an absolute path of a cgroup v2 directory"));
  }
  if (cfg.lease_ttl_s() < 0.5 || cfg.poll_s() <= 0 || cfg.poll_s() > 10 ||
      cfg.restart_backoff_s() < 0) {
    return absl::InvalidArgumentError(
        "lease_ttl_s must be >= 0.5, poll_s in (0, 10], restart_backoff_s >= 0");
  }
  o.lease_ttl = absl::Seconds(cfg.lease_ttl_s());
  o.heartbeat = std::min(absl::Seconds(1), o.lease_ttl / 4);
  o.poll = absl::Seconds(cfg.poll_s());
  o.restart_backoff = absl::Seconds(cfg.restart_backoff_s());
  ASSIGN_OR_RETURN(o.http_listen, HttpListenOf(cfg.http_listen(), cfg.listen()));
  if (cfg.metrics_auth() != "token" && cfg.metrics_auth() != "none") {
    return absl::InvalidArgumentError(absl::StrCat("metrics_auth: '", cfg.metrics_auth(),
                                                   "' is not one of token, none"));
  }
  o.metrics_require_token = cfg.metrics_auth() == "token";
  if (cfg.metrics_finished_jobs() < 0 || cfg.metrics_finished_jobs() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics_finished_jobs: ", cfg.metrics_finished_jobs(), " is not in 0..1000"));
  }
  o.metrics.finished_jobs = cfg.metrics_finished_jobs();
  if (!cfg.auth_token_file().empty()) {
    ASSIGN_OR_RETURN(o.auth_token, base::ReadTokenFile(cfg.auth_token_file()));
  } else if (!cfg.insecure_no_auth()) {
    return absl::InvalidArgumentError(
        "auth_token_file: required (authentication is on by default; --insecure-no-auth turns it "
        "off for testing)");
  }
  if (o.tls.enabled()) {  // bad TLS files are a configuration error (exit 2), named here
    RETURN_IF_ERROR(base::MakeServerCredentials(o.tls).status());
    RETURN_IF_ERROR(base::MakeChannelCredentials(o.tls).status());
  }
  if (absl::StartsWith(cfg.store(), "etcd://")) RETURN_IF_ERROR(UseEtcdStore(cfg, &o));
  if (!o.host_store && o.store_address.empty()) {
    return absl::InvalidArgumentError(
        "store: give --store=HOST:PORT, --store=etcd://HOST:PORT,... or --host-store");
  }
  return o;
}

}  // namespace ember::daemon
