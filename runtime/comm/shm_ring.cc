#include "runtime/comm/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::comm {
namespace {

static_assert(sizeof(Doorbell) == 64, "layout");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word");

// Offset of the extra area (after the rings, rounded up to 64 bytes).
size_t ExtraOffset(int num_rings, size_t ring_bytes) {
  size_t off = kNumDoorbells * sizeof(Doorbell) +
               static_cast<size_t>(num_rings) * (sizeof(RingHeader) + ring_bytes);
  return (off + 63) / 64 * 64;
}

long Futex(std::atomic<uint32_t>* w, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), op, val, ts, nullptr, 0);
}

int64_t CoarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

class ShmChannel : public Channel {
 public:
  ShmChannel(RingHeader* oh, char* od, RingHeader* ih, char* id, size_t cap, int live_fd,
             Doorbell* peer_bell, Doorbell* my_bell)
      : oh_(oh), od_(od), ih_(ih), id_(id), cap_(cap), mask_(cap - 1), live_fd_(live_fd),
        peer_bell_(peer_bell), my_bell_(my_bell) {}

  absl::StatusOr<size_t> TrySend(const void* data, size_t n) override {
    uint64_t head = oh_->head.load(std::memory_order_relaxed);
    if (cap_ - (head - cached_tail_) < std::min(n, cap_ / 4 + 1)) {
      cached_tail_ = oh_->tail.load(std::memory_order_acquire);
    }
    size_t space = cap_ - (head - cached_tail_);
    if (space == 0) return CheckPeer();
    size_t k = std::min(space, n);
    size_t pos = head & mask_;
    size_t first = std::min(k, cap_ - pos);
    std::memcpy(od_ + pos, data, first);
    if (k > first) std::memcpy(od_, static_cast<const char*>(data) + first, k - first);
    oh_->head.store(head + k, std::memory_order_release);
    if (peer_bell_) RingDoorbell(peer_bell_);  // data for the consumer
    return k;
  }

  absl::StatusOr<size_t> TryRecv(void* dst, size_t n) override {
    size_t done = 0;
    while (done < n) {
      ASSIGN_OR_RETURN(ReadSpan s, Peek(n - done));
      if (s.size == 0) break;
      std::memcpy(static_cast<char*>(dst) + done, s.data, s.size);
      Consume(s.size);
      done += s.size;
    }
    return done;
  }

  absl::StatusOr<ReadSpan> Peek(size_t max) override {
    uint64_t tail = ih_->tail.load(std::memory_order_relaxed);
    if (cached_head_ == tail) cached_head_ = ih_->head.load(std::memory_order_acquire);
    size_t avail = cached_head_ - tail;
    if (avail == 0) {
      absl::StatusOr<size_t> st = CheckPeer();
      if (!st.ok()) return st.status();
      return ReadSpan{};
    }
    size_t pos = tail & mask_;
    size_t k = std::min({avail, cap_ - pos, max});
    return ReadSpan{id_ + pos, k};
  }

  void Consume(size_t n) override {
    uint64_t tail = ih_->tail.load(std::memory_order_relaxed);
    ih_->tail.store(tail + n, std::memory_order_release);
    if (peer_bell_) RingDoorbell(peer_bell_);  // credits for the producer
  }

  int fd() const override { return -1; }
  bool is_shm() const override { return true; }
  void Shutdown() override {
    oh_->closed.store(1, std::memory_order_release);
    ih_->closed.store(1, std::memory_order_release);
    if (peer_bell_) RingDoorbell(peer_bell_, /*force=*/true);
    if (my_bell_) RingDoorbell(my_bell_, /*force=*/true);
  }

