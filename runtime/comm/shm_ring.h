// Shared-memory transport: single-producer/single-consumer byte rings inside a POSIX shm segment.
//
// A rank owns one ShmSegment per group that holds its *incoming* rings (one per peer and kind);
// peers map it by name and write. Head/tail live on separate cache lines; the producer publishes
// with a release store, the consumer reads with acquire. Thread-compatible per side.
#ifndef EMBER_RUNTIME_COMM_SHM_RING_H_
#define EMBER_RUNTIME_COMM_SHM_RING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/channel.h"

namespace ember::comm {

struct alignas(64) RingHeader {
  std::atomic<uint64_t> head{0};  // bytes written (producer)
  char pad0[56];
  std::atomic<uint64_t> tail{0};  // bytes read (consumer)
  char pad1[56];
  std::atomic<uint32_t> closed{0};  // either side gave up
  char pad2[60];
};

// A futex doorbell: a 32-bit sequence word plus a count of registered waiters, in the shared
// segment (waited on with FUTEX_WAIT without FUTEX_PRIVATE_FLAG, so it works across processes).
// Each rank owns one per channel kind in its segment and sleeps on it when all of its pending shm
// transfers of that kind are blocked; peers ring it after advancing a ring's head (data) or tail
// (credits). Ringing costs one fence and a load unless a waiter is registered (no syscall).
//
// Waiter protocol: seen = Arm(); re-check every condition; if still blocked, Wait(seen); Disarm().
struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> waiters{0};
  char pad[56];
};
constexpr int kNumDoorbells = 2;  // index = channel kind (0 collective, 1 p2p)

uint32_t ArmDoorbell(Doorbell* b);
void DisarmDoorbell(Doorbell* b);
// Sleeps until the doorbell's sequence moves past `seen`, `timeout_us` passes or a signal arrives.
void WaitDoorbell(Doorbell* b, uint32_t seen, long timeout_us);
// Wakes the doorbell's waiters, if any are registered (always when `force`).
void RingDoorbell(Doorbell* b, bool force = false);

// A mapped segment of `num_rings` rings of `ring_bytes` (a power of two) each, followed by
// `extra_bytes` (zeroed, 64-byte aligned) that the owner lays out as it likes.
class ShmSegment {
 public:
  // Creates (O_EXCL) and maps a new segment. The creator unlinks it with Unlink() once peers mapped.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name,
                                                            int num_rings, size_t ring_bytes,
                                                            size_t extra_bytes = 0);
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name,
                                                          int num_rings, size_t ring_bytes,
                                                          size_t extra_bytes = 0);
  ~ShmSegment();
  void Unlink();
  Doorbell* doorbell(int kind) const { return static_cast<Doorbell*>(base_) + kind; }
  RingHeader* header(int i) const;
  char* data(int i) const;
  size_t ring_bytes() const { return ring_bytes_; }
  char* extra() const { return static_cast<char*>(base_) + extra_off_; }
  size_t mapped_bytes() const { return len_; }

 private:
  ShmSegment(std::string name, void* base, size_t len, size_t ring_bytes, size_t extra_off,
             bool owner)
      : name_(std::move(name)), base_(base), len_(len), ring_bytes_(ring_bytes),
        extra_off_(extra_off), owner_(owner) {}
  std::string name_;
  void* base_;
  size_t len_;
  size_t ring_bytes_;
  size_t extra_off_;
  bool owner_;
  bool unlinked_ = false;
};

// Channel over two rings: `out` (in the peer's segment, we produce) and `in` (ours, we consume).
// `liveness_fd` (borrowed, may be -1) is a socket to the peer that is never written; it reading EOF
// means the peer is gone. `peer_bell` (may be null) is rung after every head/tail advance, so the
// peer (producer of `in`, consumer of `out`) wakes up; `my_bell` (may be null) is rung on Shutdown.
std::unique_ptr<Channel> MakeShmChannel(RingHeader* out_hdr, char* out_data, RingHeader* in_hdr,
                                        char* in_data, size_t ring_bytes, int liveness_fd,
                                        Doorbell* peer_bell = nullptr, Doorbell* my_bell = nullptr);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_SHM_RING_H_
