#include "runtime/worker/replicas.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
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

absl::StatusOr<std::unique_ptr<Replicas>> Replicas::Open(const Plan& plan, TrainState& state) {
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
  return Open(o, state);
}

absl::StatusOr<std::unique_ptr<Replicas>> Replicas::Open(const Options& o, TrainState& state) {
  RETURN_IF_ERROR(state.SyncHost());
  const std::vector<fsdp::ShardView> views = state.Shards();
  const int64_t payload = PayloadBytes(views);
  const uint64_t fp = Fingerprint(o.rank, o.world, views);
  ASSIGN_OR_RETURN(int dirfd, OpenReplicaDir(o.dir));
  const int buddy = BuddyOf(o.rank, o.world, o.local_world);
  bool reset = false;
  auto own = ReplicaFile::Open(dirfd, ReplicaFileName(o.rank, -1), payload, fp, &reset);
  if (!own.ok()) {
    close(dirfd);
    return base::Annotate(own.status(), "fault_tolerance.replicas");
  }
  std::unique_ptr<ReplicaFile> copy;
  if (buddy != o.rank) {
    auto c = ReplicaFile::Open(dirfd, ReplicaFileName(o.rank, buddy), payload, fp);
    if (!c.ok()) {
      close(dirfd);
      return base::Annotate(c.status(), "fault_tolerance.replicas");
    }
    copy = std::move(*c);
  }
  auto r = std::unique_ptr<Replicas>(new Replicas(o, dirfd, payload, fp, std::move(*own), std::move(copy)));
  const bool multi_host = o.world > o.local_world;
  spdlog::info("in-memory replicas every {} step(s) in {}: {} bytes per copy, {} bytes of /dev/shm for rank {} "
               "(own snapshot{}); buddy rank {}: {}",
               o.every_steps, o.dir, payload, r->counts_.memory_bytes, o.rank,
               buddy != o.rank ? " + the buddy's copy, double-buffered" : ", double-buffered", buddy,
               buddy == o.rank ? "none (one rank): covers a lost process only"
               : multi_host
                   ? "on another host, but this build keeps its copy in this host's /dev/shm: covers a lost "
                     "process, not a lost host"
                   : "on this host: covers a lost process, not a lost host");
  return r;
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
  close(dirfd_);
}

absl::Status Replicas::Wait() {
  if (transfer_.joinable()) {
    transfer_.join();
    counts_.committed_step = in_flight_;
  }
  return absl::OkStatus();
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
  const uint8_t* src = own_->data(own_slot);
  if (copy_ == nullptr) return;
  // The buddy's copy: complete bytes first, then its commit record (a crash in between leaves the
  // slot uncommitted and the buddy's other slot, the previous step, intact).
  const int c = copy_->BeginWrite();
  CopyWithHook(copy_->slot(c), src, static_cast<size_t>(payload_), opts_.test_hook, "buddy");
  copy_->Commit(c, step, sum);
}

std::vector<int64_t> Replicas::Available() const {
  std::set<int64_t, std::greater<>> steps;
  for (const auto& s : own_->Committed()) steps.insert(s.step);
  if (copy_) {
    for (const auto& s : copy_->Committed()) steps.insert(s.step);
  }
  return {steps.begin(), steps.end()};
}

absl::StatusOr<std::string> Replicas::Restore(int64_t step, TrainState& state, data::TokenLoader& loader) {
  RETURN_IF_ERROR(Wait());
  const ReplicaFile* file = own_.get();
  std::optional<ReplicaFile::Slot> s = own_->Find(step);
  std::string from = "own";
  if (!s && copy_) {
    s = copy_->Find(step);
    file = copy_.get();
    from = absl::StrCat("buddy rank ", buddy_, "'s");
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
                                                  absl::Duration timeout) {
  RETURN_IF_ERROR(attempt.Set(job::keys::ReplicasOf(rank), absl::StrCat("disk=", disk_step, ";", absl::StrJoin(mine, ","))));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(job::keys::ReplicasOf(r));
  RETURN_IF_ERROR(attempt.Wait(keys, timeout));
  ASSIGN_OR_RETURN(auto values, attempt.MultiGet(keys));
  std::set<int64_t> common(mine.begin(), mine.end());
  ReplicaAgreement out;
  for (int r = 0; r < world; ++r) {
    if (!values[r].has_value()) return absl::UnavailableError(absl::StrCat("replicas: rank ", r, "'s steps vanished"));
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(*values[r], absl::MaxSplits(';', 1));
    int64_t d = 0;
    if (!absl::ConsumePrefix(&kv.first, "disk=") || !absl::SimpleAtoi(kv.first, &d)) {
      return absl::DataLossError(absl::StrCat("replicas: rank ", r, " published '", *values[r], "', not disk=N;steps"));
    }
    out.disk_step = std::max(out.disk_step, d);
    std::set<int64_t> theirs;
    for (absl::string_view t : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
      int64_t s;
      if (!absl::SimpleAtoi(t, &s)) {
        return absl::DataLossError(absl::StrCat("replicas: rank ", r, " published '", *values[r], "', not steps"));
      }
      theirs.insert(s);
    }
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::inserter(both, both.end()));
    common = std::move(both);
  }
  out.step = common.empty() ? -1 : *common.rbegin();
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
                                    absl::Seconds(plan.spec.collective_timeout_s())));
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
  spdlog::info("resumed from memory: the {} in-memory replica of step {} (optimizer step {}) in {}; no disk "
               "checkpoint read",
               from, agreed, state.optimizer_step(), absl::FormatDuration(absl::Now() - t0));
  return std::optional<int64_t>(agreed);
}

}  // namespace ember::worker
