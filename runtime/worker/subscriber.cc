#include "runtime/worker/subscriber.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "checkpoint/safetensors.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/keys.h"
#include "runtime/onesided/agent.h"
#include "runtime/worker/weights_protocol.h"

namespace ember::worker {
namespace {

constexpr absl::Duration kStaleAfter = absl::Seconds(5);  // a step some ranks never completed
// The subscriber usually shares the machine with the job it reads: its waits block at once
// (WaitStyle::kBlock) instead of spinning; a wake-up costs tens of microseconds per snapshot.
constexpr absl::Duration kWaitSlice = absl::Seconds(2);
constexpr onesided::WaitStyle kStyle = onesided::WaitStyle::kBlock;

// The newest attempt of `job` whose rank 0 wrote a manifest.
absl::StatusOr<int> FindAttempt(store::Client& root, const std::string& job, absl::Duration timeout) {
  const std::string prefix = job::keys::AttemptsPrefix(job);
  const std::string suffix = absl::StrCat("/", job::keys::kWeightsManifest);
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    ASSIGN_OR_RETURN(std::vector<std::string> keys, root.ListKeys(prefix));
    int best = -1;
    for (const std::string& k : keys) {
      absl::string_view rest(k);
      int n = 0;
      if (absl::ConsumePrefix(&rest, prefix) && absl::ConsumeSuffix(&rest, suffix) &&
          absl::SimpleAtoi(rest, &n)) {
        best = std::max(best, n);
      }
    }
    if (best >= 0) return best;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job '", job, "' publishes no weights (no ", prefix, "<n>", suffix, " after ",
          absl::FormatDuration(timeout), "): is it running with publish.every_steps > 0?"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::Status WriteSnapshot(const WeightsManifest& m, const char* buffer, int64_t step,
                           const std::string& path) {
  std::vector<ckpt::TensorSpec> specs;
  std::vector<absl::string_view> data;
  for (const auto& t : m.tensors) {
    specs.push_back({t.name, ckpt::DType::kF32, t.shape});
    data.emplace_back(buffer + t.offset, t.bytes);
  }
  const std::string tmp = path + ".tmp";
  // Not fsynced: a live snapshot is for reading now (the rename makes it appear whole); the job's
  // checkpoints are the durable copy. An fsync per snapshot forced the disk (and ext4's journal,
  // which other processes' fsyncs wait on) every few steps and held the ranks' ack meanwhile.
  RETURN_IF_ERROR(ckpt::WriteSafetensorsStreaming(
      tmp, specs, {{"format", "pt"}, {"ember.step", absl::StrCat(step)}},
      [&](size_t i, const ckpt::AppendFn& append) { return append(data[i]); }, /*sync=*/false));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, " failed"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> SubscribeWeights(const SubscribeOptions& o) {
  if ((o.store == nullptr && o.store_address.empty()) || o.job.empty() || o.out_dir.empty()) {
    return absl::InvalidArgumentError("SubscribeWeights needs a store, a job id and an output directory");
  }
  std::optional<store::Client> own;
  if (o.store == nullptr) {
    store::ClientOptions so;
    so.address = o.store_address;
    so.auth_token = o.token;
    if (o.tls.enabled()) {
      ASSIGN_OR_RETURN(so.credentials, base::MakeChannelCredentials(o.tls));
    }
    absl::StatusOr<store::Client> c = store::Client::Connect(so);
    if (!c.ok()) return base::Annotate(c.status(), absl::StrCat("the store at ", o.store_address));
    own.emplace(*std::move(c));
  }
  store::Client& root = o.store ? *o.store : *own;
  ASSIGN_OR_RETURN(int attempt_n, FindAttempt(root, o.job, o.manifest_timeout));
  store::Client attempt = root.WithPrefix(job::keys::AttemptPrefix(o.job, attempt_n));
  ASSIGN_OR_RETURN(std::string text, attempt.Get(job::keys::kWeightsManifest));
  ASSIGN_OR_RETURN(WeightsManifest m, ParseManifest(text));
  RETURN_IF_ERROR(base::MakeDirs(o.out_dir));

  onesided::AgentOptions ao;
  ao.store = &attempt;
  ao.key_prefix = std::string(job::keys::kWeightsOnesided);
  ao.name = !o.name.empty() ? o.name : absl::StrCat("sub-", getpid(), "-", absl::ToUnixMicros(absl::Now()));
  // As the ranks' agents (publisher.cc): no peer-failure handling, so a rank on this host maps the
  // buffer (UCX refuses endpoints whose two sides differ in it). A dead rank is then seen as
  // notifications that stop coming; the loop below ends when the attempt's ranks have exited.
  ao.detect_peer_failure = false;
  ASSIGN_OR_RETURN(std::unique_ptr<onesided::Agent> agent, onesided::Agent::Create(ao));
  ASSIGN_OR_RETURN(onesided::Registration buf, agent->AllocateMemory(m.total_bytes));
  const std::string key = job::keys::WeightsSubscriber(ao.name);
  RETURN_IF_ERROR(attempt.Set(key, buf.descriptor));
  std::vector<onesided::Connection*> conns;
  for (int r = 0; r < m.world; ++r) {
    absl::StatusOr<onesided::Connection*> c = agent->Connect(RankAgent(r));
    if (!c.ok()) {
      (void)attempt.Delete(key);
      return base::Annotate(c.status(), absl::StrCat("connecting to rank ", r, " of job ", o.job));
    }
    conns.push_back(*c);
  }

  auto job_ended = [&]() {
    absl::StatusOr<int64_t> n = attempt.NumKeys(job::keys::kWorkerExitPrefix);
    return n.ok() && *n >= m.world;
  };
  std::vector<int64_t> latest(m.world, -1);
  int64_t written = 0;
  absl::Time last_note = absl::Now();
  absl::Status result;
  while (o.steps == 0 || written < o.steps) {
    absl::StatusOr<onesided::Notification> note = agent->WaitNotification(kWaitSlice, kStyle);
    if (!note.ok()) {
      if (job_ended()) break;
      if (absl::IsUnavailable(note.status())) {
        absl::SleepFor(absl::Seconds(2));  // a rank that exited normally writes its exit record
        if (job_ended()) break;
        result = note.status();
        break;
      }
      if (absl::Now() - last_note > kStaleAfter) {  // release ranks that sent a step others never did
        for (int r = 0; r < m.world; ++r) {
          if (latest[r] >= 0) (void)agent->Notify(conns[r], AckMessage(latest[r]));
        }
        last_note = absl::Now();
      }
      continue;
    }
    last_note = absl::Now();
    std::optional<int> r = ParseRankAgent(note->peer);
    std::optional<int64_t> step = ParseMessage(note->message, "step");
    if (!r || !step || *r >= m.world) continue;
    latest[*r] = *step;
    bool complete = true;
    for (int64_t s : latest) complete = complete && s == *step;
    if (!complete) continue;
    const std::string dir = absl::StrCat(o.out_dir, "/step-", *step);
    const std::string path = dir + "/model.safetensors";
    result = base::MakeDirs(dir);
    if (result.ok()) result = WriteSnapshot(m, static_cast<const char*>(buf.base), *step, path);
    if (!result.ok()) break;
    ++written;
    if (o.on_snapshot) o.on_snapshot(*step, path);
    for (onesided::Connection* c : conns) {
      (void)agent->Notify(c, AckMessage(*step)).Wait(absl::Seconds(5), kStyle);
    }
  }
  (void)attempt.Delete(key);
  if (!result.ok()) return result;
  return written;
}

}  // namespace ember::worker
