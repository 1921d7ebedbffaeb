#include "runtime/worker/stop_watch.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/job/keys.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
namespace {

volatile sig_atomic_t g_sigterm = 0;

void OnSigterm(int) { g_sigterm = 1; }

}  // namespace

void InstallStopSignalHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

bool ShouldWaitForStop(const absl::Status& st) {
  return absl::IsUnavailable(st) || absl::IsAborted(st) || absl::IsCancelled(st);
}

StopWatcher::StopWatcher(store::Client job, flight::FlightRecorder* recorder, std::string dump_dir,
                         int rank, absl::Duration period)
    : job_(std::move(job)), recorder_(recorder), dump_dir_(std::move(dump_dir)), rank_(rank),
      period_(period) {}

StopWatcher::~StopWatcher() {
  quit_.Notify();
  if (thread_.joinable()) thread_.join();
}

void StopWatcher::Start() {
  thread_ = std::thread([this] {
    std::string why;
    while (!quit_.WaitForNotificationWithTimeout(period_)) {
      if (Poll(&why)) StopNow(why);
    }
  });
}

bool StopWatcher::Poll(std::string* why) {
  if (g_sigterm) {
    *why = "SIGTERM";
    return true;
  }
  store::CallOptions o;
  o.timeout = absl::Seconds(2);
  auto v = job_.Get(job::keys::kStop, o);
  if (v.ok()) {
    *why = v->empty() ? "job stopped" : *v;
    return true;
  }
  return false;
}

void StopWatcher::AwaitStop(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string why;
  while (absl::Now() < deadline) {
    if (Poll(&why)) StopNow(why);
    absl::SleepFor(std::min(period_, absl::Milliseconds(50)));
  }
}

void StopWatcher::Dump(const std::string& reason) {
  if (recorder_ == nullptr || dump_dir_.empty()) return;
  const std::string path = absl::StrCat(dump_dir_, "/rank-", rank_, ".json");
  absl::Status st = recorder_->DumpToFile(path, reason, rank_);
  if (!st.ok()) spdlog::warn("flight recorder dump to {} failed: {}", path, st.ToString());
}

void StopWatcher::StopNow(const std::string& why) {
  // Only one thread gets here; another caller just waits for the process to end.
  if (done_.exchange(true)) {
    for (;;) pause();
  }
  Dump(absl::StrCat("stop: ", why));
  spdlog::warn("rank {} stopping: {} (flight recorder dumped to {})", rank_, why,
               dump_dir_.empty() ? "-" : dump_dir_);
  spdlog::default_logger()->flush();
  fflush(stdout);
  fflush(stderr);
  _exit(kExitStopped);
}

}  // namespace ember::worker
