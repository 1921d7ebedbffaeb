#include "runtime/worker/replicas.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/keys.h"
#include "runtime/jobspec/enums.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
namespace {

// The payload: a meta block {step, optimizer_step, loader state length, loader state}, then every
// shard view's param, exp_avg and exp_avg_sq rows (fp32), in Shards() order.
constexpr int64_t kMetaBytes = 4096;
constexpr int64_t kMetaFixed = 24;

int64_t PayloadBytes(const std::vector<fsdp::ShardView>& views) {
  int64_t n = kMetaBytes;
  for (const auto& v : views) n += 3 * v.rows * v.row_numel * 4;
  return n;
}

// What the payload's layout is: world, rank and every view's name, shape and rows. A file with
// another fingerprint (another world size or sharding) is never restored from.
uint64_t Fingerprint(int rank, int world, const std::vector<fsdp::ShardView>& views) {
  std::string s = absl::StrCat("world=", world, ";rank=", rank, ";");
  for (const auto& v : views) {
    absl::StrAppend(&s, v.name, "[", absl::StrJoin(v.global_shape, ","), "]", v.row_begin, "+", v.rows, "x",
                    v.row_numel, ";");
  }
  return ReplicaChecksum(s.data(), s.size());
}

// A job id as a path component: refused unless [A-Za-z0-9._-] and not "." / "..".
absl::Status CheckComponent(const std::string& what, const std::string& id) {
  bool ok = !id.empty() && id.size() <= 200 && id != "." && id != "..";
  for (char c : id) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " '", id, "' cannot name a replica directory: use [A-Za-z0-9._-], or set ",
                                                 job::kEnvReplicaDir));
}

// Copies n bytes, calling `hook` halfway (tests kill the process there).
void CopyWithHook(uint8_t* dst, const uint8_t* src, size_t n, const std::function<void(const std::string&)>& hook,
                  const std::string& stage) {
  const size_t half = n / 2;
  std::memcpy(dst, src, half);
  if (hook) hook(stage);
  std::memcpy(dst + half, src + half, n - half);
}

}  // namespace

int Replicas::BuddyOf(int rank, int world, int local_world) {
  if (world <= 1) return rank;
  const int stride = world > local_world && local_world > 0 ? local_world : 1;
  return (rank + stride) % world;
}

absl::StatusOr<std::unique_ptr<Replicas>> Replicas::Open(const Plan& plan, store::Client& attempt, TrainState& state) {
  const auto& ft = plan.spec.fault_tolerance();
  if (spec::ReplicaModeOf(plan.spec) != spec::ReplicaMode::kMemory) return nullptr;
  Options o;
  o.dir = plan.env.replica_dir;
  if (o.dir.empty()) {
    RETURN_IF_ERROR(CheckComponent(job::kEnvJobId, plan.env.job_id));
    o.dir = absl::StrCat("/dev/shm/ember-", geteuid(), "/standalone/", plan.env.job_id);
  }
  o.rank = plan.env.rank;
  o.world = plan.env.world_size;
  o.local_world = plan.env.local_world_size;
  o.every_steps = std::max(1, ft.every_steps());
  o.attempt = &attempt;
  o.timeout = absl::Seconds(std::max(1, plan.spec.collective_timeout_s()));
  return Open(o, state);
}

