// Rendezvous: the small key-value surface process groups need from the store during bootstrap
// and for dump requests. StoreRendezvous (store_rendezvous.h) adapts ember::store::Client;
// FileRendezvous backs it with a directory, for tests without a store server.
//
// Implementations are thread-safe. Keys are relative ("pg/world/peer/0"); the implementation adds
// its job/attempt scope.
#ifndef EMBER_RUNTIME_COMM_RENDEZVOUS_H_
#define EMBER_RUNTIME_COMM_RENDEZVOUS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ember::comm {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists; DEADLINE_EXCEEDED naming the key after `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Non-blocking: NOT_FOUND if absent.
  virtual absl::StatusOr<std::string> TryGet(const std::string& key) = 0;
};

// Keys are files under `dir` ('/' in keys become nested directories). Writes are atomic (rename).
// Works across processes on one host. Polls every millisecond while waiting.
std::shared_ptr<Rendezvous> MakeFileRendezvous(const std::string& dir);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_RENDEZVOUS_H_
