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

// A mapped segment of `num_rings` rings of `ring_bytes` (a power of two) each.
class ShmSegment {
 public:
  // Creates (O_EXCL) and maps a new segment. The creator unlinks it with Unlink() once peers mapped.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name,
                                                            int num_rings, size_t ring_bytes);
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name,
                                                          int num_rings, size_t ring_bytes);
  ~ShmSegment();
  void Unlink();
  RingHeader* header(int i) const;
  char* data(int i) const;
  size_t ring_bytes() const { return ring_bytes_; }

 private:
  ShmSegment(std::string name, void* base, size_t len, size_t ring_bytes, bool owner)
      : name_(std::move(name)), base_(base), len_(len), ring_bytes_(ring_bytes), owner_(owner) {}
  std::string name_;
  void* base_;
  size_t len_;
  size_t ring_bytes_;
  bool owner_;
  bool unlinked_ = false;
};

// Channel over two rings: `out` (in the peer's segment, we produce) and `in` (ours, we consume).
// `liveness_fd` (borrowed, may be -1) is a socket to the peer that is never written; it reading EOF
// means the peer is gone.
std::unique_ptr<Channel> MakeShmChannel(RingHeader* out_hdr, char* out_data, RingHeader* in_hdr,
                                        char* in_data, size_t ring_bytes, int liveness_fd);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_SHM_RING_H_
