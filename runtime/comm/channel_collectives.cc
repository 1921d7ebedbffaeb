// The cpu backend's channel path: the progress loop over channels (Xfer), the op header exchange
// and check, Run, and the channel algorithms (ring, recursive doubling, binomial tree / pipelined
// chain, pairwise exchange). Used for TCP and mixed groups, and by the direct path for large ops.
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/cpu_backend.h"

namespace ember::comm::internal {

std::string DescribeHeader(const OpHeader& h) {
  return absl::StrCat(OpTypeName(static_cast<OpType>(h.type)), " seq ", h.seq, " count ", h.count,
                      " ", DTypeName(static_cast<DataType>(h.dtype)),
                      h.type == static_cast<uint8_t>(OpType::kAllReduce) ||
                              h.type == static_cast<uint8_t>(OpType::kReduceScatter)
                          ? absl::StrCat(" ", ReduceOpName(static_cast<ReduceOp>(h.reduce)))
                          : "",
                      h.type == static_cast<uint8_t>(OpType::kBroadcast)
                          ? absl::StrCat(" root ", h.root)
                          : "");
}

// ---------------------------------------------------------------------------------------------
// Progress

absl::Status CpuBackend::StepXfer(Xfer& x, bool* progressed) {
  size_t want = std::min(x.n - x.done, x.ch->is_shm() ? kStepBytes : kTcpStepBytes);
  if (x.kind == Xfer::kSend) {
    if (x.limit) want = std::min(want, *x.limit > x.done ? *x.limit - x.done : 0);
    if (want == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(size_t k, x.ch->TrySend(x.buf + x.done, want));
    x.done += k;
    *progressed |= k > 0;
    return absl::OkStatus();
  }
  if (x.kind == Xfer::kRecvCopy || x.kind == Xfer::kRecvHeader) {
    ASSIGN_OR_RETURN(size_t k, x.ch->TryRecv(x.buf + x.done, want));
    x.done += k;
    *progressed |= k > 0;
    return absl::OkStatus();
  }
  // kRecvReduce: reduce straight out of the channel (the shm ring) into the destination.
  if (x.carry_n == 0) {
    ASSIGN_OR_RETURN(ReadSpan s, x.ch->Peek(want));
    size_t whole = s.size / x.esize * x.esize;
    if (whole > 0) {
      Reduce(x.buf + x.done, s.data, whole / x.esize, x.dtype, x.reduce);
      x.ch->Consume(whole);
      x.done += whole;
      *progressed = true;
      return absl::OkStatus();
    }
    if (s.size == 0) return absl::OkStatus();
  }
  // An element split across the ring's wrap point (or a short TCP read): assemble it.
  ASSIGN_OR_RETURN(size_t k, x.ch->TryRecv(x.carry + x.carry_n, x.esize - x.carry_n));
  x.carry_n += k;
  *progressed |= k > 0;
  if (x.carry_n == x.esize) {
    Reduce(x.buf + x.done, x.carry, 1, x.dtype, x.reduce);
    x.done += x.esize;
    x.carry_n = 0;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Progress(Xfer* xs, int k) {
  int idle = 0;
  std::vector<pollfd> fds;
  std::vector<std::pair<Channel*, bool>> busy;
  int first = 0;  // xs[0, first) are finished
  ShmWaiter waiter(bell(0), &coll_spin_);
  while (true) {
    if (aborted()) return AbortStatus();
    bool progressed = false, all_done = true;
    bool any_shm = false;
    fds.clear();
    busy.clear();
    for (int i = first; i < k; ++i) {
      Xfer& x = xs[i];
      if (x.finished()) {
        if (i == first) ++first;  // finished ones stay finished
        continue;
      }
      all_done = false;
      // Transfers on one channel direction run in list order: only the first unfinished one per
      // direction steps (`busy` holds the directions already taken this round; a handful).
      const std::pair<Channel*, bool> dir{x.ch, x.is_send()};
      if (std::find(busy.begin(), busy.end(), dir) != busy.end()) continue;
      busy.push_back(dir);
      absl::Status st = StepXfer(x, &progressed);
      if (!st.ok()) {
        if (aborted()) return AbortStatus();
        return base::Annotate(st, absl::StrCat("group '", o_.group_name, "' rank ", o_.rank,
                                               " <-> rank ", x.peer));
      }
      if (x.kind == Xfer::kRecvHeader && x.finished()) {
        RETURN_IF_ERROR(CheckHeaders(std::vector<Xfer>{x}));
      }
      if (!x.finished()) {
        if (x.ch->is_shm()) {
          any_shm = true;
        } else if (x.is_send() && x.limit && x.done >= *x.limit) {
          // Waits for the transfer that feeds it (listed, and polled, on its own), not for room:
          // polling POLLOUT on a writable socket would spin.
        } else {
          fds.push_back({x.ch->fd(), static_cast<short>(x.is_send() ? POLLOUT : POLLIN), 0});
        }
      }
    }
    if (all_done) return absl::OkStatus();
    if (progressed) {
      idle = 0;
      waiter.Busy();
      continue;
    }
    if (any_shm && fds.empty()) {
      // Only shm transfers pending: every peer rings our doorbell when it moves a ring we wait on.
      waiter.Idle();
      continue;
    }
    waiter.Busy();
    ++idle;
    if (any_shm) fds.clear();
    Backoff(idle, fds);
  }
}

absl::Status CpuBackend::CheckHeaders(const std::vector<Xfer>& xs) {
  for (const Xfer& x : xs) {
    if (x.kind != Xfer::kRecvHeader) continue;
    OpHeader theirs;
    std::memcpy(&theirs, x.buf, sizeof(theirs));
    RETURN_IF_ERROR(CheckHeader(x.peer, theirs));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckHeader(int peer, const OpHeader& theirs) {
  if (theirs.magic != kOpMagic) {
    return absl::InternalError(absl::StrCat("group '", o_.group_name, "' rank ", o_.rank,
                                            ": stream from rank ", peer,
                                            " is out of sync (bad op header)"));
  }
  if (theirs.type != hdr_.type || theirs.dtype != hdr_.dtype || theirs.count != hdr_.count ||
      theirs.seq != hdr_.seq || theirs.reduce != hdr_.reduce || theirs.root != hdr_.root) {
    return absl::InvalidArgumentError(absl::StrCat(
        "collective mismatch in group '", o_.group_name, "': rank ", o_.rank, " called ",
        DescribeHeader(hdr_), " but rank ", peer, " called ", DescribeHeader(theirs)));
  }
  return absl::OkStatus();
}

void CpuBackend::AddHeaders(std::vector<Xfer>* xs, int send_peer, int recv_peer) {
  if (send_peer >= 0 && !hdr_sent_[send_peer]) {
    hdr_sent_[send_peer] = 1;
    Xfer x;
    x.kind = Xfer::kSend;
    x.peer = send_peer;
    x.ch = peers_[send_peer].coll.get();
    x.buf = reinterpret_cast<char*>(&hdr_);
    x.n = sizeof(hdr_);
    xs->push_back(x);
  }
  if (recv_peer >= 0 && !hdr_recvd_[recv_peer]) {
    hdr_recvd_[recv_peer] = 1;
    Xfer x;
    x.kind = Xfer::kRecvHeader;
    x.peer = recv_peer;
    x.ch = peers_[recv_peer].coll.get();
    x.buf = reinterpret_cast<char*>(&peer_hdrs_[recv_peer]);
    x.n = sizeof(OpHeader);
    xs->push_back(x);
  }
}

absl::Status CpuBackend::Exchange(int send_peer, const char* send, size_t send_bytes,
                                  int recv_peer, char* recv, size_t recv_bytes,
                                  Xfer::Kind recv_kind, const size_t* limit) {
  std::vector<Xfer> xs;
  xs.reserve(4);
  AddHeaders(&xs, send_peer, recv_peer);
  if (send_peer >= 0 && send_bytes > 0) {
    Xfer x;
    x.kind = Xfer::kSend;
    x.peer = send_peer;
    x.ch = peers_[send_peer].coll.get();
    x.buf = const_cast<char*>(send);
    x.n = send_bytes;
    x.limit = limit;
    xs.push_back(x);
  }
  size_t recv_index = xs.size();
  if (recv_peer >= 0 && recv_bytes > 0) {
    Xfer x;
    x.kind = recv_kind;
    x.peer = recv_peer;
    x.ch = peers_[recv_peer].coll.get();
    x.buf = recv;
    x.n = recv_bytes;
    x.dtype = dtype_;
    x.reduce = reduce_;
    x.esize = esize_;
    xs.push_back(x);
  }
  (void)recv_index;
  return Progress(xs.data(), static_cast<int>(xs.size()));
}

// ---------------------------------------------------------------------------------------------
// Algorithms

absl::Status CpuBackend::Run(const OpDesc& op) {
  if (aborted()) return AbortStatus();
  const int n = o_.size, r = o_.rank;
  esize_ = DTypeSize(op.dtype);
  dtype_ = op.dtype;
  reduce_ = op.reduce;
  hdr_ = OpHeader();
  hdr_.type = static_cast<uint8_t>(op.type);
  hdr_.dtype = static_cast<uint8_t>(op.dtype);
  hdr_.reduce = (op.type == OpType::kAllReduce || op.type == OpType::kReduceScatter)
                    ? static_cast<uint8_t>(op.reduce) : 0;
  hdr_.root = op.type == OpType::kBroadcast ? op.root : 0;
  hdr_.seq = op.seq;
  hdr_.count = op.count;
  hdr_sent_.assign(n, 0);
  hdr_recvd_.assign(n, 0);
  peer_hdrs_.resize(n);
  const size_t bytes = op.count * esize_;
  char* out = static_cast<char*>(op.out);
  const char* in = static_cast<const char*>(op.in);

  if (n == 1) {
    if (op.type == OpType::kAllGather || op.type == OpType::kReduceScatter ||
        op.type == OpType::kAllToAll) {
      if (bytes) std::memmove(out, in, bytes);
    }
    return absl::OkStatus();
  }
  if (direct_) return RunDirect(op);
  absl::Status st;
  switch (op.type) {
    case OpType::kAllReduce:
    case OpType::kBarrier:
    case OpType::kGroupCreate:
      if (op.type != OpType::kAllReduce) {
        // Barrier / group creation: a 1-byte max all-reduce carries the descriptor check.
        static thread_local uint8_t one;
        one = 1;
        dtype_ = DataType::kU8;
        esize_ = 1;
        reduce_ = ReduceOp::kMax;
        st = RecursiveDoublingAllReduce(reinterpret_cast<char*>(&one), 1);
        break;
      }
      if (bytes == 0) {
        st = Exchange(Mod(r + 1, n), nullptr, 0, Mod(r - 1, n), nullptr, 0, Xfer::kRecvCopy);
      } else if (bytes <= o_.small_bytes || op.count < static_cast<size_t>(n)) {
        st = RecursiveDoublingAllReduce(out, op.count);
      } else {
        st = RingAllReduce(out, op.count);
      }
      if (st.ok() && op.reduce == ReduceOp::kAvg && op.count) FinishAvg(out, op.count, op.dtype, n);
      break;
    case OpType::kBroadcast:
      st = Broadcast(out, op.count, op.root);
      break;
    case OpType::kAllGather:
      st = AllGather(in, out, op.count);
      break;
    case OpType::kReduceScatter:
      st = ReduceScatter(in, out, op.count);
      if (st.ok() && op.reduce == ReduceOp::kAvg && op.count) FinishAvg(out, op.count, op.dtype, n);
      break;
    case OpType::kAllToAll:
      st = AllToAll(in, out, op.count);
      break;
    default:
      st = absl::InvalidArgumentError("not a collective");
  }
  return st;
}

absl::Status CpuBackend::RingAllReduce(char* buf, size_t count) {
  // Rank r ends up owning chunk r+1 after the reduce-scatter; the all-gather circulates them.
  return RingPipelined(buf, count, 1, /*all_gather=*/true);
}

// After it, rank r holds the full reduction of chunk (r + owner_shift) mod n in place.
absl::Status CpuBackend::RingReduceScatterInPlace(char* buf, size_t count, int owner_shift) {
  return RingPipelined(buf, count, owner_shift, /*all_gather=*/false);
}

// Every step sends to next and receives from prev, and the chunk a step sends is the one the step
// before received (reduce-scatter step s sends chunk r-s+shift-1, received at s-1; all-gather step
// 0 sends chunk r+1, reduced by the last reduce-scatter step). So the whole ring is one stream:
// each send is limited to the bytes its source step has already received (reduced), and moves
// them on while they are still in cache, instead of waiting for the step to finish.
//
// Overwrite safety: the only chunk a step writes that an earlier send still reads is the
// all-gather step s receiving into chunk r-s, which reduce-scatter step s sent; a byte of its final
// value can only arrive after next received (and reduced) that byte from us, and TrySend copies
// synchronously, so the byte has left `buf` by then.
absl::Status CpuBackend::RingPipelined(char* buf, size_t count, int owner_shift, bool all_gather) {
  const int n = o_.size, r = o_.rank, next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const int steps = (n - 1) * (all_gather ? 2 : 1);
  std::vector<Xfer> xs;
  xs.reserve(2 + 2 * steps);  // limits point into xs: it must not reallocate
  AddHeaders(&xs, next, prev);
  auto chunk = [&](int c, size_t* off) {
    *off = ChunkOff(count, n, c) * esize_;
    return ChunkOff(count, n, c + 1) * esize_ - *off;
  };
  int last_recv = -1;
  for (int t = 0; t < steps; ++t) {
    const bool rs = t < n - 1;
    const int s = rs ? t : t - (n - 1);
    const int sc = rs ? Mod(r - s + owner_shift - 1, n) : Mod(r + 1 - s, n);
    const int rc = rs ? Mod(r - s + owner_shift - 2, n) : Mod(r - s, n);
    size_t so, ro;
    Xfer snd;
    snd.kind = Xfer::kSend;
    snd.peer = next;
    snd.ch = peers_[next].coll.get();
    snd.n = chunk(sc, &so);
    snd.buf = buf + so;
    if (last_recv >= 0) snd.limit = &xs[last_recv].done;
    xs.push_back(snd);
    Xfer rcv;
    rcv.kind = rs ? Xfer::kRecvReduce : Xfer::kRecvCopy;
    rcv.peer = prev;
    rcv.ch = peers_[prev].coll.get();
    rcv.n = chunk(rc, &ro);
    rcv.buf = buf + ro;
    rcv.dtype = dtype_;
    rcv.reduce = reduce_;
    rcv.esize = esize_;
    xs.push_back(rcv);
    last_recv = static_cast<int>(xs.size()) - 1;
  }
  return Progress(xs.data(), static_cast<int>(xs.size()));
}

absl::Status CpuBackend::RecursiveDoublingAllReduce(char* buf, size_t count) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  int vr;  // rank among the power-of-two participants, -1 if folded out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      RETURN_IF_ERROR(Exchange(r + 1, buf, bytes, -1, nullptr, 0, Xfer::kRecvCopy));
      vr = -1;
    } else {
      RETURN_IF_ERROR(Exchange(-1, nullptr, 0, r - 1, buf, bytes, Xfer::kRecvReduce));
      vr = r / 2;
    }
  } else {
    vr = r - rem;
  }
  if (vr >= 0) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int pv = vr ^ mask;
      int partner = pv < rem ? pv * 2 + 1 : pv + rem;
      // Exchange whole buffers: receive into scratch, then combine (partner reads `buf` while we
      // read theirs, so reducing in place while sending would race with our own send).
      RETURN_IF_ERROR(Exchange(partner, buf, bytes, partner, scratch_.data(), bytes,
                               Xfer::kRecvCopy));
      Reduce(buf, scratch_.data(), count, dtype_, reduce_);
    }
  }
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      RETURN_IF_ERROR(Exchange(-1, nullptr, 0, r + 1, buf, bytes, Xfer::kRecvCopy));
    } else {
      RETURN_IF_ERROR(Exchange(r - 1, buf, bytes, -1, nullptr, 0, Xfer::kRecvCopy));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Broadcast(char* buf, size_t count, int root) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  const int vr = Mod(r - root, n);
  if (bytes <= o_.small_bytes) {
    // Binomial tree.
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        RETURN_IF_ERROR(Exchange(-1, nullptr, 0, Mod(vr - mask + root, n), buf, bytes,
                                 Xfer::kRecvCopy));
        break;
      }
      mask <<= 1;
    }
    mask >>= 1;
    while (mask > 0) {
      if (vr + mask < n)
        RETURN_IF_ERROR(Exchange(Mod(vr + mask + root, n), buf, bytes, -1, nullptr, 0,
                                 Xfer::kRecvCopy));
      mask >>= 1;
    }
    return absl::OkStatus();
  }
  // Pipelined chain root -> root+1 -> ...: forward bytes as soon as they arrive.
  int prev = vr == 0 ? -1 : Mod(r - 1, n);
  int next = vr == n - 1 ? -1 : Mod(r + 1, n);
  std::vector<Xfer> xs;
  AddHeaders(&xs, next, prev);
  size_t recv_i = xs.size();
  if (prev >= 0) {
    Xfer x;
    x.kind = Xfer::kRecvCopy;
    x.peer = prev;
    x.ch = peers_[prev].coll.get();
    x.buf = buf;
    x.n = bytes;
    xs.push_back(x);
  }
  if (next >= 0) {
    Xfer x;
    x.kind = Xfer::kSend;
    x.peer = next;
    x.ch = peers_[next].coll.get();
    x.buf = buf;
    x.n = bytes;
    xs.push_back(x);
  }
  if (prev >= 0 && next >= 0) xs.back().limit = &xs[recv_i].done;  // xs no longer grows
  return Progress(xs.data(), static_cast<int>(xs.size()));
}

