// EtcdClient: the connection of the store's etcd backend to an etcd v3 cluster over gRPC: one
// channel per endpoint, optional user/password auth (the token is refreshed when etcd rejects it)
// and client TLS, and the retry rule of every call.
//
// Retry rule: a call is retried (next endpoint, backoff 20 ms doubling to 500 ms) until its deadline
// while etcd is unreachable or has no leader. An idempotent call is also retried after errors that
// leave its outcome unknown (connection reset mid-call, etcd's "request timed out", "leader
// changed"); a non-idempotent one (a transaction whose second application would differ) is not:
// it fails with UNAVAILABLE saying the outcome is unknown. The final error names the endpoints,
// the operation, the time spent and etcd's last message.
//
// Thread-safety: thread-safe. Credentials are never logged.
#ifndef EMBER_RUNTIME_STORE_ETCD_CLIENT_H_
#define EMBER_RUNTIME_STORE_ETCD_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/etcd/rpc.grpc.pb.h"
#include "runtime/base/auth.h"

namespace ember::store {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // host:port of the cluster's client URLs
  std::string prefix = "/ember/";      // Ember's key space: etcd key = prefix + store key
  std::string user, password;          // etcd auth (both empty = none)
  base::TlsOptions tls;                 // client TLS (cert/key: client certificate); off = plaintext
  absl::Duration op_timeout = absl::Seconds(15);  // per store operation, retries included
};

// Shared by ember-store's --etcd-* flags and emberd's `store: etcd://...` (docs/store-etcd.md).
// "a:2379, http://b:2379" -> {"a:2379", "b:2379"}: blanks and http:// / https:// dropped.
std::vector<std::string> SplitEtcdEndpoints(absl::string_view list);
// "etcd://host:port,host:port[/prefix]" -> options->endpoints and options->prefix (the path with a
// trailing '/' added; no path or "/" = "/ember/"). INVALID_ARGUMENT quoting the URL when it is not
// of that form or names no endpoint.
absl::Status ParseEtcdUrl(absl::string_view url, EtcdOptions* options);
// The etcd password in `file` (trailing whitespace dropped). INVALID_ARGUMENT starting with `what`
// (the setting's name) when it is unreadable or empty. The password itself is never in an error.
absl::StatusOr<std::string> ReadEtcdPasswordFile(const std::string& file, absl::string_view what);
// "etcd [a:2379,b:2379] prefix /ember/, user u, tls" for start-up logs: never the password.
std::string DescribeEtcd(const EtcdOptions& options);

class EtcdClient {
 public:
  struct Stubs {
    etcdserverpb::KV::Stub* kv;
    etcdserverpb::Lease::Stub* lease;
    etcdserverpb::Watch::Stub* watch;
  };
  // A call on one endpoint: fills its response from `stubs` within `ctx` (deadline and token set).
  using Attempt = std::function<grpc::Status(const Stubs& stubs, grpc::ClientContext* ctx)>;

  // Connects lazily; fails only on bad options (no endpoint, unreadable TLS files).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);

  // Runs `attempt` under the retry rule until `deadline`. `what` names the operation in errors.
  absl::Status Call(const std::string& what, bool idempotent, absl::Time deadline,
                    const Attempt& attempt);

  // For long-lived streams (watch, keep-alive): the stubs of the endpoint to use now and a context
  // with the token set; Rotate() moves to the next endpoint after a stream failed.
  Stubs Current();
  void PrepareContext(grpc::ClientContext* ctx);
  // For one asynchronous attempt (gRPC's callback API): sets `ctx`'s deadline (at most one
  // attempt's) and token without blocking; false when a token is needed and not at hand.
  bool PrepareAsync(grpc::ClientContext* ctx, absl::Time deadline);
  void Rotate();
  // Forgets the auth token after etcd rejected it (UNAUTHENTICATED): the next call gets a new one.
  void InvalidateToken();
  const std::string& endpoint_list() const { return endpoint_list_; }
  // Shared waiting helper: backoff after `failures` failed attempts.
  static absl::Duration Backoff(int failures);

 private:
  struct Endpoint {
    std::string address;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  explicit EtcdClient(const EtcdOptions& options) : options_(options) {}
  absl::Status Authenticate(size_t index, absl::Time deadline);

  const EtcdOptions options_;
  std::string endpoint_list_;
  std::vector<Endpoint> endpoints_;  // constant after Create
  std::atomic<size_t> current_{0};
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// The etcd range end that selects every key starting with `prefix` ("\0" = all keys).
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_ETCD_CLIENT_H_
