// ember-store's backend flags: see backend_flags.h.
#include "runtime/store/backend_flags.h"

#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/etcd_backend.h"

ABSL_FLAG(std::string, backend, "memory",
          "where the keys live: 'memory' (this process; durable with --data-dir) or 'etcd' (an "
          "etcd v3 cluster, --etcd-endpoints)");
ABSL_FLAG(std::string, etcd_endpoints, "", "with --backend=etcd: host:port,... of etcd members");
ABSL_FLAG(std::string, etcd_prefix, "/ember/", "with --backend=etcd: etcd key prefix of the store");
ABSL_FLAG(std::string, etcd_user, "", "with --backend=etcd: etcd user (auth enabled in etcd)");
ABSL_FLAG(std::string, etcd_password_file, "",
          "with --etcd-user: file holding the user's etcd password (never logged)");
ABSL_FLAG(std::string, etcd_tls_ca, "", "PEM CA that signed etcd's certificates: talk TLS to etcd");
ABSL_FLAG(std::string, etcd_tls_cert, "", "PEM client certificate for etcd (client TLS auth)");
ABSL_FLAG(std::string, etcd_tls_key, "", "PEM key of --etcd-tls-cert");
ABSL_FLAG(absl::Duration, etcd_op_timeout, absl::Seconds(15),
          "with --backend=etcd: how long one store operation retries through etcd member or "
          "leader loss before it fails with UNAVAILABLE");

namespace ember::store {

absl::StatusOr<std::string> ConfigureBackendFromFlags(StoreServerOptions* options) {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "memory") {
    return options->backend.data_dir.empty()
               ? std::string("in-memory")
               : absl::StrCat("write-ahead log in ", options->backend.data_dir);
  }
  if (backend != "etcd") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend='", backend, "' is not valid; use 'memory' or 'etcd'"));
  }
  if (!options->backend.data_dir.empty()) {
    return absl::InvalidArgumentError(
        "--data-dir does not apply to --backend=etcd (etcd keeps the data); drop one of them");
  }
  EtcdOptions e;
  e.endpoints = SplitEtcdEndpoints(absl::GetFlag(FLAGS_etcd_endpoints));
  if (e.endpoints.empty()) {
    return absl::InvalidArgumentError("--backend=etcd needs --etcd-endpoints=host:2379,...");
  }
  e.prefix = absl::GetFlag(FLAGS_etcd_prefix);
  if (e.prefix.empty()) {
    return absl::InvalidArgumentError("--etcd-prefix must not be empty (the store would own "
                                      "every key in etcd)");
  }
  e.user = absl::GetFlag(FLAGS_etcd_user);
  if (!e.user.empty()) {
    if (absl::GetFlag(FLAGS_etcd_password_file).empty()) {
      return absl::InvalidArgumentError("--etcd-user needs --etcd-password-file");
    }
    ASSIGN_OR_RETURN(e.password, ReadEtcdPasswordFile(absl::GetFlag(FLAGS_etcd_password_file),
                                                      "--etcd-password-file"));
  }
  e.tls.ca_file = absl::GetFlag(FLAGS_etcd_tls_ca);
  e.tls.cert_file = absl::GetFlag(FLAGS_etcd_tls_cert);
  e.tls.key_file = absl::GetFlag(FLAGS_etcd_tls_key);
  e.op_timeout = absl::GetFlag(FLAGS_etcd_op_timeout);
  options->make_backend = [e](const BackendOptions& b, base::Clock*) {
    return NewEtcdBackend(e, b);
  };
  return DescribeEtcd(e);
}

}  // namespace ember::store
