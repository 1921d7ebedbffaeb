// RequestQueue: the store client's requests from the call until the answer: ids, deadlines, which
// are sent, and what a broken connection or a passed deadline does to each (client_retry.h rules).
// Requests go on the wire in the order they were queued; requests re-sent after a reconnect go
// first, in their original order.
//
// Thread-safety: thread-compatible. The Connection that owns it guards it with its mutex, and
// runs the callbacks this class hands back (in `Fired`) after releasing that mutex.
#ifndef EMBER_RUNTIME_STORE_CLIENT_QUEUE_H_
#define EMBER_RUNTIME_STORE_CLIENT_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/store.pb.h"

namespace ember::store::client_internal {

using Done = std::function<void(v1::Response)>;
// Callbacks to run (outside the owner's lock) with their responses.
using Fired = std::vector<std::pair<Done, v1::Response>>;

class RequestQueue {
 public:
  // Queues `req` as unsent, with a fresh id, due `timeout` after `now` (plus kServerSlack when it
  // blocks on the server: BlocksOnServer). `caller_reads`: its caller waits for the answer itself
  // (counted in owned()).
  void Push(v1::Request req, Done done, absl::Time now, absl::Duration timeout,
            bool caller_reads);

  // Marks every unsent request still pending as sent at `now`, calling emit(const v1::Request&)
  // for each in order; returns how many.
  template <typename Emit>
  int TakeUnsent(absl::Time now, Emit&& emit) {
    int n = 0;
    while (!unsent_.empty()) {
      const uint64_t id = unsent_.front();
      unsent_.pop_front();
      auto it = pending_.find(id);
      if (it == pending_.end()) continue;  // timed out before it was sent
      it->second.sent = true;
      it->second.sent_at = now;
      emit(it->second.req);
      ++n;
    }
    return n;
  }
  bool has_unsent() const { return !unsent_.empty(); }

  // Moves the callbacks of the requests `batch` answers into *ready (answers to unknown ids, of
  // requests that already timed out here, are dropped).
  void Answer(v1::ResponseBatch* batch, Fired* ready);

  // The connection to `address` broke with code/message. Permanent (IsPermanent): every request
  // fails with that code. Otherwise unsent and sent idempotent requests stay queued (the sent ones
  // go again first) and sent non-idempotent ones fail UNAVAILABLE "outcome unknown".
  void Broken(absl::StatusCode code, const std::string& message, const std::string& address,
              Fired* fail);

  // Fails every request whose deadline is at or before `now`: DEADLINE_EXCEEDED when `connected`
  // (the store did not answer in time), else UNAVAILABLE naming `last_error`; both name the
  // call's timeout. Returns true when the connection is silent: `connected`, an expired request
  // was sent after `last_rx` (the last time an answer came), so nothing at all came back while it
  // waited, and that is kMinSilence ago or more. The owner then drops the connection: whatever it
  // still carries comes too late.
  bool Expire(absl::Time now, bool connected, const std::string& address,
              const std::string& last_error, absl::Time last_rx, Fired* expired);

  // Fails every request with CANCELLED (the client is closing).
  void CancelAll(Fired* fail);

  // The earliest deadline, or `cap` if it is earlier or nothing is pending.
  absl::Time EarliestDeadline(absl::Time cap) const;
  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }
  // Pending requests whose caller reads the answer itself.
  int owned() const { return owned_; }

 private:
  struct Pending {
    v1::Request req;
    Done done;
    absl::Time deadline;
    absl::Duration timeout;  // the caller's, for messages
    absl::Time sent_at;      // when last sent (valid while `sent`)
    bool sent = false;
    bool caller_reads = false;  // counted in owned_
  };
  using Map = std::map<uint64_t, Pending>;
  // Removes an entry (keeping owned_ in step); returns the next one.
  Map::iterator Erase(Map::iterator it);
  void Fail(Map::iterator it, absl::StatusCode code, std::string message, Fired* out);

  Map pending_;
  std::deque<uint64_t> unsent_;
  uint64_t next_id_ = 0;
  int owned_ = 0;
};

}  // namespace ember::store::client_internal

#endif  // EMBER_RUNTIME_STORE_CLIENT_QUEUE_H_
