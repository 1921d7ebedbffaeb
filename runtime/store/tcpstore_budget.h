// Who may go over TcpStoreServer's listener-wide budget (TcpStoreOptions::max_buffered_bytes;
// private to tcpstore_server). Over the budget a connection growing a large query stops reading
// and a large answer is refused (its request runs again later), except for two turn holders: the
// oldest connection stopped while growing a query holds the read turn until that query is whole
// (or the connection closes; the server closes a holder that sends nothing for
// write_stall_timeout), and the oldest refused one holds the reply turn until its answer left (or
// its request stays unanswered for a second: it parked; or the connection closes). A turn holder
// needs nothing from other connections, so neither side waits for ever, and the listener holds at
// most the budget + two queries (the turn's, and the growth that crossed the budget) + one reply
// + a little per connection. Under the budget every waiter for the read turn resumes.
//
// Thread-safety: the loop thread's (Conn's loop-thread fields; reply_turn under Conn::mu).
#ifndef EMBER_RUNTIME_STORE_TCPSTORE_BUDGET_H_
#define EMBER_RUNTIME_STORE_TCPSTORE_BUDGET_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/store/tcpstore_connection.h"

namespace ember::store::tcpstore {

class Turns {
 public:
  explicit Turns(std::shared_ptr<Budget> budget) : budget_(std::move(budget)) {}

  // True if `c` may read now: under the budget, not growing a large query, or holding the read
  // turn. Otherwise it queues for the turn.
  bool MayRead(const std::shared_ptr<Conn>& c);
  // `c` has a refused request to run again (Conn::rerun): true if it may now (under the budget,
  // or it holds the reply turn); otherwise it queues for the turn.
  bool MayRerun(const std::shared_ptr<Conn>& c);
  // After each loop round: passes turns on and appends the connections to pump again (a new
  // turn holder; every waiter when under the budget).
  void Rebalance(int64_t now_ns, std::vector<std::shared_ptr<Conn>>* resume);
  // The read turn's holder if it received nothing for `limit_ns` while holding the turn over the
  // budget (it would hold everyone's large queries back); else null.
  std::shared_ptr<Conn> StalledReader(int64_t now_ns, int64_t limit_ns) const;

 private:
  const std::shared_ptr<Budget> budget_;
  // A turn covers one request: the holder's request_seq when granted (read: the query it grows
  // is the next request) or the rerun's.
  std::shared_ptr<Conn> read_holder_, reply_holder_;
  uint64_t read_seq_ = 0, reply_seq_ = 0;
  int64_t read_since_ns_ = 0;
  bool reply_used_ = false;  // the holder ran its request again
  std::deque<std::shared_ptr<Conn>> read_queue_, reply_queue_;
};

}  // namespace ember::store::tcpstore

#endif  // EMBER_RUNTIME_STORE_TCPSTORE_BUDGET_H_
