// ember::onesided: one-sided transfers (put, get, notify) between processes on UCX, connected
// through the rendezvous store instead of a process group. The shape follows NIXL's: one Agent per
// process, registered memory with a packed descriptor a peer can use, transfer descriptor lists
// (several regions in one transfer), and small notifications delivered after the data is visible.
//
//   ASSIGN_OR_RETURN(auto agent, Agent::Create({.store = job_store, .key_prefix = "onesided/",
//                                               .name = "rank1", .rank = 1}));
//   ASSIGN_OR_RETURN(Registration reg, agent->RegisterMemory(buf, bytes));
//   RETURN_IF_ERROR(job_store.Set("weights/desc/1", reg.descriptor));   // to the peer
//   ASSIGN_OR_RETURN(Connection* c, agent->Connect("rank0"));
//   ASSIGN_OR_RETURN(RemoteRegion dst, c->ImportRegion(peer_descriptor));
//   Work w = agent->Put(c, {{reg.id, 0, n}}, {{dst, 4096, n}});
//   RETURN_IF_ERROR(w.Wait(absl::Seconds(10)));
//   RETURN_IF_ERROR(agent->Notify(c, "step 12").Wait(absl::Seconds(10)));   // after the put
//   // on rank0: ASSIGN_OR_RETURN(Notification n, agent->WaitNotification(absl::Seconds(10)));
//
// Ownership: the caller owns registered memory and keeps it alive and registered until every
// transfer that uses it has finished (Wait returned OK or an error other than DEADLINE_EXCEEDED) or
// the Agent is destroyed. The Agent owns the UCX context and worker, its Connections (valid until
// the Agent is destroyed) and the unpacked remote keys. A Work shares state with the Agent's
// in-flight request and may outlive the Agent (its Wait then returns the final status).
//
// Progress: each Agent runs one progress thread that drives ucp_worker_progress: it serves the
// peers' transfers that need the target's help (UCX emulates put/get over TCP with messages),
// receives notifications and completes this process's requests, spinning while traffic arrived in
// the last 200 us, otherwise asleep on the worker's event fd (1 ms at most while requests are in
// flight, so a slow peer costs wake-ups rather than a spinning core). A thread
// in Work::Wait or WaitNotification drives progress itself for up to 20 ms (the progress thread
// then stands aside, parked, so two threads never spin on one worker) and then sleeps on a
// condition variable, leaving progress to the thread. The progress thread also stays parked for
// 1 ms after such a wait succeeded (a request/reply loop is between two waits), unless requests are
// left in flight with nobody waiting. A thread inside Put/Get also has it stand aside (over shared
// memory UCX copies inside the call, holding the worker's lock). Callers never need to call
// anything to make progress.
//
// Thread safety: every Agent, Connection and Work method is thread-safe (the UCX worker runs in
// UCS_THREAD_MODE_MULTI). Transports: UCX chooses (shared memory, CMA, TCP, RDMA where present);
// UCX_TLS in the environment overrides, e.g. UCX_TLS=tcp or UCX_TLS=sm. UCX defaults the agent
// changes, each only while the variable is unset: UCX_KEEPALIVE_INTERVAL=1s (a dead peer over shared
// memory shows only through keepalive; UCX's 20 s outlasts most timeouts); UCX_TCP_TX_SEG_SIZE and
// UCX_TCP_RX_SEG_SIZE=kTcpSegmentBytes (neither set, UCX_TLS allowing tcp): UCX 1.13 emulates
// put/get over TCP with one message per segment (8 KiB by default); 1 MiB segments made 1-16 MiB
// puts over TCP 2-4x and gets 2-2.5x faster (docs/onesided.md). Cost: TCP send/receive buffers of
// 1 MiB each. With them, puts and gets over TCP are the agent's own messages (AgentOptions::put_over_am).
//
// Exposure: UCX's TCP transport has no authentication and its receive path writes a peer's put
// (and its own emulated put/get) wherever the peer says, whatever this process' settings. The
// agent therefore keeps UCX on the fewest devices (AgentOptions::net_devices: loopback only for a
// one-host job) and turns UCX's TCP put off for its own traffic (UCX_TCP_PUT_ENABLE=n unless set;
// the agent's puts over TCP are its own token-checked messages). A host that can reach a device
// UCX listens on can still write into the process: keep jobs that span hosts on a trusted network.
//
// GPU memory (one node): RegisterMemory(ptr, bytes, kCuda) exports the region by CUDA IPC
// (cuda_ipc.h) instead of UCX; a peer's ImportRegion opens it, and Put/Get between it and local
// host or GPU memory are cudaMemcpyAsync on TransferOptions::cuda_stream, ordered with the caller's
// kernels and capturable in a CUDA graph (the Work is then finished at once: completion is the
// graph launch's stream). Otherwise the Work finishes when the copies did. A Notify does not wait
// for CUDA copies: Wait the Work (or synchronize the stream) before notifying. Without a GPU and
// driver, kCuda calls refuse with FAILED_PRECONDITION; in a build without CUDA, UNIMPLEMENTED.
//
// Errors: INVALID_ARGUMENT for a malformed descriptor, mismatched lists or an access beyond a
// region (checked before anything reaches UCX); FAILED_PRECONDITION for a deregistered or unknown
// local region; NOT_FOUND / PERMISSION_DENIED for a get the target's agent refused (a region
// deregistered since or a forged token / a range outside the token's region; put_over_am);
// RESOURCE_EXHAUSTED for a get refused because too many of this agent's gets waited there
// (AgentOptions::max_queued_gets);
// UNAVAILABLE when the peer failed (connection reset, process gone); DEADLINE_EXCEEDED
// when a wait times out (the transfer's outcome is then unknown, never reported as success).
#ifndef EMBER_RUNTIME_ONESIDED_AGENT_H_
#define EMBER_RUNTIME_ONESIDED_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/onesided/work.h"
#include "runtime/store/client.h"

