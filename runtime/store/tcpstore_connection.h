// Pieces of TcpStoreServer's event loop (tcpstore_server.cc; private to that library): a client
// connection's state, the queue that hands answered connections back to the loop thread, and the
// translations between a parsed TCPStore query and the store's request and response.
//
// Thread-safety: a Conn's unguarded fields belong to the loop thread; the ones under its mu are
// shared with completion callbacks (any thread). ReadyQueue::Push is thread-safe; the rest of it
// is the loop thread's.
#ifndef EMBER_RUNTIME_STORE_TCPSTORE_CONNECTION_H_
#define EMBER_RUNTIME_STORE_TCPSTORE_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/store.pb.h"
#include "runtime/store/tcpstore_protocol.h"

namespace ember::store::tcpstore {

int64_t MonoNs();  // CLOCK_MONOTONIC

// What a completion callback needs to format the reply.
struct ReplyPlan {
  Op op = Op::kUnknown;
  std::string expected;  // COMPARE_SET's expectation
};

// A query whose parser holds less than this reads on over the budget (its read-ahead is as large).
constexpr uint64_t kSmallQueryBytes = 64 << 10;
// A reply of at most this many bytes is written over the budget.
constexpr size_t kSmallReplyBytes = 64 << 10;

// The listener-wide count of buffered bytes (TcpStoreOptions::max_buffered_bytes): partial
// queries, queries kept to run again, unsent replies. Shared with completion callbacks, which may
// outlive the server. limit 0 = no budget.
class Budget {
 public:
  explicit Budget(int64_t limit) : limit_(limit) {}
  int64_t held() const { return held_.load(std::memory_order_relaxed); }
  bool Over() const { return limit_ > 0 && held() > limit_; }
  // Whether n more bytes stay within the limit (nothing added).
  bool Fits(int64_t n) const { return limit_ <= 0 || held() + n <= limit_; }
  void Add(int64_t delta) { held_.fetch_add(delta, std::memory_order_relaxed); }
  // Adds n if the total stays within the limit; false (nothing added) otherwise.
  bool TryReserve(int64_t n) {
    int64_t h = held();
    do {
      if (limit_ > 0 && h + n > limit_) return false;
    } while (!held_.compare_exchange_weak(h, h + n, std::memory_order_relaxed));
    return true;
  }

 private:
  const int64_t limit_;
  std::atomic<int64_t> held_{0};
};

struct Conn {
  Conn(int fd_in, uint64_t owner_in, size_t max_unsent_in, size_t max_query_in,
       std::shared_ptr<Budget> budget_in)
      : owner(owner_in), max_unsent(max_unsent_in), budget(std::move(budget_in)),
        parser(max_query_in), fd(fd_in) {}

  const uint64_t owner;       // backend owner, and the epoll tag
  const size_t max_unsent;    // TcpStoreOptions::max_unsent_bytes
  const std::shared_ptr<Budget> budget;
  bool open = true;
  bool eof = false;           // the peer closed its side
  std::string in;             // received; in[in_pos..] not parsed yet
  size_t in_pos = 0;
  QueryParser parser;
  Dialect dialect = Dialect::kUnknown;
  bool awaiting = false;      // a backend request is outstanding
  Op awaiting_op = Op::kUnknown;
  uint64_t request_seq = 0;   // backend requests made so far
  uint32_t events = 0;        // epoll interest registered
  int64_t last_cancel_ns = 0;
  bool backlogged = false;    // ran its turn's queries with input left: resumes next round
  // The budget (tcpstore_budget.h). A GET, MULTI_GET or COMPARE_SET request is kept until its
  // answer is written: a large answer refused over the budget runs again later (a read, or a
  // compare that swapped nothing: running it later is the same as receiving it later).
  std::unique_ptr<v1::Request> kept;
  ReplyPlan kept_plan;
  int64_t kept_bytes = 0;
  // A WAIT's request (its keys) while it is outstanding: the backend holds a copy for as long as
  // it is parked, charged to the budget until it is answered or the connection closes.
  int64_t parked_bytes = 0;
  int64_t counted = 0;        // parser.held_bytes() + kept_bytes + parked_bytes, in the budget
  bool rerun = false;         // its answer was refused: runs `kept` again when the budget allows
  int64_t last_input_ns = 0;  // when bytes last arrived
  // Idle deadline (TcpStoreOptions::idle_timeout): since when the listener waits for this client
  // to complete a query (accepted and no query yet, or part of a query received); 0 = none (the
  // client completed its queries and owes nothing).
  int64_t idle_from_ns = 0;
  bool completed_query = false;  // ran at least one query (a client, not a silent socket)
  int64_t run_ns = 0;         // when its request was last submitted
  bool read_queued = false, reply_queued = false;  // waiting in Turns' queues

  // Growing a query past kSmallQueryBytes: such a connection reads over the budget only with the
  // read turn.
  bool Growing() const { return !parser.AtBoundary() && parser.held_bytes() >= kSmallQueryBytes; }
  // Adds the change of parser.held_bytes() + kept_bytes to the budget (loop thread).
  void SyncHeld() {
    const int64_t now = static_cast<int64_t>(parser.held_bytes()) + kept_bytes + parked_bytes;
    budget->Add(now - counted);
    counted = now;
  }

