// store_test against the in-memory backend: the server's default, nothing to change.
#include "runtime/store/store_test_backend.h"

namespace ember::store::testing {

void UseTestBackend(StoreServerOptions*) {}

}  // namespace ember::store::testing
