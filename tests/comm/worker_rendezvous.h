// The rendezvous a tests/comm worker process bootstraps through: the real store at `store_address`
// (scoped to `store_prefix`) if given, else a file rendezvous in `rdzv_dir`.
#ifndef EMBER_TESTS_COMM_WORKER_RENDEZVOUS_H_
#define EMBER_TESTS_COMM_WORKER_RENDEZVOUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/comm/store_rendezvous.h"
#include "runtime/store/client.h"

namespace ember::comm::testing {

inline absl::StatusOr<std::shared_ptr<Rendezvous>> WorkerRendezvous(
    const std::string& store_address, const std::string& store_prefix, const std::string& rdzv_dir) {
  if (store_address.empty()) return MakeFileRendezvous(rdzv_dir);
  auto client = store::Client::Connect({.address = store_address,
                                        .default_timeout = absl::Seconds(60),
                                        .connect_timeout = absl::Seconds(20)});
  if (!client.ok()) return client.status();
  return MakeStoreRendezvous(client->WithPrefix(store_prefix));
}

}  // namespace ember::comm::testing

#endif  // EMBER_TESTS_COMM_WORKER_RENDEZVOUS_H_
