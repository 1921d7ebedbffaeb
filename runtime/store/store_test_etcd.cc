// store_test against the etcd backend: one single-member etcd for the whole test process (killed
// at exit), each server under its own key prefix so test cases never see each other's keys.
#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/etcd_test_util.h"
#include "runtime/store/store_test_backend.h"

namespace ember::store::testing {

void UseTestBackend(StoreServerOptions* options) {
  static auto* const etcd = new EtcdTestCluster(1);
  static std::unique_ptr<EtcdTestCluster> reaper(etcd);  // SIGKILLs it when the process exits
  static std::atomic<int> servers{0};
  EtcdOptions e;
  e.endpoints = etcd->endpoints();
  e.prefix = absl::StrCat("/ember-test/", servers.fetch_add(1), "/");
  options->make_backend = [e](const BackendOptions& b, base::Clock*) {
    return NewEtcdBackend(e, b);
  };
}

}  // namespace ember::store::testing