namespace ember::flight {
class FlightRecorder;
}

namespace ember::onesided {

enum class MemoryKind { kHost, kCuda };

struct AgentOptions {
  store::Client* store = nullptr;  // borrowed; must outlive Create() and every Connect()
  // Prefix of every store key this agent writes, e.g. an attempt-scoped "jobs/j/attempt/3/onesided/".
  std::string key_prefix = "onesided/";
  std::string name;   // unique among the agents sharing key_prefix; empty = "rank<rank>"
  int rank = -1;      // for the flight recorder and messages; -1 = unknown
  absl::Duration connect_timeout = absl::Seconds(60);  // Connect waits this long for the peer
  flight::FlightRecorder* recorder = nullptr;  // borrowed, optional: one entry per transfer
  // true: endpoints report a dead peer (UCP_ERR_HANDLING_MODE_PEER), so transfers to it fail with
  // UNAVAILABLE; UCX then uses only transports that can (TCP, CMA; where none can, as with
  // UCX_TLS=sm, the endpoint is made without it). false: every transport, including shared-memory
  // mapping of AllocateMemory regions (the fastest path on one host); a dead peer is then seen only
  // as Wait/WaitNotification timeouts.
  bool detect_peer_failure = true;
  // A Put or Get of at least this many bytes whose peer regions are mapped into this process
  // (detect_peer_failure = false, the peer's AllocateMemory regions, one host) is copied by the
  // calling thread and a helper thread together, so it uses two cores as a shared-memory
  // send/recv does; it is complete when Put/Get returns. 0: never (UCX copies on one core).
  uint64_t parallel_copy_min_bytes = 4 << 20;
  // Where UCX has no RMA lane to the peer (TCP: UCX 1.13 emulates put with one message per
  // segment, packed by a copy), puts travel as the agent's own active messages of up to 1 MiB, sent
  // from the caller's buffer without that copy and written into the target's region by its agent.
  // Each carries the token of the region whose descriptor the sender imported (descriptor.h); the
  // target writes only into the registered region with that token and only inside it (otherwise the
  // chunk is dropped, counted in refused_puts() and logged, never performed). Gets there are a
  // request message carrying the token and the range, answered by the target's agent with the
  // bytes (1 MiB messages sent from its region) only if the range lies inside the region with that
  // token, else with an error (the Work fails; refused_gets()). UCX's emulated get carries no key,
  // so it would let a peer read any address of this process. Only while the agent sets UCX's TCP
  // segments (agent.h, above). false: always ucp_put_nbx / ucp_get_nbx (no such check over TCP).
  bool put_over_am = true;
  // The network devices UCX may use (UCX_NET_DEVICES), unless UCX_NET_DEVICES is set: UCX's TCP
  // interface listens on each, and any host that reaches one can write into this process (see
  // "Exposure" above). "auto": "lo" in a job on one host (EMBER_WORLD_SIZE equal to
  // EMBER_LOCAL_WORLD_SIZE), else the device whose address this host uses to reach the job's
  // store (EMBER_STORE_ADDR), else (outside a job, or no such device) UCX's default: every device.
  // "all": UCX's default. Anything else is passed on as is ("lo", "eth0", "mlx5_0:1,eth1").
  std::string net_devices = "auto";
  // Gets over active messages, per peer: at most this many bytes of replies are posted and not yet
  // sent (raised to kAmPutChunkBytes); requests beyond wait, served in order as replies complete,
  // at most max_queued_gets of them (a request is 40 bytes there). One arriving when that many
  // wait is refused: its getter's Work fails with RESOURCE_EXHAUSTED (refused_gets()). Waiting
  // requests are dropped when a reply to their peer fails or the agent is destroyed, and are
  // refused (NOT_FOUND) if their region was deregistered meanwhile.
  uint64_t max_get_reply_bytes_in_flight = 64 << 20;
  int max_queued_gets = 1024;
};

// The TCP segment size the agent gives UCX (UCX_TCP_TX_SEG_SIZE/RX_SEG_SIZE, when neither is set):
// 1 MiB of data plus room for headers, so a 1 MiB put chunk is one message.
inline constexpr uint64_t kTcpSegmentBytes = (1 << 20) + (8 << 10);
inline constexpr uint64_t kAmPutChunkBytes = 1 << 20;

// A registered local region. `descriptor` is the packed form a peer imports (UCX rkey, base
// address and length); it is plain bytes, safe to send through the store.
struct Registration {
  uint64_t id = 0;
  void* base = nullptr;
  uint64_t bytes = 0;
  MemoryKind kind = MemoryKind::kHost;
  std::string descriptor;
};

// A peer's region as imported on one connection (ImportRegion).
struct RemoteRegion {
  uint64_t handle = 0;
};

// One element of a transfer list: `length` bytes at `offset` into a region.
struct LocalDesc {
  uint64_t registration = 0;  // Registration::id
  uint64_t offset = 0, length = 0;
};
struct RemoteDesc {
  RemoteRegion region;
  uint64_t offset = 0, length = 0;
};

struct TransferOptions {
  void* cuda_stream = nullptr;  // cudaStream_t for CUDA IPC transfers; null = the default stream
};

struct Notification {
  std::string peer;     // the sending agent's name
  std::string message;
};

class Agent;

// A connection to one peer agent; owned by the Agent that made it.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual const std::string& peer() const = 0;
  virtual int peer_rank() const = 0;
  // Unpacks a peer's Registration::descriptor for use on this connection.
  virtual absl::StatusOr<RemoteRegion> ImportRegion(absl::string_view descriptor) = 0;
  // OK while the peer is reachable; the error that broke the connection otherwise.
  virtual absl::Status health() const = 0;
};