absl::StatusOr<std::unique_ptr<Replicas>> Replicas::Open(const Options& o, TrainState& state) {
  RETURN_IF_ERROR(state.SyncHost());
  const std::vector<fsdp::ShardView> views = state.Shards();
  const int64_t payload = PayloadBytes(views);
  const uint64_t fp = Fingerprint(o.rank, o.world, views);
  ASSIGN_OR_RETURN(int dirfd, OpenReplicaDir(o.dir));
  const int buddy = BuddyOf(o.rank, o.world, o.local_world);
  const bool cross_host = o.attempt != nullptr && o.world > o.local_world && buddy != o.rank;
  bool reset = false;
  // Across hosts the own file keeps three steps: the other ranks can save step s+1 while a rank's
  // buddy copy of step s is still in flight (it holds s-1 and s-2 then), and the newest step every
  // rank has somewhere must still be in every own file.
  auto own = ReplicaFile::Open(dirfd, ReplicaFileName(o.rank, -1), payload, fp, &reset, cross_host ? 3 : 2);
  if (!own.ok()) {
    close(dirfd);
    return base::Annotate(own.status(), "fault_tolerance.replicas");
  }
  std::unique_ptr<ReplicaFile> copy;
  if (buddy != o.rank && !cross_host) {
    auto c = ReplicaFile::Open(dirfd, ReplicaFileName(o.rank, buddy), payload, fp);
    if (!c.ok()) {
      close(dirfd);
      return base::Annotate(c.status(), "fault_tolerance.replicas");
    }
    copy = std::move(*c);
  }
  auto r = std::unique_ptr<Replicas>(new Replicas(o, dirfd, payload, fp, std::move(*own), std::move(copy)));
  r->held_for_ = cross_host ? ((o.rank - o.local_world) % o.world + o.world) % o.world : -1;
  r->OpenOtherCopies(cross_host);
  if (cross_host) RETURN_IF_ERROR(base::Annotate(r->SetUpCrossHost(), "fault_tolerance.replicas (cross-host)"));
  const bool multi_host = o.world > o.local_world;
  std::string covers;
  if (buddy == o.rank) {
    covers = "none (one rank): covers a lost process only";
  } else if (cross_host) {
    covers = absl::StrCat(
        "on another host, which holds the copy in its /dev/shm (one-sided puts): covers a lost process or a lost "
        "host, not this host and the buddy's lost together (then disk checkpoints); this rank holds rank ",
        r->held_for_, "'s copy");
  } else if (multi_host) {
    covers = "on another host, but without the attempt's store the copy stays in this host's /dev/shm: covers a "
             "lost process, not a lost host";
  } else {
    covers = "on this host: covers a lost process, not a lost host";
  }
  spdlog::info("in-memory replicas every {} step(s) in {}: {} bytes per copy, {} bytes of /dev/shm for rank {} "
               "(own snapshot{}); buddy rank {}: {}",
               o.every_steps, o.dir, payload, r->counts_.memory_bytes, o.rank,
               buddy == o.rank ? ", double-buffered"
               : cross_host    ? " + the copy held for another rank, double-buffered"
                               : " + the buddy's copy, double-buffered",
               buddy, covers);
  return r;
}

namespace {

std::string AgentName(int rank) { return absl::StrCat("replica", rank); }

// "rank-<r>.buddy-<h>" -> (r, h); "rank-<r>.own" -> (r, -1).
bool ParseCopyName(const char* name, int* r, int* h) {
  int n = 0;
  if (std::sscanf(name, "rank-%d.buddy-%d%n", r, h, &n) == 2 && name[n] == '\0') {
    return *r >= 0 && *h >= 0 && ReplicaFileName(*r, *h) == name;
  }
  *h = -1;
  n = 0;
  return std::sscanf(name, "rank-%d.own%n", r, &n) == 1 && name[n] == '\0' && *r >= 0 && ReplicaFileName(*r, -1) == name;
}

}  // namespace

void Replicas::OpenOtherCopies(bool cross_host) {
  // Copies in this directory that no current writer owns: this rank's state copied by another
  // holder (a host that held it in an earlier placement), and, cross-host, other ranks' state held
  // here earlier, their buddy copies or their own files (ranks placed elsewhere this attempt; a
  // rank that ran here before keeps its own file here): SetUpCrossHost publishes the newest per rank.
  int fd = dup(dirfd_);
  DIR* d = fd < 0 ? nullptr : fdopendir(fd);
  if (d == nullptr) {
    if (fd >= 0) close(fd);
    return;
  }
  const std::string mine_local = copy_ ? copy_->name() : "";
  const std::string mine_held = cross_host ? ReplicaFileName(held_for_, opts_.rank) : "";
  while (dirent* e = readdir(d)) {
    int r, h;
    if (!ParseCopyName(e->d_name, &r, &h) || e->d_name == mine_local || e->d_name == mine_held) continue;
    if (r == opts_.rank && h < 0) continue;  // own_
    // A rank of this host (ranks are placed in blocks of local_world) keeps its own file here, and
    // another rank of this host reopens the copies it holds itself.
    const int host = opts_.rank / opts_.local_world;
    if (h < 0 && (!cross_host || r / opts_.local_world == host)) continue;
    if (r != opts_.rank && h >= 0 && h != opts_.rank && h / opts_.local_world == host) continue;
    if (r == opts_.rank) {
      auto f = ReplicaFile::OpenExisting(dirfd_, e->d_name, payload_, fingerprint_);
      if (f.ok() && !(*f)->Committed().empty()) local_copies_.push_back(std::move(*f));
    } else if (cross_host) {
      auto f = ReplicaFile::OpenHeld(dirfd_, e->d_name);
      if (!f.ok() || (*f)->Committed().empty()) continue;
      HeldCopy* same = nullptr;
      for (HeldCopy& x : held_) same = x.rank == r ? &x : same;
      if (same == nullptr) {
        held_.push_back({r, std::move(*f), {}});
      } else if ((*f)->Committed().front().step > same->file->Committed().front().step) {
        same->file = std::move(*f);
      }
    }
  }
  closedir(d);
}

