#include "runtime/worker/publisher.h"

#include <pthread.h>

#include <algorithm>
#include <map>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/keys.h"
#include "runtime/onesided/agent.h"
#include "runtime/worker/weights_protocol.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
namespace {

constexpr absl::Duration kAckTimeout = absl::Seconds(30);
constexpr absl::Duration kConnectTimeout = absl::Seconds(10);
constexpr absl::Duration kPollInterval = absl::Milliseconds(200);
constexpr absl::Duration kGraceAtExit = absl::Seconds(5);  // an in-flight publish at the end
// The publisher thread runs beside training: its onesided waits block at once (WaitStyle::kBlock)
// instead of spinning on a core the step needs; slices keep the exit grace honoured promptly.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(500);
constexpr onesided::WaitStyle kStyle = onesided::WaitStyle::kBlock;

class PublisherImpl : public Publisher {
 public:
  PublishCounts counts() const override {
    return {published_.load(), skipped_.load(), dropped_.load()};
  }
  PublisherImpl(const Plan& plan, store::Client& attempt, TrainState& model,
                std::unique_ptr<onesided::Agent> agent, onesided::Registration staging,
                std::vector<fsdp::ShardView> shards, std::vector<uint64_t> remote_offsets)
      : plan_(plan), attempt_(attempt), model_(model), agent_(std::move(agent)),
        staging_(std::move(staging)), shards_(std::move(shards)),
        remote_offsets_(std::move(remote_offsets)) {
    uint64_t off = 0;
    for (size_t i = 0; i < shards_.size(); ++i) {
      const uint64_t bytes = 4 * static_cast<uint64_t>(shards_[i].rows * shards_[i].row_numel);
      if (bytes > 0) {
        local_.push_back({staging_.id, off, bytes});
        remote_.push_back({{}, remote_offsets_[i], bytes});
      }
      staging_off_.push_back(off);
      off += bytes;
    }
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "ember-publish");  // for top -H and perf
      Run();
    });
  }

  ~PublisherImpl() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      stop_deadline_ = absl::Now() + kGraceAtExit;
    }
    thread_.join();
    WriteStats();
    spdlog::info("rank {}: weights published {} times, {} publish steps skipped, {} subscribers dropped; "
                 "the publish hook took {:.2f} ms on the training thread in all ({} publish steps, "
                 "longest {:.2f} ms); the publisher thread spent {:.2f} ms in puts and notifies and "
                 "{:.2f} ms waiting for acks",
                 plan_.env.rank, published_.load(), skipped_.load(), dropped_.load(),
                 absl::ToDoubleMilliseconds(hook_total_), hook_calls_, absl::ToDoubleMilliseconds(hook_max_),
                 absl::ToDoubleMilliseconds(put_total_), absl::ToDoubleMilliseconds(ack_total_));
  }

  // Until `n` subscribers are connected (the publisher thread discovers them) or `timeout` passes.
  void WaitForSubscribers(int n, absl::Duration timeout) {
    const absl::Time start = absl::Now();
    int have;
    {
      absl::MutexLock l(&mu_);
      auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return static_cast<int>(live_.size()) >= n; };
      mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
      have = static_cast<int>(live_.size());
    }
    if (have >= n) {
      spdlog::info("rank {}: {} weights subscriber(s) connected after {}; training starts", plan_.env.rank, have,
                   absl::FormatDuration(absl::Now() - start));
    } else {
      spdlog::warn("rank {}: publish.wait_for_subscribers is {} but {} connected within {}; training starts "
                   "anyway (raise publish.wait_timeout_s, or check that the subscribers reach this job's store)",
                   plan_.env.rank, n, have, absl::FormatDuration(timeout));
    }
  }

  absl::Status AtStep(int64_t step) override {
    if (step % plan_.spec.publish().every_steps() != 0) return absl::OkStatus();
    const absl::Time t0 = absl::Now();
    absl::Status st = Hook(step);
    const absl::Duration took = absl::Now() - t0;
    hook_total_ += took;
    hook_max_ = std::max(hook_max_, took);
    ++hook_calls_;
    return st;
  }

 private:
  // AtStep at a publish step: the agreement and, when publishing, the shard copy.
  absl::Status Hook(int64_t step) {
    bool ready, has_subscriber;
    {
      absl::MutexLock l(&mu_);
      has_subscriber = !live_.empty();
      ready = has_subscriber && job_ < 0;
    }
    // Every rank publishes the same steps (a subscriber needs every rank's shard of one step).
    ASSIGN_OR_RETURN(double agreed, model_.AllReduceMean(ready ? 1.0 : 0.0));
    if (agreed < 1.0) {
      if (has_subscriber) ++skipped_;
      return absl::OkStatus();
    }
    for (size_t i = 0; i < shards_.size(); ++i) {  // the step's weights, before the next update
      std::memcpy(static_cast<char*>(staging_.base) + staging_off_[i], shards_[i].param,
                  4 * static_cast<size_t>(shards_[i].rows * shards_[i].row_numel));
    }
    absl::MutexLock l(&mu_);
    job_ = step;
    return absl::OkStatus();
  }

  struct Subscriber {
    std::string name;
    onesided::Connection* conn = nullptr;
    onesided::RemoteRegion region;
  };

  void Run() {
    for (;;) {
      int64_t step;
      {
        absl::MutexLock l(&mu_);
        auto wake = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || job_ >= 0; };
        mu_.AwaitWithTimeout(absl::Condition(&wake), kPollInterval);
        if (job_ < 0 && stop_) return;
        step = job_;
      }
      if (step >= 0) {
        Publish(step);
        WriteStats();
        absl::MutexLock l(&mu_);
        job_ = -1;
      } else {
        Discover();
        DropFailed();
      }
    }
  }

  // Connects to subscribers that appeared under the attempt's weights/sub/ keys.
  void Discover() {
    store::CallOptions o;
    o.timeout = absl::Seconds(2);
    absl::StatusOr<std::vector<std::string>> keys = attempt_.ListKeys(job::keys::kWeightsSubscribers, o);
    if (!keys.ok()) return;
    for (const std::string& key : *keys) {
      const std::string name = key.substr(job::keys::kWeightsSubscribers.size());
      if (known_.count(name)) continue;
      known_.insert(name);
      absl::Status st = Connect(name, key);
      if (!st.ok()) spdlog::warn("rank {}: weights subscriber '{}' ignored: {}", plan_.env.rank, name, st.ToString());
    }
  }

  absl::Status Connect(const std::string& name, const std::string& key) {
    store::CallOptions o;
    o.timeout = absl::Seconds(2);
    ASSIGN_OR_RETURN(std::string descriptor, attempt_.Get(key, o));
    ASSIGN_OR_RETURN(onesided::Connection * conn, agent_->Connect(name));
    ASSIGN_OR_RETURN(onesided::RemoteRegion region, conn->ImportRegion(descriptor));
    spdlog::info("rank {}: weights subscriber '{}' connected", plan_.env.rank, name);
    absl::MutexLock l(&mu_);
    live_.push_back({name, conn, region});
    return absl::OkStatus();
  }

  // Drops subscribers whose connection failed while idle (UCX keepalive notices a dead peer), so a
  // rank that had nothing to publish does not keep a dead subscriber and skip for it forever.
  void DropFailed() {
    std::vector<Subscriber> subs;
    {
      absl::MutexLock l(&mu_);
      subs = live_;
    }
    for (const Subscriber& s : subs) {
      if (absl::Status h = s.conn->health(); !h.ok()) Drop(s.name, h);
    }
  }

  void Drop(const std::string& name, const absl::Status& why) {
    spdlog::warn("rank {}: weights subscriber '{}' dropped: {}", plan_.env.rank, name, why.ToString());
    ++dropped_;
    store::CallOptions o;
    o.timeout = absl::Seconds(2);
    (void)attempt_.Delete(job::keys::WeightsSubscriber(name), o);
    absl::MutexLock l(&mu_);
    for (auto it = live_.begin(); it != live_.end(); ++it) {
      if (it->name == name) {
        live_.erase(it);
        break;
      }
    }
  }

  // Put + notify to every subscriber, then their acks (never longer than kAckTimeout).
  void Publish(int64_t step) {
    std::vector<Subscriber> subs;
    {
      absl::MutexLock l(&mu_);
      subs = live_;
    }
    const absl::Time start = absl::Now(), deadline = start + kAckTimeout;
    std::set<std::string> pending;
    for (const Subscriber& s : subs) {
      std::vector<onesided::RemoteDesc> remote = remote_;
      for (auto& r : remote) r.region = s.region;
      absl::Status st = Await(agent_->Put(s.conn, local_, remote), deadline);
      if (st.ok()) st = Await(agent_->Notify(s.conn, StepMessage(step)), deadline);
      if (!st.ok()) {
        Drop(s.name, st);
      } else {
        pending.insert(s.name);
      }
    }
    if (!pending.empty()) ++published_;  // put + notify delivered to a subscriber
    const absl::Time sent = absl::Now();
    put_total_ += sent - start;
    struct AckTime {  // whichever way the wait below ends
      absl::Duration& total;
      absl::Time from;
      ~AckTime() { total += absl::Now() - from; }
    } ack_time{ack_total_, sent};
    while (!pending.empty()) {
      const absl::Time until = std::min(deadline, StopDeadline());
      if (absl::Now() >= until) {
        for (const std::string& name : pending) {
          Drop(name, absl::DeadlineExceededError(absl::StrCat("no ack for step ", step, " within ",
                                                              absl::FormatDuration(kAckTimeout))));
        }
        return;
      }
      absl::StatusOr<onesided::Notification> note =
          agent_->WaitNotification(std::min(until - absl::Now(), kWaitSlice), kStyle);
      if (note.ok()) {
        if (ParseMessage(note->message, "ack") == step) pending.erase(note->peer);
      } else if (absl::IsUnavailable(note.status())) {
        for (const Subscriber& s : subs) {
          if (pending.count(s.name) && !s.conn->health().ok()) {
            pending.erase(s.name);
            Drop(s.name, s.conn->health());
          }
        }
      }
    }
  }

  // The end of the exit grace once the Publisher is stopping, else the infinite future.
  absl::Time StopDeadline() {
    absl::MutexLock l(&mu_);
    return stop_ ? stop_deadline_ : absl::InfiniteFuture();
  }

  // w.Wait until `deadline` or the exit grace, whichever comes first (a subscriber that stopped
  // making progress must not hold the worker's exit for the full ack timeout).
  absl::Status Await(const onesided::Work& w, absl::Time deadline) {
    for (;;) {
      const absl::Time until = std::min(deadline, StopDeadline());
      absl::Status st = w.Wait(std::clamp(until - absl::Now(), absl::ZeroDuration(), kWaitSlice), kStyle);
      if (!absl::IsDeadlineExceeded(st) || absl::Now() >= until) return st;
    }
  }

  void WriteStats() {
    store::CallOptions o;
    o.timeout = absl::Seconds(2);
    (void)attempt_.Set(job::keys::WeightsStatsOf(plan_.env.rank),
                       absl::StrCat("published=", published_.load(), " skipped=", skipped_.load(),
                                    " dropped=", dropped_.load()), o);
  }

  const Plan& plan_;
  store::Client& attempt_;
  TrainState& model_;
  std::unique_ptr<onesided::Agent> agent_;
  const onesided::Registration staging_;
  const std::vector<fsdp::ShardView> shards_;
  const std::vector<uint64_t> remote_offsets_;
  std::vector<uint64_t> staging_off_;
  std::vector<onesided::LocalDesc> local_;
  std::vector<onesided::RemoteDesc> remote_;  // region filled per subscriber
  std::set<std::string> known_;               // publishing thread only
  std::atomic<int64_t> published_{0}, skipped_{0}, dropped_{0};
  // Time in the publish hook on the training thread (AtStep only, then the destructor), and on the
  // publisher thread in put + notify and in waiting for acks (that thread, then the destructor).
  absl::Duration hook_total_, hook_max_, put_total_, ack_total_;
  int64_t hook_calls_ = 0;
  absl::Mutex mu_;
  std::vector<Subscriber> live_ ABSL_GUARDED_BY(mu_);
  int64_t job_ ABSL_GUARDED_BY(mu_) = -1;  // the step being published, -1 when idle
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time stop_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Publisher>> StartPublisher(const Plan& plan, store::Client& attempt,
                                                          TrainState& model) {
  if (plan.spec.publish().every_steps() <= 0) return nullptr;
  const job::WorkerEnv& env = plan.env;
  std::vector<fsdp::ShardView> shards = model.Shards();
  // A copy another rank publishes (a pipeline's second wte, an HSDP replica) is left out.
  shards.erase(std::remove_if(shards.begin(), shards.end(), [](const fsdp::ShardView& v) { return !v.primary; }),
               shards.end());
  // The job's tensors: every rank's primary ones, in rank order, each name once (FSDP ranks all
  // hold every tensor's rows; a pipeline's stages hold different tensors). Exchanged through the
  // store once, so every rank computes the same manifest and offsets.
  WeightsManifest mine;
  mine.attempt = env.attempt;
  mine.world = env.world_size;
  for (const fsdp::ShardView& s : shards) mine.tensors.push_back({s.name, s.global_shape});
  RETURN_IF_ERROR(attempt.Set(job::keys::WeightsNamesOf(env.rank), EncodeManifest(mine)));
  std::vector<std::string> name_keys;
  for (int r = 0; r < env.world_size; ++r) name_keys.push_back(job::keys::WeightsNamesOf(r));
  RETURN_IF_ERROR(base::Annotate(attempt.Wait(name_keys, kConnectTimeout * 6),
                                 "waiting for every rank's published tensor names"));
  WeightsManifest m;
  m.attempt = env.attempt;
  m.world = env.world_size;
  // Read from the store: checked, not trusted (a name two ranks list must have one shape).
  std::map<std::string, std::vector<int64_t>> seen;
  for (const std::string& key : name_keys) {
    ASSIGN_OR_RETURN(std::string text, attempt.Get(key));
    absl::StatusOr<WeightsManifest> theirs = ParseManifest(text);
    if (!theirs.ok()) return base::Annotate(theirs.status(), key);
    for (const auto& t : theirs->tensors) {
      auto [it, added] = seen.emplace(t.name, t.shape);
      if (added) {
        m.tensors.push_back({t.name, t.shape});
      } else if (it->second != t.shape) {
        return absl::FailedPreconditionError(absl::StrCat(
            key, " lists tensor '", t.name, "' with another shape than an earlier rank; the ranks disagree on "
            "the model (or the key was overwritten): not publishing"));
      }
    }
  }
  const std::string text = EncodeManifest(m);
  ASSIGN_OR_RETURN(m, ParseManifest(text));  // the offsets, as a subscriber computes them
  std::map<std::string, const WeightsManifest::Tensor*> by_name;
  for (const auto& t : m.tensors) by_name[t.name] = &t;
  std::vector<uint64_t> remote_offsets;
  uint64_t staging_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    auto it = by_name.find(shards[i].name);
    if (it == by_name.end()) {
      return absl::FailedPreconditionError(absl::StrCat("tensor '", shards[i].name, "' of rank ", env.rank,
                                                        " is missing from the job's weights manifest"));
    }
    const WeightsManifest::Tensor& t = *it->second;
    remote_offsets.push_back(t.offset + 4 * static_cast<uint64_t>(shards[i].row_begin * shards[i].row_numel));
    staging_bytes += 4 * static_cast<uint64_t>(shards[i].rows * shards[i].row_numel);
  }
  if (env.rank == 0) RETURN_IF_ERROR(attempt.Set(job::keys::kWeightsManifest, text));
  onesided::AgentOptions ao;
  ao.store = &attempt;
  ao.key_prefix = std::string(job::keys::kWeightsOnesided);
  ao.name = RankAgent(env.rank);
  ao.rank = env.rank;
  ao.connect_timeout = kConnectTimeout;
  // Endpoints without peer-failure handling, so a subscriber on this host (its buffer from
  // AllocateMemory) is mapped and a put is one memcpy by the publisher thread instead of ~20 ms of
  // CPU over UCX TCP. A dead or stopped subscriber then shows as a put/notify/ack that does not
  // finish within kAckTimeout (dropped; training skips publish steps meanwhile), not as an error.
  ao.detect_peer_failure = false;
  ao.parallel_copy_min_bytes = 0;  // one core: the training threads need the others
  ASSIGN_OR_RETURN(std::unique_ptr<onesided::Agent> agent, onesided::Agent::Create(ao));
  ASSIGN_OR_RETURN(onesided::Registration staging, agent->AllocateMemory(staging_bytes));
  auto impl = std::make_unique<PublisherImpl>(plan, attempt, model, std::move(agent), std::move(staging),
                                              std::move(shards), std::move(remote_offsets));
  if (const int n = plan.spec.publish().wait_for_subscribers(); n > 0) {
    const int secs = plan.spec.publish().wait_timeout_s();
    impl->WaitForSubscribers(n, absl::Seconds(secs > 0 ? secs : 60));
  }
  return std::unique_ptr<Publisher>(std::move(impl));
}

}  // namespace ember::worker