absl::Status CpuBackend::AllGather(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank, next = Mod(r + 1, n), prev = Mod(r - 1, n);
  const size_t bytes = count * esize_;
  if (bytes && out + r * bytes != in) std::memmove(out + r * bytes, in, bytes);
  for (int s = 0; s < n - 1; ++s) {
    int sb = Mod(r - s, n), rb = Mod(r - s - 1, n);
    RETURN_IF_ERROR(Exchange(next, out + sb * bytes, bytes, prev, out + rb * bytes, bytes,
                             Xfer::kRecvCopy));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::ReduceScatter(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  // Work on a copy of the input (the caller's `in` is const); blocks of `count` elements.
  if (scratch_.size() < bytes * n) scratch_.resize(bytes * n);
  if (bytes) std::memcpy(scratch_.data(), in, bytes * n);
  RETURN_IF_ERROR(RingReduceScatterInPlace(scratch_.data(), count * n, 0));
  // With count*n elements split in n chunks, chunk r is exactly block r.
  if (bytes) std::memcpy(out, scratch_.data() + r * bytes, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::AllToAll(const char* in, char* out, size_t count) {
  const int n = o_.size, r = o_.rank;
  const size_t bytes = count * esize_;
  if (bytes) std::memcpy(out + r * bytes, in + r * bytes, bytes);
  for (int s = 1; s < n; ++s) {
    int to = Mod(r + s, n), from = Mod(r - s, n);
    RETURN_IF_ERROR(Exchange(to, in + to * bytes, bytes, from, out + from * bytes, bytes,
                             Xfer::kRecvCopy));
  }
  return absl::OkStatus();
}

}  // namespace ember::comm::internal
