// ember-store's backend flags: --backend=memory|etcd and the --etcd-* settings (docs/store-etcd.md).
// The etcd password is read from --etcd-password-file and never logged.
#ifndef EMBER_RUNTIME_STORE_BACKEND_FLAGS_H_
#define EMBER_RUNTIME_STORE_BACKEND_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "runtime/store/server.h"

namespace ember::store {

// Sets options->make_backend from the flags. Returns a description for the start-up log line
// ("in-memory", "write-ahead log in DIR", "etcd [a:2379,...] prefix /ember/ (user u, tls)"), or
// INVALID_ARGUMENT naming the bad flag.
absl::StatusOr<std::string> ConfigureBackendFromFlags(StoreServerOptions* options);

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_BACKEND_FLAGS_H_
