// The "cpu" backend's bootstrap and lifetime: Connect (TCP dial/accept, shm segments, the verdicts
// on shm per peer and on direct collectives), Abort, Describe. cpu_backend.h lists the other parts.
#include "runtime/comm/cpu_backend.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/env_knobs.h"

namespace ember::comm {

const char* OpTypeName(OpType t) {
  switch (t) {
    case OpType::kAllReduce: return "all_reduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllGather: return "all_gather";
    case OpType::kReduceScatter: return "reduce_scatter";
    case OpType::kAllToAll: return "all_to_all";
    case OpType::kBarrier: return "barrier";
    case OpType::kSend: return "send";
    case OpType::kRecv: return "recv";
    case OpType::kGroupCreate: return "group_create";
  }
  return "?";
}

namespace internal {
namespace {

uint32_t Fnv1a(absl::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

std::string BootId() {
  if (const char* e = getenv(kEnvBootId)) return e;  // tests: pretend to be another host
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s.empty() ? "unknown" : s;
}

}  // namespace

CpuBackend::~CpuBackend() {
  p2p_.Stop();
  for (Peer& p : peers_) {
    if (p.shm) {
      if (p.coll_fd >= 0) close(p.coll_fd);
      if (p.p2p_fd >= 0) close(p.p2p_fd);
    }
  }
}

void CpuBackend::Abort(const absl::Status& why) {
  bool was = abort_.exchange(true);
  if (was) return;
  {
    absl::MutexLock l(&abort_mu_);
    abort_status_ = why;
  }
  for (Peer& p : peers_) {
    if (p.coll) p.coll->Shutdown();
    if (p.p2p) p.p2p->Shutdown();
    if (p.shm) {
      if (p.coll_fd >= 0) shutdown(p.coll_fd, SHUT_RDWR);
      if (p.p2p_fd >= 0) shutdown(p.p2p_fd, SHUT_RDWR);
    }
  }
  p2p_.FailAll(AbortStatus());
}

std::string CpuBackend::Describe() const {
  int shm = 0, tcp = 0;
  for (int i = 0; i < o_.size; ++i)
    if (i != o_.rank) (peers_[i].shm ? shm : tcp)++;
  return absl::StrCat("cpu: shm x", shm, ", tcp x", tcp, direct_ ? ", direct" : "");
}

// ---------------------------------------------------------------------------------------------
// Bootstrap

absl::Status CpuBackend::Connect() {
  const int rank = o_.rank, size = o_.size;
  if (size == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(listener_, TcpListener::Listen(o_.host));
  std::string boot = BootId();
  std::string shm_name = "-";
  size_t ring = o_.shm_ring_bytes;
  if (o_.enable_shm) {
    std::random_device rd;
    shm_name = absl::StrCat("/ember-", getpid(), "-", absl::Hex(rd()), absl::Hex(rd()));
    auto seg = ShmSegment::Create(shm_name, 2 * size, ring,
                                  kDirectCtlBytes + kDirectStages * DirectStageBytes(o_));
    if (seg.ok()) {
      my_seg_ = std::move(*seg);
      new (my_seg_->extra()) DirectCtl();
    } else {
      shm_name = "-";  // fall back to TCP
    }
  }
  std::string me = absl::StrCat("v1 ", boot, " ", o_.host, " ", listener_->port(), " ", shm_name,
                                " ", getpid());
  RETURN_IF_ERROR(o_.rendezvous->Set(absl::StrCat(o_.key_prefix, "peer/", rank), me));
  struct Info {
    std::string boot, host, shm;
    int port = 0;
  };
  std::vector<Info> info(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    absl::StatusOr<std::string> v =
        o_.rendezvous->Get(absl::StrCat(o_.key_prefix, "peer/", r), o_.bootstrap_timeout);
    if (!v.ok()) {
      return base::Annotate(v.status(), absl::StrCat("group '", o_.group_name, "' rank ", rank,
                                                     ": waiting for rank ", r, " to join"));
    }
    std::vector<std::string> f = absl::StrSplit(*v, ' ');
    if (f.size() < 6 || f[0] != "v1" || !absl::SimpleAtoi(f[3], &info[r].port))
      return absl::InvalidArgumentError(absl::StrCat("bad peer record for rank ", r, ": ", *v));
    info[r].boot = f[1];
    info[r].host = f[2];
    info[r].shm = f[4];
  }
  // Lower ranks dial higher ones (twice: collective and p2p channel); the backlog holds them.
  uint32_t name_hash = Fnv1a(o_.group_name);
  for (int r = rank + 1; r < size; ++r) {
    for (uint32_t kind = 0; kind < 2; ++kind) {
      ASSIGN_OR_RETURN(int fd, TcpConnect(info[r].host, info[r].port, o_.bootstrap_timeout));
      Hello h;
      h.kind = kind;
      h.rank = rank;
      h.name_hash = name_hash;
      RETURN_IF_ERROR(WriteFull(fd, &h, sizeof(h)));
      (kind == 0 ? peers_[r].coll_fd : peers_[r].p2p_fd) = fd;
    }
  }
  for (int i = 0; i < 2 * rank; ++i) {
    ASSIGN_OR_RETURN(int fd, listener_->Accept(o_.bootstrap_timeout));
    Hello h;
    absl::Status st = ReadFull(fd, &h, sizeof(h), o_.bootstrap_timeout);
    if (!st.ok() || h.magic != kHelloMagic || h.name_hash != name_hash || h.rank < 0 ||
        h.rank >= rank || h.kind > 1) {
      close(fd);
      --i;  // a stray connection; keep waiting for the real peers
      continue;
    }
    (h.kind == 0 ? peers_[h.rank].coll_fd : peers_[h.rank].p2p_fd) = fd;
  }
  // Shared memory where both sides offer it and share a boot id (same host, same kernel).
  peer_segs_.resize(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (my_seg_ && info[r].shm != "-" && info[r].boot == boot) {
      auto seg = ShmSegment::Open(info[r].shm, 2 * size, ring,
                                  kDirectCtlBytes + kDirectStages * DirectStageBytes(o_));
      if (seg.ok()) {
        peer_segs_[r] = std::move(*seg);
        peers_[r].shm = true;
      }
    }
  }
  // Barrier over TCP (1 byte each way: "1" = I map your segment), then drop the shm names.
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = peers_[r].shm ? '1' : '0';
    RETURN_IF_ERROR(WriteFull(peers_[r].coll_fd, &c, 1));
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = 0;
    RETURN_IF_ERROR(ReadFull(peers_[r].coll_fd, &c, 1, o_.bootstrap_timeout));
    bool both = peers_[r].shm && c == '1';
    if (!both) peers_[r].shm = false;
  }
  // Direct collectives need every peer on shm. A rank's view of that can differ from a peer's
  // (another pair may have fallen back to TCP), so all ranks exchange their verdict and use direct
  // collectives only if every rank can.
  bool can_direct = my_seg_ != nullptr && DirectAllowedByEnv();
  for (int r = 0; r < size; ++r)
    if (r != rank && !peers_[r].shm) can_direct = false;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = can_direct ? '1' : '0';
    RETURN_IF_ERROR(WriteFull(peers_[r].coll_fd, &c, 1));
  }
  direct_ = can_direct;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    char c = 0;
    RETURN_IF_ERROR(ReadFull(peers_[r].coll_fd, &c, 1, o_.bootstrap_timeout));
    if (c != '1') direct_ = false;
  }
  if (my_seg_) my_seg_->Unlink();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    Peer& p = peers_[r];
    if (p.shm) {
      for (int kind = 0; kind < 2; ++kind) {
        int out = rank * 2 + kind, in = r * 2 + kind;
        (kind == 0 ? p.coll : p.p2p) = MakeShmChannel(
            peer_segs_[r]->header(out), peer_segs_[r]->data(out), my_seg_->header(in),
            my_seg_->data(in), ring, p.coll_fd, peer_segs_[r]->doorbell(kind),
            my_seg_->doorbell(kind));
      }
    } else {
      TuneSocket(p.coll_fd);
      TuneSocket(p.p2p_fd);
      p.coll = MakeTcpChannel(p.coll_fd);
      p.p2p = MakeTcpChannel(p.p2p_fd);
    }
  }
  int local = 1;
  for (int r = 0; r < size; ++r)
    if (r != rank && peers_[r].shm) ++local;
  coll_spin_.max = coll_spin_.cur = p2p_spin_.max = p2p_spin_.cur = ShmSpinRounds(local);
  std::vector<Channel*> p2p_channels(size, nullptr);
  for (int r = 0; r < size; ++r) p2p_channels[r] = peers_[r].p2p.get();
  p2p_.Start(std::move(p2p_channels), bell(1), &p2p_spin_);
  memory_bytes_.store(my_seg_ ? my_seg_->mapped_bytes() : 0, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace internal

std::unique_ptr<Backend> MakeCpuBackend(BackendOptions options) {
  return std::make_unique<internal::CpuBackend>(std::move(options));
}

}  // namespace ember::comm
