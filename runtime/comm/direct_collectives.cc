// The cpu backend's direct shared-memory collectives (every peer on shm; cpu_backend.h).
//
// Every op starts with a sync at which all ranks publish their op header and check every peer's,
// so a mismatch fails on every rank before any data moves. Data moves in chunks of at most one
// staging slot per rank: the owner copies its chunk into its slot before entering a sync, and after
// the sync every rank reads the slots it needs in place (a peer's slot is in our address space).
// - all_gather / broadcast: copy in, sync, copy every rank's (the root's) slot out. One sync per
//   chunk.
// - reduce_scatter: each rank stages the matching piece of all N blocks; rank r then reduces
//   piece r of every rank's slot into its output (ReduceMany: all N inputs at once, rank order,
//   16-bit floats in f32 with one rounding). One sync per chunk.
// - all_reduce: small (at most small_bytes and one slot): every rank reduces the whole buffer from
//   all slots, one sync. Large: rank r reduces slice r of the chunk in place in its own slot, stages
//   the next chunk, syncs, and copies the N reduced slices out: one sync per chunk, plus one.
// - Beyond one slot per rank, all_reduce of wider types, all_gather, broadcast and all_to_all run
//   the channel algorithms after the header sync (see RunDirect).
// Waits use the collective doorbell and check abort and peer liveness like the channel path.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"
#include "runtime/comm/cpu_backend.h"

namespace ember::comm::internal {

size_t DirectStageBytes(const BackendOptions& o) {
  size_t v = std::max<size_t>(o.small_bytes, 512 << 10);
  if (const char* e = getenv(kEnvDirectStageBytes)) {
    size_t x;
    if (absl::SimpleAtoi(e, &x) && x >= 4096) v = x;
  }
  return (std::min<size_t>(v, 64 << 20) + 63) / 64 * 64;
}

bool DirectAllowedByEnv() {
  const char* e = getenv(kEnvShmDirect);
  return !(e && std::string(e) == "0");
}

absl::Status CpuBackend::DirectWait(uint64_t v) {
  const int n = o_.size, r = o_.rank;
  ShmWaiter waiter(bell(0), &coll_spin_);
  while (true) {
    if (aborted()) return AbortStatus();
    int lag = -1;
    for (int p = 0; p < n && lag < 0; ++p)
      if (p != r && ctl(p)->sync.load(std::memory_order_acquire) < v) lag = p;
    if (lag < 0) return absl::OkStatus();
    // Direct collectives write nothing to the collective channel (the channel algorithms that
    // large ops use consume all they receive before they return): Peek only checks that the peer
    // is alive and has not shut the channel down (aborted).
    absl::StatusOr<ReadSpan> s = peers_[lag].coll->Peek(0);
    if (!s.ok()) {
      if (aborted()) return AbortStatus();
      return base::Annotate(s.status(), absl::StrCat("group '", o_.group_name, "' rank ", o_.rank,
                                                     " waiting for rank ", lag, " in ",
                                                     DescribeHeader(hdr_)));
    }
    waiter.Idle();
  }
}

absl::Status CpuBackend::DirectSync(uint64_t* entered) {
  const int n = o_.size, r = o_.rank;
  const uint64_t v = ++direct_sync_;
  if (entered) *entered = v;
  DirectCtl* mine = ctl(r);
  mine->slot[v & 1].hdr = hdr_;
  mine->sync.store(v, std::memory_order_release);
  for (int p = 0; p < n; ++p)
    if (p != r) RingDoorbell(peer_segs_[p]->doorbell(0));
  RETURN_IF_ERROR(DirectWait(v));
  for (int p = 0; p < n; ++p)
    if (p != r) RETURN_IF_ERROR(CheckHeader(p, ctl(p)->slot[v & 1].hdr));
  return absl::OkStatus();
}

absl::Status CpuBackend::DirectGather(const char* in, char* out, size_t bytes, int root) {
  const int n = o_.size, r = o_.rank;
  const size_t step = DirectStageBytes(o_);
  for (size_t off = 0;; off += step) {
    const size_t m = std::min(step, bytes - off);
    const uint64_t v = direct_sync_ + 1;
    if (m && (root < 0 || r == root)) std::memcpy(stage(r, v), in + off, m);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n && m; ++p) {
      if (root >= 0 && (p != root || r == root)) continue;
      std::memcpy(out + (root < 0 ? p * bytes : 0) + off, stage(p, v), m);
    }
    if (off + m >= bytes) return absl::OkStatus();
  }
}

absl::Status CpuBackend::DirectReduceScatter(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank;
  const int avg = reduce_ == ReduceOp::kAvg ? n : 0;
  const size_t step = std::max<size_t>(1, DirectStageBytes(o_) / (n * esize_));
  std::vector<const void*> srcs(n);
  for (size_t off = 0;; off += step) {
    const size_t m = std::min(step, count - off);
    const uint64_t v = direct_sync_ + 1;
    // Slot layout: piece p (m elements of block p) at p * m.
    for (int p = 0; p < n && m; ++p)
      std::memcpy(stage(r, v) + p * m * esize_, in + (p * count + off) * esize_, m * esize_);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n; ++p) srcs[p] = stage(p, v) + r * m * esize_;
    ReduceMany(out + off * esize_, srcs.data(), n, m, dtype_, reduce_, avg);
    if (off + m >= count) return absl::OkStatus();
  }
}