 private:
  // Called when blocked: is the peer still there? Cheap checks only, rate-limited.
  absl::StatusOr<size_t> CheckPeer() {
    if (ih_->closed.load(std::memory_order_acquire) || oh_->closed.load(std::memory_order_acquire))
      return absl::UnavailableError("peer closed its shared-memory channel (aborted)");
    // Every 256 idle checks, and at least every 2 ms while blocked (a dead peer rings no doorbell,
    // so a sleeping waiter only gets here after its futex timeout).
    if (live_fd_ >= 0 && (++idle_checks_ % 256 == 0 || CoarseNowNs() - last_live_ns_ > 2000000)) {
      last_live_ns_ = CoarseNowNs();
      char c;
      ssize_t r = recv(live_fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return absl::UnavailableError("peer process is gone (connection closed)");
    }
    return size_t{0};
  }

  RingHeader* oh_;
  char* od_;
  RingHeader* ih_;
  char* id_;
  const size_t cap_, mask_;
  int live_fd_;
  uint64_t cached_tail_ = 0;  // producer's view of the consumer
  uint64_t cached_head_ = 0;  // consumer's view of the producer
  uint64_t idle_checks_ = 0;
  int64_t last_live_ns_ = 0;
  Doorbell* peer_bell_;
  Doorbell* my_bell_;
};

absl::StatusOr<std::unique_ptr<ShmSegment>> Map(const std::string& name, int fd, size_t len,
                                                size_t ring_bytes, bool owner);

}  // namespace

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               int num_rings, size_t ring_bytes,
                                                               size_t extra_bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return base::ErrnoToStatus(errno, absl::StrCat("shm_open(create) ", name));
  const size_t extra_off = ExtraOffset(num_rings, ring_bytes);
  size_t len = extra_off + extra_bytes;
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return base::ErrnoToStatus(err, absl::StrCat("ftruncate ", name));
  }
  void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return base::ErrnoToStatus(err, absl::StrCat("mmap ", name));
  }
  for (int k = 0; k < kNumDoorbells; ++k) new (static_cast<Doorbell*>(base) + k) Doorbell();
  for (int i = 0; i < num_rings; ++i) {
    new (static_cast<char*>(base) + kNumDoorbells * sizeof(Doorbell) +
         i * (sizeof(RingHeader) + ring_bytes)) RingHeader();
  }
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, base, len, ring_bytes, extra_off, true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name,
                                                             int num_rings, size_t ring_bytes,
                                                             size_t extra_bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return base::ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  const size_t extra_off = ExtraOffset(num_rings, ring_bytes);
  size_t len = extra_off + extra_bytes;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != len) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("shm segment ", name, " has the wrong size"));
  }
  void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) return base::ErrnoToStatus(err, absl::StrCat("mmap ", name));
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, base, len, ring_bytes, extra_off, false));
}

ShmSegment::~ShmSegment() {
  if (owner_) Unlink();
  munmap(base_, len_);
}

void ShmSegment::Unlink() {
  if (owner_ && !unlinked_) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

RingHeader* ShmSegment::header(int i) const {
  return reinterpret_cast<RingHeader*>(static_cast<char*>(base_) + kNumDoorbells * sizeof(Doorbell) +
                                       i * (sizeof(RingHeader) + ring_bytes_));
}

char* ShmSegment::data(int i) const {
  return reinterpret_cast<char*>(header(i)) + sizeof(RingHeader);
}

std::unique_ptr<Channel> MakeShmChannel(RingHeader* out_hdr, char* out_data, RingHeader* in_hdr,
                                        char* in_data, size_t ring_bytes, int liveness_fd,
                                        Doorbell* peer_bell, Doorbell* my_bell) {
  return std::make_unique<ShmChannel>(out_hdr, out_data, in_hdr, in_data, ring_bytes, liveness_fd,
                                      peer_bell, my_bell);
}

// Dekker-style handshake: the waiter publishes `waiters` (seq_cst RMW + fence) before re-checking
// the rings; the ringer publishes head/tail (release store) and fences before reading `waiters`.
// So either the ringer sees the waiter and bumps `seq` (FUTEX_WAIT then returns at once), or the
// waiter's re-check sees the new head/tail.
uint32_t ArmDoorbell(Doorbell* b) {
  b->waiters.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return b->seq.load(std::memory_order_acquire);
}

void DisarmDoorbell(Doorbell* b) { b->waiters.fetch_sub(1, std::memory_order_relaxed); }

void WaitDoorbell(Doorbell* b, uint32_t seen, long timeout_us) {
  if (b->seq.load(std::memory_order_acquire) != seen) return;
  timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
  Futex(&b->seq, FUTEX_WAIT, seen, &ts);  // EAGAIN (moved), ETIMEDOUT, EINTR: all mean re-check
}

void RingDoorbell(Doorbell* b, bool force) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!force && b->waiters.load(std::memory_order_relaxed) == 0) return;
  b->seq.fetch_add(1, std::memory_order_release);
  Futex(&b->seq, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace ember::comm
