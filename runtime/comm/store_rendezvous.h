// StoreRendezvous: Rendezvous over the rendezvous store (ember::store::Client). Keys are relative
// to the client's prefix view, so pass a job/attempt-scoped view:
//   auto rdzv = MakeStoreRendezvous(client.WithPrefix("jobs/j1/attempt/0/"));
// Thread-safe (the client is).
#ifndef EMBER_RUNTIME_COMM_STORE_RENDEZVOUS_H_
#define EMBER_RUNTIME_COMM_STORE_RENDEZVOUS_H_

#include <memory>

#include "runtime/comm/rendezvous.h"
#include "runtime/store/client.h"

namespace ember::comm {

std::shared_ptr<Rendezvous> MakeStoreRendezvous(store::Client client);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_STORE_RENDEZVOUS_H_