absl::Status CpuBackend::DirectAllReduce(char* buf, size_t count) {
  const int n = o_.size, r = o_.rank;
  const int avg = reduce_ == ReduceOp::kAvg ? n : 0;
  const size_t step = DirectStageBytes(o_) / esize_;
  std::vector<const void*> srcs(n);
  uint64_t v = direct_sync_ + 1;
  if (count * esize_ <= std::min(DirectStageBytes(o_), o_.small_bytes)) {
    if (count) std::memcpy(stage(r, v), buf, count * esize_);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n; ++p) srcs[p] = stage(p, v);
    ReduceMany(buf, srcs.data(), n, count, dtype_, reduce_, avg);
    return absl::OkStatus();
  }
  // Large: chunk k's inputs are in the slots of sync v; its reduced slices are published with
  // the sync that also publishes chunk k + 1's inputs.
  std::memcpy(stage(r, v), buf, std::min(step, count) * esize_);
  RETURN_IF_ERROR(DirectSync(&v));
  for (size_t off = 0;;) {
    const size_t m = std::min(step, count - off);
    const size_t lo = ChunkOff(m, n, r), hi = ChunkOff(m, n, r + 1);
    for (int p = 0; p < n; ++p) srcs[p] = stage(p, v) + lo * esize_;
    ReduceMany(stage(r, v) + lo * esize_, srcs.data(), n, hi - lo, dtype_, reduce_, avg);
    const size_t next = off + m, next_m = std::min(step, count - next);
    if (next_m) std::memcpy(stage(r, v + 1), buf + next * esize_, next_m * esize_);
    RETURN_IF_ERROR(DirectSync());
    for (int p = 0; p < n; ++p) {
      const size_t plo = ChunkOff(m, n, p), phi = ChunkOff(m, n, p + 1);
      std::memcpy(buf + (off + plo) * esize_, stage(p, v) + plo * esize_, (phi - plo) * esize_);
    }
    if (!next_m) return absl::OkStatus();
    off = next;
    ++v;
  }
}

absl::Status CpuBackend::RunDirect(const OpDesc& op) {
  const int n = o_.size;
  const size_t count = op.count, bytes = count * esize_;
  char* out = static_cast<char*>(op.out);
  const char* in = static_cast<const char*>(op.in);
  // Beyond one staging slot per rank, moving data through the rings copies less than staging
  // (ring all_reduce: 2(N-1)/N copies of the buffer; staged: about 3), so large all_reduce (except
  // of 16-bit floats, which need the one rounding), all_gather and broadcast use the channel
  // algorithms after the header sync. docs/comm.md has the measurements.
  const bool wide = bytes > DirectStageBytes(o_);
  const bool half = dtype_ == DataType::kBF16 || dtype_ == DataType::kF16;
  switch (op.type) {
    case OpType::kBarrier:
    case OpType::kGroupCreate:
      return DirectSync();
    case OpType::kAllReduce:
      if (wide && !half) {
        RETURN_IF_ERROR(DirectSync());
        RETURN_IF_ERROR(RingAllReduce(out, count));
        if (reduce_ == ReduceOp::kAvg) FinishAvg(out, count, dtype_, n);
        return absl::OkStatus();
      }
      return DirectAllReduce(out, count);
    case OpType::kReduceScatter:
      return DirectReduceScatter(in, out, count);
    case OpType::kAllGather:
      if (wide) {
        RETURN_IF_ERROR(DirectSync());
        return AllGather(in, out, count);
      }
      return DirectGather(in, out, bytes, -1);
    case OpType::kBroadcast:
      if (wide) {
        RETURN_IF_ERROR(DirectSync());
        return Broadcast(out, count, op.root);
      }
      return DirectGather(out, out, bytes, op.root);
    case OpType::kAllToAll: {
      const uint64_t v = direct_sync_ + 1;
      if (bytes * n <= DirectStageBytes(o_)) {
        if (bytes) std::memcpy(stage(o_.rank, v), in, bytes * n);
        RETURN_IF_ERROR(DirectSync());
        for (int p = 0; p < n && bytes; ++p)
          std::memcpy(out + p * bytes, stage(p, v) + o_.rank * bytes, bytes);
        return absl::OkStatus();
      }
      // Large: headers checked at the sync, then the pairwise exchange over the channels.
      RETURN_IF_ERROR(DirectSync());
      return AllToAll(in, out, count);
    }
    default:
      return absl::InvalidArgumentError("not a collective");
  }
}

}  // namespace ember::comm::internal
