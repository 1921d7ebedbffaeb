#include "runtime/comm/cpu_comm_driver.h"

#include <algorithm>
#include <random>
#include <thread>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status_macros.h"
#include "runtime/flight/recorder.h"

namespace ember::comm {
namespace {

// Host-side "events": the op is done when Collective returns.
class HostEvents : public DeviceEvents {
 public:
  HostEvents(int64_t s, int64_t e) : start_(s), end_(e) {}
  absl::Status StreamWait() override { return absl::OkStatus(); }
  absl::Status Synchronize(absl::Duration) override { return absl::OkStatus(); }
  bool Done() override { return true; }
  bool TimesNs(int64_t* s, int64_t* e) override {
    *s = start_;
    *e = end_;
    return true;
  }

 private:
  const int64_t start_, end_;
};

class CpuCommunicator : public Communicator {
 public:
  CpuCommunicator(CpuCommDriver* driver, std::string id, std::string tag, int rank, int size,
                  std::unique_ptr<Backend> b)
      : driver_(driver), id_(std::move(id)), tag_(std::move(tag)), rank_(rank), size_(size),
        b_(std::move(b)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& id() const { return id_; }
  int NextSplit() { return ++splits_; }
  int NextShrink() { return ++shrinks_; }

  absl::Status Collective(const OpDesc& op, std::shared_ptr<DeviceEvents>* events) override {
    OpDesc d = op;
    d.seq = ++seq_;  // this communicator's own op count: the same on every rank
    const int64_t t0 = flight::FlightRecorder::NowNanos();
    RETURN_IF_ERROR(b_->Run(d));
    if (events) *events = std::make_shared<HostEvents>(t0, flight::FlightRecorder::NowNanos());
    return absl::OkStatus();
  }
  void PostSend(const void* data, size_t bytes, int peer, int tag,
                std::function<void(absl::Status)> done) override {
    b_->PostSend(data, bytes, peer, tag, std::move(done));
  }
  void PostRecv(void* data, size_t bytes, int peer, int tag,
                std::function<void(absl::Status)> done) override {
    b_->PostRecv(data, bytes, peer, tag, std::move(done));
  }
  absl::Status AsyncError() override { return driver_->injected(); }
  void Abort(const absl::Status& why) override {
    if (aborted_.exchange(true)) return;
    driver_->Note(absl::StrCat("abort ", tag_));
    b_->Abort(why);
  }
  size_t MemoryBytes() const override { return 0; }
  std::string Describe() const override {
    return absl::StrCat(tag_, " rank ", rank_, "/", size_, " (", b_->Describe(), ")");
  }

 private:
  CpuCommDriver* const driver_;
  const std::string id_, tag_;
  const int rank_, size_;
  std::unique_ptr<Backend> b_;
  int64_t seq_ = 0;  // Collective is called by one thread at a time
  std::atomic<int> splits_{0}, shrinks_{0};
  std::atomic<bool> aborted_{false};
};

}  // namespace

absl::StatusOr<std::string> CpuCommDriver::NewUniqueId() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd()), absl::Hex(rd()), "-", getpid());
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuCommDriver::InitRank(const std::string& id,
                                                                      int rank, int size,
                                                                      const CommInitOptions& o) {
  BackendOptions bo = base_;
  bo.group_name = absl::StrCat("cpucomm-", id);
  bo.rank = rank;
  bo.size = size;
  bo.rendezvous = rdzv_;
  bo.key_prefix = absl::StrCat("cpucomm/", id, "/");
  bo.bootstrap_timeout = o.timeout;
  std::unique_ptr<Backend> b = MakeCpuBackend(std::move(bo));
  absl::Status st = b->Connect();
  if (!st.ok()) {
    return base::Annotate(st, absl::StrCat("init of communicator '", o.tag, "' rank ", rank, "/",
                                           size, " on ", o.device));
  }
  Note(absl::StrCat("init ", o.tag, " rank ", rank, "/", size));
  return std::unique_ptr<Communicator>(
      new CpuCommunicator(this, id, o.tag, rank, size, std::move(b)));
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CpuCommDriver::InitRanks(
    const std::string& id, const std::vector<int>& ranks, int size,
    const std::vector<std::string>& devices, const CommInitOptions& o) {
  // Every rank's bootstrap waits for the others, so the ranks of one process connect in parallel
  // (as ncclGroupStart/End lets NCCL do).
  std::vector<absl::StatusOr<std::unique_ptr<Communicator>>> got(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      CommInitOptions oi = o;
      oi.device = devices[i];
      got[i] = InitRank(id, ranks[i], size, oi);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> out;
  for (auto& g : got) {
    if (!g.ok()) return g.status();
    out.push_back(std::move(*g));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuCommDriver::Split(Communicator& parent, int color,
                                                                   int key,
                                                                   const CommInitOptions& o) {
  auto& p = static_cast<CpuCommunicator&>(parent);
  const int n = p.NextSplit();
  const std::string base = absl::StrCat("cpucomm/", p.id(), "/split", n, "/");
  RETURN_IF_ERROR(rdzv_->Set(absl::StrCat(base, p.rank()), absl::StrCat(color, " ", key)));
  if (color < 0) {
    Note(absl::StrCat("split ", o.tag, " not a member"));
    return nullptr;
  }
  std::vector<std::pair<int64_t, int>> order;
  for (int r = 0; r < p.size(); ++r) {
    absl::StatusOr<std::string> v = rdzv_->Get(absl::StrCat(base, r), o.timeout);
    if (!v.ok()) {
      return base::Annotate(v.status(), absl::StrCat("split '", o.tag, "': rank ", r,
                                                     " of the parent did not take part"));
    }
    std::vector<std::string> f = absl::StrSplit(*v, ' ');
    int64_t c = -1, k = 0;
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &c) || !absl::SimpleAtoi(f[1], &k)) {
      return absl::InternalError(absl::StrCat("split: bad entry '", *v, "' of rank ", r));
    }
    if (c == color) order.emplace_back(k, r);
  }
  std::sort(order.begin(), order.end());
  int new_rank = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].second == p.rank()) new_rank = static_cast<int>(i);
  return InitRank(absl::StrCat(p.id(), ".s", n, ".c", color), new_rank,
                  static_cast<int>(order.size()), o);
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuCommDriver::Shrink(
    Communicator& parent, const std::vector<int>& excluded, const CommInitOptions& o) {
  auto& p = static_cast<CpuCommunicator&>(parent);
  std::vector<int> ex = excluded;
  std::sort(ex.begin(), ex.end());
  int new_rank = p.rank();
  for (int e : ex)
    if (e < p.rank()) --new_rank;
  Note(absl::StrCat("shrink ", o.tag, " excluding ", absl::StrJoin(ex, ",")));
  return InitRank(absl::StrCat(p.id(), ".shrink", p.NextShrink(), ".x", absl::StrJoin(ex, "_")),
                  new_rank, p.size() - static_cast<int>(ex.size()), o);
}

absl::Status CpuCommDriver::GroupCollective(const std::vector<Communicator*>& comms,
                                            const std::vector<OpDesc>& ops) {
  std::vector<absl::Status> st(comms.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms.size(); ++i)
    threads.emplace_back([&, i] { st[i] = comms[i]->Collective(ops[i], nullptr); });
  for (auto& t : threads) t.join();
  for (auto& s : st) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

std::vector<std::string> CpuCommDriver::Log() const {
  absl::MutexLock l(&mu_);
  return log_;
}
void CpuCommDriver::Note(std::string line) {
  absl::MutexLock l(&mu_);
  log_.push_back(std::move(line));
}
void CpuCommDriver::InjectAsyncError(absl::Status s) {
  absl::MutexLock l(&mu_);
  injected_ = std::move(s);
}
absl::Status CpuCommDriver::injected() const {
  absl::MutexLock l(&mu_);
  return injected_;
}

}  // namespace ember::comm