  absl::Mutex mu;
  int fd ABSL_GUARDED_BY(mu);  // -1 once closed (written by the loop thread only)
  std::string out ABSL_GUARDED_BY(mu);  // unsent reply bytes: out[out_off..]
  size_t out_off ABSL_GUARDED_BY(mu) = 0;
  int64_t out_progress_ns ABSL_GUARDED_BY(mu) = 0;  // when unsent bytes last moved
  std::string broken ABSL_GUARDED_BY(mu);  // why the connection must close (write failed, bound)
  bool done ABSL_GUARDED_BY(mu) = false;   // the outstanding request was answered
  int done_code ABSL_GUARDED_BY(mu) = 0;
  std::string done_message ABSL_GUARDED_BY(mu);
  bool cancel_requested ABSL_GUARDED_BY(mu) = false;  // a 2.x CANCEL_WAIT came for the WAIT
  bool refused ABSL_GUARDED_BY(mu) = false;     // the answer was large and over the budget
  bool reply_turn ABSL_GUARDED_BY(mu) = false;  // may write a large answer over the budget
  int64_t counted_out ABSL_GUARDED_BY(mu) = 0;  // out's heap memory as added to the budget

  bool OutPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return out_off < out.size(); }
  // Sends now what the socket takes and queues the rest (a connection with queued bytes runs no
  // further query, so this holds about one reply). Over max_unsent, or a failed send: `broken`
  // says why, and the loop closes the connection.
  void WriteLocked(const char* p, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Sends queued bytes (the socket became writable).
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A completion callback's part (any thread): records the answer and writes its reply, unless
  // it is over kSmallReplyBytes, MayRunAgain, does not fit the budget and is not `turn` (a rerun
  // by the reply turn's holder, which still holds it): then it is `refused`.
  void Answer(const ReplyPlan& plan, bool turn, const v1::Response& r) ABSL_LOCKS_EXCLUDED(mu);
  // Adds the change of out's heap memory to the budget (WriteLocked and FlushLocked do).
  void SyncOutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t cap = out.capacity();
    const int64_t now = cap > std::string().capacity() ? static_cast<int64_t>(cap) : 0;  // heap
    budget->Add(now - counted_out);
    counted_out = now;
  }
};

// The store request for a query the backend answers (q's strings are moved out), store keys being
// key_prefix + the TCPStore key without its leading '/'. False for VALIDATE, PING and
// CANCEL_WAIT, which the server answers itself.
bool BuildRequest(Query& q, const std::string& key_prefix, v1::Request* req, ReplyPlan* plan);
// TCPStore's reply bytes for a successful response (empty for SET, APPEND, MULTI_SET).
std::string FormatReply(const ReplyPlan& plan, const v1::Response& r);
// The request may run again if its answer is refused: GET and MULTI_GET (reads); COMPARE_SET
// (when `r` swapped nothing). Without `r`: whether the op can be (keep its request).
bool MayRunAgain(Op op, const v1::Response* r);
// TCPStore's "/k" for a user key "k" is the store key key_prefix + "k".
std::string StoreKey(const std::string& key_prefix, const std::string& k);

// Warnings of the listener, at most one per `interval_ns` per kind (a flood of malformed
// connections must not flood the log): the rest are counted, and the next warning of the kind (or
// Flush, once the interval passed) says how many were suppressed. Loop thread only.
class WarnLimiter {
 public:
  explicit WarnLimiter(int64_t interval_ns = 1'000'000'000) : interval_ns_(interval_ns) {}
  // Logs "store: TCPStore <message>" at warning level unless `kind` was logged within the
  // interval; returns whether it logged.
  bool Warn(const std::string& kind, const std::string& message);
  // Logs the suppressed counts of kinds whose interval passed.
  void Flush(int64_t now_ns);
  // Warnings suppressed so far, over all kinds (tests).
  int64_t suppressed_total() const { return suppressed_total_; }

 private:
  struct Slot {
    int64_t last_ns = 0;
    bool logged = false;
    int64_t suppressed = 0;
  };
  const int64_t interval_ns_;
  std::map<std::string, Slot> slots_;
  int64_t suppressed_total_ = 0;
};

// Connections whose request was answered, for the loop thread to resume. Shared with completion
// callbacks, which may run after the server is gone (Stop() makes Push a no-op then).
class ReadyQueue {
 public:
  ReadyQueue();
  ~ReadyQueue();
  void Push(std::shared_ptr<Conn> c);
  std::vector<std::shared_ptr<Conn>> Take();  // loop thread: everything pushed so far
  void Stop();
  void MarkLoopThread() { on_loop_thread_ = this; }

  const int wake_fd;  // readable when foreign threads pushed
  const Conn* running = nullptr;  // loop thread only: the connection whose query runs now

 private:
  static thread_local const ReadyQueue* on_loop_thread_;
  std::vector<std::shared_ptr<Conn>> local_;  // loop thread only
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Conn>> foreign_ ABSL_GUARDED_BY(mu_);
  bool signalled_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ember::store::tcpstore

#endif  // EMBER_RUNTIME_STORE_TCPSTORE_CONNECTION_H_