class Agent {
 public:
  // Opens UCX (context + worker, UCX_TLS honoured) and starts the progress thread.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(const AgentOptions& options);
  virtual ~Agent() = default;

  virtual const std::string& name() const = 0;

  // Registers [ptr, ptr + bytes) for transfers; bytes may be 0 (an empty region). kCuda: device
  // memory from cudaMalloc, exported by CUDA IPC (see above for where that refuses).
  virtual absl::StatusOr<Registration> RegisterMemory(void* ptr, uint64_t bytes,
                                                      MemoryKind kind = MemoryKind::kHost) = 0;
  // Allocates `bytes` of host memory through UCX and registers it (released by Deregister or the
  // Agent's destruction). On one host, a peer with detect_peer_failure=false can then map it and
  // put/get with plain loads and stores instead of a system call or a socket per transfer.
  virtual absl::StatusOr<Registration> AllocateMemory(uint64_t bytes) = 0;
  // Transfers started later that name this region fail with FAILED_PRECONDITION. Transfers in
  // flight must have finished first (the caller's duty), peers' gets from it too: over TCP the
  // agent sends a get's bytes from the region after the request was checked (put_over_am), as an
  // RMA get would read it. NOT_FOUND for an unknown id.
  virtual absl::Status Deregister(uint64_t registration_id) = 0;
  // Puts from peers this agent refused so far (AgentOptions::put_over_am): a chunk whose region
  // token names no registered region (deregistered since, or forged), or whose range lies outside
  // the region it names. Each is dropped (nothing written) and logged (rate-limited); its sender's
  // Work still completes OK. For monitoring and tests.
  virtual uint64_t refused_puts() const = 0;
  // Get requests from peers this agent refused so far (gets over active messages, as puts above):
  // a token that names no registered host region, or a range outside the region it names. Each is
  // answered with an error and logged (rate-limited); its getter's Work fails with NOT_FOUND or
  // PERMISSION_DENIED, nothing written into its buffer; also one refused because too many of its
  // peer's gets were waiting (AgentOptions::max_queued_gets; RESOURCE_EXHAUSTED there). For
  // monitoring and tests.
  virtual uint64_t refused_gets() const = 0;
  // The most get reply bytes this agent ever had in flight to one peer at once (at most
  // AgentOptions::max_get_reply_bytes_in_flight). For monitoring and tests.
  virtual uint64_t peak_get_reply_bytes() const = 0;
  // Testing only (orders a race in get_flood_test): while held, peers' get requests that pass the
  // first check wait in this agent's queues and nothing is sent for them; releasing serves them
  // in order, each one's region checked again first (a region deregistered meanwhile is refused).
  // WaitingGetsForTest(): the requests waiting now, over all peers.
  virtual void HoldGetRepliesForTest(bool hold) = 0;
  virtual size_t WaitingGetsForTest() const = 0;

