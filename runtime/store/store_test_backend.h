// The backend the core store suite (store_test.cc) runs against, chosen at link time:
// store_test links store_test_memory.cc (in-memory), store_etcd_test links store_test_etcd.cc
// (a single-member etcd started once per test process; a fresh key prefix per server).
#ifndef EMBER_RUNTIME_STORE_STORE_TEST_BACKEND_H_
#define EMBER_RUNTIME_STORE_STORE_TEST_BACKEND_H_

#include "runtime/store/server.h"

namespace ember::store::testing {

void UseTestBackend(StoreServerOptions* options);

}  // namespace ember::store::testing

#endif  // EMBER_RUNTIME_STORE_STORE_TEST_BACKEND_H_