absl::Status Replicas::SetUpCrossHost() {
  store::Client& attempt = *opts_.attempt;
  onesided::AgentOptions ao;
  ao.store = &attempt;
  ao.key_prefix = std::string(job::keys::kReplicaOnesided);
  ao.name = AgentName(opts_.rank);
  ao.rank = opts_.rank;
  ao.connect_timeout = opts_.timeout;
  ASSIGN_OR_RETURN(agent_, onesided::Agent::Create(ao));
  ASSIGN_OR_RETURN(own_reg_, agent_->RegisterMemory(own_->base(), static_cast<uint64_t>(own_->file_bytes())));
  scratch_.assign(4096, 0);
  ASSIGN_OR_RETURN(scratch_reg_, agent_->RegisterMemory(scratch_.data(), scratch_.size()));
  // The copy this rank holds for held_for_: created from the layout that rank publishes.
  RETURN_IF_ERROR(attempt.Set(job::keys::ReplicaLayoutOf(opts_.rank), absl::StrCat(payload_, ":", fingerprint_)));
  auto layout_of = [&](int rank) -> absl::StatusOr<std::pair<int64_t, uint64_t>> {
    const std::string key = job::keys::ReplicaLayoutOf(rank);
    RETURN_IF_ERROR(attempt.Wait({key}, opts_.timeout));
    ASSIGN_OR_RETURN(std::string layout, attempt.Get(key));
    std::pair<int64_t, uint64_t> out;
    std::pair<std::string, std::string> pf = absl::StrSplit(layout, absl::MaxSplits(':', 1));
    if (!absl::SimpleAtoi(pf.first, &out.first) || !absl::SimpleAtoi(pf.second, &out.second) || out.first <= 0) {
      return absl::DataLossError(absl::StrCat("rank ", rank, " published replica layout '", layout, "' under ", key,
                                              ", not payload_bytes:fingerprint"));
    }
    return out;
  };
  // Copies held from an earlier placement count only when they have their rank's layout now
  // (another world size or sharding: never restored, so not offered).
  for (size_t i = 0; i < held_.size();) {
    bool keep = held_[i].rank < opts_.world;
    if (keep && held_[i].rank != held_for_) {
      ASSIGN_OR_RETURN(const auto l, layout_of(held_[i].rank));
      keep = held_[i].file->payload_bytes() == l.first && held_[i].file->fingerprint() == l.second;
    }
    if (keep) {
      ++i;
    } else {
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  ASSIGN_OR_RETURN(const auto held_layout, layout_of(held_for_));
  const int64_t payload = held_layout.first;
  const uint64_t fp = held_layout.second;
  ASSIGN_OR_RETURN(std::unique_ptr<ReplicaFile> primary,
                   ReplicaFile::Open(dirfd_, ReplicaFileName(held_for_, opts_.rank), payload, fp));
  // An older holder's copy of the same rank (an earlier placement) that is newer than this file
  // and of the same layout is kept instead: the writer then puts into it (the key names the region,
  // not the file), and the resume can use its newest step.
  HeldCopy* same = nullptr;
  for (HeldCopy& x : held_) same = x.rank == held_for_ ? &x : same;
  if (same == nullptr) {
    held_.push_back({held_for_, std::move(primary), {}});
  } else {
    const std::vector<ReplicaFile::Slot> p = primary->Committed();
    const bool keep_older = same->file->payload_bytes() == payload && same->file->fingerprint() == fp &&
                            (p.empty() || p.front().step < same->file->Committed().front().step);
    if (!keep_older) same->file = std::move(primary);
  }
  for (HeldCopy& h : held_) {
    ASSIGN_OR_RETURN(h.reg, agent_->RegisterMemory(h.file->base(), static_cast<uint64_t>(h.file->file_bytes())));
    counts_.memory_bytes += h.file->file_bytes();
  }
  for (const HeldCopy& h : held_) {
    RETURN_IF_ERROR(attempt.Set(job::keys::ReplicaHeldOf(h.rank, opts_.rank), h.reg.descriptor));
  }
  drain_ = std::thread([this] {
    while (!stop_.load()) {
      absl::StatusOr<onesided::Notification> n = agent_->WaitNotification(absl::Milliseconds(200), onesided::WaitStyle::kBlock);
      if (!n.ok() && !absl::IsDeadlineExceeded(n.status())) absl::SleepFor(absl::Milliseconds(50));
    }
  });
  return absl::OkStatus();
}
Replicas::Replicas(const Options& o, int dirfd, int64_t payload, uint64_t fingerprint, std::unique_ptr<ReplicaFile> own,
                   std::unique_ptr<ReplicaFile> copy)
    : opts_(o), dirfd_(dirfd), payload_(payload), fingerprint_(fingerprint),
      buddy_(BuddyOf(o.rank, o.world, o.local_world)), every_steps_(std::max<int64_t>(1, o.every_steps)),
      own_(std::move(own)), copy_(std::move(copy)) {
  counts_.memory_bytes = own_->file_bytes() + (copy_ ? copy_->file_bytes() : 0);
}

Replicas::~Replicas() {
  (void)Wait();
  stop_.store(true);
  if (drain_.joinable()) drain_.join();
  agent_.reset();  // before the files it registered are unmapped
  close(dirfd_);
}

absl::Status Replicas::Wait() {
  if (transfer_.joinable()) {
    transfer_.join();
    if (transfer_status_.ok()) counts_.committed_step = in_flight_;
  }
  absl::Status st = transfer_status_;
  transfer_status_ = absl::OkStatus();
  return st;
}

absl::Status Replicas::Save(int64_t step, TrainState& state, const data::TokenLoader& loader) {
  const absl::Time t0 = absl::Now();
  RETURN_IF_ERROR(Wait());
  const std::vector<fsdp::ShardView> views = state.Shards();
  if (PayloadBytes(views) != payload_) {
    return absl::InternalError(absl::StrCat("in-memory replicas: the state's layout changed (", PayloadBytes(views),
                                            " bytes, opened for ", payload_, ")"));
  }
  const std::string ls = loader.SaveState();
  if (static_cast<int64_t>(ls.size()) > kMetaBytes - kMetaFixed) {
    return absl::InternalError(absl::StrCat("in-memory replicas: data loader state of ", ls.size(), " bytes exceeds ",
                                            kMetaBytes - kMetaFixed));
  }
  const int slot = own_->BeginWrite();
  uint8_t* dst = own_->slot(slot);
  const int64_t meta[3] = {step, state.optimizer_step(), static_cast<int64_t>(ls.size())};
  std::memcpy(dst, meta, sizeof meta);
  std::memcpy(dst + kMetaFixed, ls.data(), ls.size());
  int64_t off = kMetaBytes;
  for (size_t i = 0; i < views.size(); ++i) {
    if (i == views.size() / 2 && opts_.test_hook) opts_.test_hook("own");
    const auto& v = views[i];
    const size_t n = static_cast<size_t>(v.rows * v.row_numel) * 4;
    for (const float* p : {v.param, v.exp_avg, v.exp_avg_sq}) {
      if (n > 0) std::memcpy(dst + off, p, n);
      off += static_cast<int64_t>(n);
    }
  }
  const uint64_t sum = ReplicaChecksum(dst, static_cast<size_t>(payload_));
  own_->Commit(slot, step, sum);
  transfer_ = std::thread([this, slot, step, sum] { Transfer(slot, step, sum); });
  in_flight_ = step;
  counts_.save_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return absl::OkStatus();
}

void Replicas::Transfer(int own_slot, int64_t step, uint64_t sum) {
  if (agent_ != nullptr) {
    transfer_status_ = PutToBuddy(own_slot, step, sum);
    return;
  }
  const uint8_t* src = own_->data(own_slot);
  if (copy_ == nullptr) return;
  // The buddy's copy: complete bytes first, then its commit record (a crash in between leaves the
  // slot uncommitted and the buddy's other slot, the previous step, intact).
  const int c = copy_->BeginWrite();
  CopyWithHook(copy_->slot(c), src, static_cast<size_t>(payload_), opts_.test_hook, "buddy");
  copy_->Commit(c, step, sum);
}

absl::Status Replicas::PutToBuddy(int own_slot, int64_t step, uint64_t sum) {
  onesided::Connection* c = conns_.count(buddy_) ? conns_[buddy_] : nullptr;
  if (c == nullptr) {
    return absl::FailedPreconditionError("in-memory replicas: Save before Connect (ResumeFromReplicas connects)");
  }
  const auto style = onesided::WaitStyle::kBlock;  // beside the next step's compute
  // Every put issued before is visible in the buddy's memory once this completes (agent.h: Notify
  // flushes the endpoint first), so each stage lands before the next one starts.
  auto flush = [&]() -> absl::Status {
    return base::Annotate(agent_->Notify(c, "replica").Wait(opts_.timeout, style),
                          absl::StrCat("in-memory replicas: flushing step ", step, " to buddy rank ", buddy_));
  };
  const int s = buddy_newest_ < 0 ? 0 : 1 - buddy_newest_;
  const uint64_t rec = static_cast<uint64_t>(ReplicaFile::RecordOffset(s));
  constexpr uint64_t kRec = ReplicaFile::kRecordBytes;
  const uint64_t n = static_cast<uint64_t>(payload_), half = n / 2;
  const uint64_t src = static_cast<uint64_t>(ReplicaFile::SlotOffset(payload_, own_slot));
  const uint64_t dst = static_cast<uint64_t>(ReplicaFile::SlotOffset(payload_, s));
  // 1. The target slot's commit record cleared and the payload (two puts, the test hook between
  //    them); the other slot (the previous step) is untouched. A writer that dies here leaves the
  //    slot uncommitted (and a reader verifies the checksum of every committed slot anyway).
  ReplicaFile::PackRecord(scratch_.data(), false, 0, 0);
  const std::string what = absl::StrCat("in-memory replicas: putting step ", step, " to buddy rank ", buddy_);
  onesided::Work first = agent_->Put(c, {{scratch_reg_.id, 0, kRec}, {own_reg_.id, src, half}},
                                     {{buddy_region_, rec, kRec}, {buddy_region_, dst, half}});
  if (opts_.test_hook) {  // tests: the hook sees the first half in the buddy's memory
    RETURN_IF_ERROR(base::Annotate(first.Wait(opts_.timeout, style), what));
    RETURN_IF_ERROR(flush());
    opts_.test_hook("buddy");
  }
  onesided::Work second = agent_->Put(c, {{own_reg_.id, src + half, n - half}}, {{buddy_region_, dst + half, n - half}});
  // 2. Only once all of it is in the buddy's memory: the commit record (step, checksum,
  //    committed = 1), flushed too, so a committed transfer is one the buddy holds. (Two waits that
  //    block: each costs a wake-up, which on a loaded machine is most of a transfer's time.)
  RETURN_IF_ERROR(flush());
  RETURN_IF_ERROR(base::Annotate(first.Wait(opts_.timeout, style), what));
  RETURN_IF_ERROR(base::Annotate(second.Wait(opts_.timeout, style), what));
  ReplicaFile::PackRecord(scratch_.data() + kRec, true, step, sum);
  onesided::Work commit = agent_->Put(c, {{scratch_reg_.id, kRec, kRec}}, {{buddy_region_, rec, kRec}});
  RETURN_IF_ERROR(flush());
  RETURN_IF_ERROR(base::Annotate(commit.Wait(opts_.timeout, style), what));
  buddy_newest_ = s;
  return absl::OkStatus();
}

std::vector<int64_t> Replicas::Available() const {
  std::set<int64_t, std::greater<>> steps;
  for (const auto& s : own_->Committed()) steps.insert(s.step);
  if (copy_) {
    for (const auto& s : copy_->Committed()) steps.insert(s.step);
  }
  for (const auto& f : local_copies_) {
    for (const auto& s : f->Committed()) steps.insert(s.step);
  }
  return {steps.begin(), steps.end()};
}

std::map<int, std::vector<int64_t>> Replicas::Held() const {
  std::map<int, std::vector<int64_t>> out;
  for (const HeldCopy& h : held_) {
    for (const auto& s : h.file->Committed()) out[h.rank].push_back(s.step);
  }
  return out;
}

absl::StatusOr<onesided::RemoteRegion> Replicas::ImportHeld(int rank, int holder) {
  const std::string key = job::keys::ReplicaHeldOf(rank, holder);
  RETURN_IF_ERROR(base::Annotate(opts_.attempt->Wait({key}, opts_.timeout),
                                 absl::StrCat("in-memory replicas: rank ", holder, "'s copy of rank ", rank)));
  ASSIGN_OR_RETURN(std::optional<std::string> desc, opts_.attempt->Get(key));
  if (!desc.has_value()) return absl::UnavailableError(absl::StrCat("in-memory replicas: ", key, " vanished"));
  return conns_.at(holder)->ImportRegion(*desc);
}

absl::StatusOr<std::vector<ReplicaFile::Slot>> Replicas::RemoteRecords(onesided::Connection* c,
                                                                      onesided::RemoteRegion region) {
  constexpr uint64_t kRec = ReplicaFile::kRecordBytes;
  const uint64_t at = 3 * kRec;  // scratch bytes not used by PutToBuddy
  RETURN_IF_ERROR(agent_->Get(c, {{scratch_reg_.id, at, 2 * kRec}},
                              {{region, static_cast<uint64_t>(ReplicaFile::RecordOffset(0)), 2 * kRec}})
                      .Wait(opts_.timeout));
  std::vector<ReplicaFile::Slot> out;
  for (int i = 0; i < 2; ++i) {
    if (auto s = ReplicaFile::ParseRecord(scratch_.data() + at + i * kRec, i)) out.push_back(*s);
  }
  if (out.size() == 2 && out[1].step > out[0].step) std::swap(out[0], out[1]);
  return out;
}

absl::Status Replicas::Connect(const ReplicaAgreement& a) {
  if (agent_ == nullptr) return absl::OkStatus();
  auto it = a.pull_from.find(opts_.rank);
  pull_from_ = it == a.pull_from.end() ? -1 : it->second;
  std::set<int> peers = {buddy_, held_for_};
  if (pull_from_ >= 0) peers.insert(pull_from_);
  for (const auto& [r, h] : a.pull_from) {
    if (h == opts_.rank) peers.insert(r);
  }
  peers.erase(opts_.rank);
  // Ascending order on every rank: two ranks that wait on each other are each other's next peer.
  for (int p : peers) {
    ASSIGN_OR_RETURN(conns_[p], agent_->Connect(AgentName(p)));
  }
  ASSIGN_OR_RETURN(buddy_region_, ImportHeld(opts_.rank, buddy_));
  ASSIGN_OR_RETURN(std::vector<ReplicaFile::Slot> recs, RemoteRecords(conns_.at(buddy_), buddy_region_));
  buddy_newest_ = recs.empty() ? -1 : recs.front().index;
  return absl::OkStatus();
}

absl::Status Replicas::PullFromHolder(int64_t step) {
  const absl::Time t0 = absl::Now();
  onesided::Connection* c = conns_.at(pull_from_);
  ASSIGN_OR_RETURN(onesided::RemoteRegion region, ImportHeld(opts_.rank, pull_from_));
  ASSIGN_OR_RETURN(std::vector<ReplicaFile::Slot> recs, RemoteRecords(c, region));
  std::optional<ReplicaFile::Slot> slot;
  for (const auto& r : recs) slot = r.step == step ? std::optional<ReplicaFile::Slot>(r) : slot;
  if (!slot) {
    return absl::NotFoundError(absl::StrCat("in-memory replicas: holder rank ", pull_from_, " has no committed copy of rank ",
                                            opts_.rank, "'s step ", step, " any more"));
  }
  // Into this rank's own file (its free slot), verified, then committed there: the own copy from now on.
  const int mine = own_->BeginWrite();
  const uint64_t n = static_cast<uint64_t>(payload_);
  RETURN_IF_ERROR(agent_->Get(c, {{own_reg_.id, static_cast<uint64_t>(ReplicaFile::SlotOffset(payload_, mine)), n}},
                              {{region, static_cast<uint64_t>(ReplicaFile::SlotOffset(payload_, slot->index)), n}})
                      .Wait(opts_.timeout));
  if (ReplicaChecksum(own_->slot(mine), n) != slot->checksum) {
    return absl::DataLossError(absl::StrCat("in-memory replicas: the copy of step ", step, " pulled from rank ", pull_from_,
                                            " does not match its checksum (overwritten while read?)"));
  }
  own_->Commit(mine, step, slot->checksum);
  counts_.from_network = true;
  counts_.network_bytes += static_cast<int64_t>(n);
  spdlog::info("in-memory replicas: rank {} pulled step {} ({} bytes) from buddy rank {}'s host in {}", opts_.rank, step,
               n, pull_from_, absl::FormatDuration(absl::Now() - t0));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Replicas::Restore(int64_t step, TrainState& state, data::TokenLoader& loader) {
  RETURN_IF_ERROR(Wait());
  const ReplicaFile* file = own_.get();
  std::optional<ReplicaFile::Slot> s = own_->Find(step);
  std::string from = "own";
  std::vector<const ReplicaFile*> local;
  if (copy_) local.push_back(copy_.get());
  for (const auto& f : local_copies_) local.push_back(f.get());
  for (const ReplicaFile* f : local) {
    if (s) break;
    s = f->Find(step);
    file = f;
    int r, h;
    from = ParseCopyName(f->name().c_str(), &r, &h) ? absl::StrCat("buddy rank ", h, "'s") : "buddy";
  }
  if (!s && agent_ != nullptr && pull_from_ >= 0) {
    RETURN_IF_ERROR(PullFromHolder(step));
    file = own_.get();
    s = own_->Find(step);
    from = absl::StrCat("buddy rank ", pull_from_, "'s");
  }
  if (!s) {
    return absl::NotFoundError(absl::StrCat("rank ", opts_.rank, " holds no committed replica of step ", step,
                                            " (own or buddy copy)"));
  }
  const uint8_t* src = file->data(s->index);
  int64_t meta[3];
  std::memcpy(meta, src, sizeof meta);
  if (meta[0] != step || meta[2] < 0 || meta[2] > kMetaBytes - kMetaFixed) {
    return absl::DataLossError(absl::StrCat(file->name(), ": slot of step ", step, " holds step ", meta[0]));
  }
  RETURN_IF_ERROR(loader.RestoreState(absl::string_view(reinterpret_cast<const char*>(src) + kMetaFixed,
                                                        static_cast<size_t>(meta[2]))));
  int64_t off = kMetaBytes;
  for (const auto& v : state.Shards()) {
    const size_t n = static_cast<size_t>(v.rows * v.row_numel) * 4;
    for (float* p : {v.param, v.exp_avg, v.exp_avg_sq}) {
      if (n > 0) std::memcpy(p, src + off, n);
      off += static_cast<int64_t>(n);
    }
  }
  state.set_optimizer_step(meta[1]);
  return from;
}

absl::StatusOr<ReplicaAgreement> AgreeReplicaStep(store::Client& attempt, int rank, int world,
                                                  const std::vector<int64_t>& mine, int64_t disk_step,
                                                  absl::Duration timeout,
                                                  const std::map<int, std::vector<int64_t>>& held) {
  std::vector<std::string> held_parts;
  for (const auto& [r, steps] : held) held_parts.push_back(absl::StrCat(r, ":", absl::StrJoin(steps, ".")));
  RETURN_IF_ERROR(attempt.Set(job::keys::ReplicasOf(rank), absl::StrCat("disk=", disk_step, ";", absl::StrJoin(mine, ","),
                                                                        ";", absl::StrJoin(held_parts, "/"))));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(job::keys::ReplicasOf(r));
  RETURN_IF_ERROR(attempt.Wait(keys, timeout));
  ASSIGN_OR_RETURN(auto values, attempt.MultiGet(keys));
  ReplicaAgreement out;
  std::vector<std::set<int64_t>> local(world);                  // rank -> steps it holds itself
  std::vector<std::map<int64_t, int>> remote(world);            // rank -> step -> lowest holder
  for (int r = 0; r < world; ++r) {
    if (!values[r].has_value()) return absl::UnavailableError(absl::StrCat("replicas: rank ", r, "'s steps vanished"));
    auto bad = [&](const char* what) {
      return absl::DataLossError(absl::StrCat("replicas: rank ", r, " published '", *values[r], "', ", what));
    };
    std::vector<absl::string_view> parts = absl::StrSplit(*values[r], absl::MaxSplits(';', 2));
    int64_t d = 0;
    absl::string_view disk = parts[0];
    if (parts.size() < 2 || !absl::ConsumePrefix(&disk, "disk=") || !absl::SimpleAtoi(disk, &d)) {
      return bad("not disk=N;steps[;held]");
    }
    out.disk_step = std::max(out.disk_step, d);
    for (absl::string_view t : absl::StrSplit(parts[1], ',', absl::SkipEmpty())) {
      int64_t st;
      if (!absl::SimpleAtoi(t, &st)) return bad("not steps");
      local[r].insert(st);
    }
    if (parts.size() < 3) continue;
    for (absl::string_view entry : absl::StrSplit(parts[2], '/', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> rs = absl::StrSplit(entry, absl::MaxSplits(':', 1));
      int of;
      if (!absl::SimpleAtoi(rs.first, &of) || of < 0 || of >= world) return bad("not held rank:steps");
      for (absl::string_view t : absl::StrSplit(rs.second, '.', absl::SkipEmpty())) {
        int64_t st;
        if (!absl::SimpleAtoi(t, &st)) return bad("not held steps");
        remote[of].emplace(st, r);  // ranks in ascending order: the first holder stays
      }
    }
  }
  std::set<int64_t> common;
  for (int r = 0; r < world; ++r) {
    std::set<int64_t> theirs = local[r];
    for (const auto& [st, h] : remote[r]) theirs.insert(st);
    if (r == 0) {
      common = std::move(theirs);
      continue;
    }
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::inserter(both, both.end()));
    common = std::move(both);
  }
  out.step = common.empty() ? -1 : *common.rbegin();
  if (out.step > 0) {
    for (int r = 0; r < world; ++r) {
      if (!local[r].count(out.step)) out.pull_from[r] = remote[r].at(out.step);
    }
  }
  return out;
}

absl::StatusOr<std::optional<int64_t>> ResumeFromReplicas(const Plan& plan, store::Client& attempt,
                                                          Replicas& replicas, TrainState& state,
                                                          data::TokenLoader& loader) {
  const absl::Time t0 = absl::Now();
  const std::vector<int64_t> mine = replicas.Available();
  // Every rank publishes the disk checkpoints it sees too (directory names only), so all take the
  // same path: memory unless a disk checkpoint is newer than the agreed step.
  const std::vector<int64_t> disk = ckpt::ListSteps(plan.checkpoint_root);
  const int64_t disk_step = disk.empty() ? 0 : disk.back();
  ASSIGN_OR_RETURN(const ReplicaAgreement a,
                   AgreeReplicaStep(attempt, plan.env.rank, plan.env.world_size, mine, disk_step,
                                    absl::Seconds(plan.spec.collective_timeout_s()), replicas.Held()));
  // Cross-host: the agents pair up whatever path is taken (Save needs the buddy's region).
  RETURN_IF_ERROR(replicas.Connect(a));
  const int64_t agreed = a.step;
  if (agreed <= 0) {
    spdlog::info("in-memory replicas: no step that every rank holds (rank {} holds [{}]): resuming from disk "
                 "checkpoints, if any",
                 plan.env.rank, absl::StrJoin(mine, ","));
    return std::optional<int64_t>();
  }
  if (a.disk_step > agreed) {
    spdlog::info("in-memory replicas: every rank holds step {}, but the disk checkpoint of step {} is newer: "
                 "resuming from disk",
                 agreed, a.disk_step);
    return std::optional<int64_t>();
  }
  ASSIGN_OR_RETURN(const std::string from, replicas.Restore(agreed, state, loader));
  ReplicaCounts& c = replicas.counts();
  c.from_memory = true;
  c.resumed_step = agreed;
  c.committed_step = agreed;
  spdlog::info("resumed from memory: the {} in-memory replica of step {} (optimizer step {}){} in {}; no disk "
               "checkpoint read",
               from, agreed, state.optimizer_step(),
               c.from_network ? ", pulled over the network from the buddy's host" : "",
               absl::FormatDuration(absl::Now() - t0));
  return std::optional<int64_t>(agreed);
}

}  // namespace ember::worker
