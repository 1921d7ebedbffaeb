// Channel: one direction-pair byte stream between two ranks (shared-memory rings or a TCP socket).
// All operations are non-blocking; the caller (the progress loops in channel_collectives.cc and
// p2p_engine.cc) waits between attempts. A Channel is used by one thread at a time per direction
// (one sender, one receiver).
//
// Errors: UNAVAILABLE when the peer closed its end (process died or aborted its group).
#ifndef EMBER_RUNTIME_COMM_CHANNEL_H_
#define EMBER_RUNTIME_COMM_CHANNEL_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ember::comm {

struct ReadSpan {
  const char* data = nullptr;
  size_t size = 0;
};

class Channel {
 public:
  virtual ~Channel() = default;
  // Accepts up to n bytes; returns how many (0 = would block).
  virtual absl::StatusOr<size_t> TrySend(const void* data, size_t n) = 0;
  // Copies up to n received bytes into dst; returns how many (0 = nothing yet).
  virtual absl::StatusOr<size_t> TryRecv(void* dst, size_t n) = 0;
  // Zero-copy read: a contiguous span of received bytes (size 0 = nothing yet), at most `max`.
  // Call Consume(k <= span.size) when done with the first k bytes.
  virtual absl::StatusOr<ReadSpan> Peek(size_t max) = 0;
  virtual void Consume(size_t n) = 0;
  // A pollable fd (readable when data arrives), or -1 for shared memory.
  virtual int fd() const = 0;
  virtual bool is_shm() const = 0;
  // Closes the local end so the peer sees it (idempotent, any thread).
  virtual void Shutdown() = 0;
};

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_CHANNEL_H_