  // Connects to `peer` through the store: publishes this worker's address under
  // <prefix>addr/<name>/<peer>/<n> and reads <prefix>addr/<peer>/<name>/<n>, where n counts this
  // agent's Connect calls to `peer` (the N-th Connect on one side pairs with the N-th on the other).
  // Both sides must call it. DEADLINE_EXCEEDED when the peer does not publish in time.
  virtual absl::StatusOr<Connection*> Connect(absl::string_view peer) = 0;

  // Writes each local[i] into remote[i] (Put) or reads remote[i] into local[i] (Get); the lists
  // must have equal sizes and local[i].length == remote[i].length. Argument errors come back as a
  // Work that is already finished with the error. One list goes either through UCX (host regions
  // everywhere) or through CUDA IPC (every remote region a peer's GPU region); a mix is refused.
  virtual Work Put(Connection* conn, const std::vector<LocalDesc>& local,
                   const std::vector<RemoteDesc>& remote, const TransferOptions& options = {}) = 0;
  virtual Work Get(Connection* conn, const std::vector<LocalDesc>& local,
                   const std::vector<RemoteDesc>& remote, const TransferOptions& options = {}) = 0;
  // Sends `message` (at most kMaxNotificationBytes) to the peer after every put issued on `conn`
  // before this call is visible in the peer's memory (endpoint flush, then an active message).
  virtual Work Notify(Connection* conn, absl::string_view message) = 0;
  // The next notification from any peer, in arrival order (per peer: in send order).
  // DEADLINE_EXCEEDED after `timeout`; UNAVAILABLE as soon as one of this agent's connections
  // fails during the wait (the message names it), so a dead sender does not cost the full timeout.
  // `style`: work.h (kBlock for background threads beside compute).
  virtual absl::StatusOr<Notification> WaitNotification(absl::Duration timeout,
                                                        WaitStyle style = WaitStyle::kSpin) = 0;
};

// Notifications are eager active messages (several fragments above UCX's segment size, delivered
// whole and in send order per connection); this bounds what one costs the receiver at once.
inline constexpr size_t kMaxNotificationBytes = 1 << 20;

}  // namespace ember::onesided

#endif  // EMBER_RUNTIME_ONESIDED_AGENT_H_
