#include "runtime/worker/stop_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/job/keys.h"
#include "spdlog/spdlog.h"

namespace ember::worker {
namespace {

volatile sig_atomic_t g_sigterm = 0;
// The self-pipe: the handler writes one byte to [1]; signal threads poll [0] and never drain it,
// so every watcher's thread wakes. -1 until InstallStopSignalHandler.
volatile sig_atomic_t g_wake_read = -1;
volatile sig_atomic_t g_wake_write = -1;

void OnSigterm(int) {
  const int saved = errno;
  g_sigterm = 1;
  if (g_wake_write >= 0) {
    const char b = 1;
    (void)!write(g_wake_write, &b, 1);  // non-blocking: a full pipe is already readable
  }
  errno = saved;
}

}  // namespace

void InstallStopSignalHandler() {
  if (g_wake_read >= 0) return;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
    g_wake_read = fds[0];
    g_wake_write = fds[1];
  } else {
    spdlog::warn("stop watcher: pipe2 for the SIGTERM self-pipe failed (errno {}); SIGTERM is "
                 "then noticed only between store polls",
                 errno);
  }
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
  if (quit_pipe_[1] >= 0) {
    const char b = 1;
    (void)!write(quit_pipe_[1], &b, 1);
  }
  if (signal_thread_.joinable()) signal_thread_.join();
  if (thread_.joinable()) thread_.join();
  for (int fd : quit_pipe_) {
    if (fd >= 0) close(fd);
  }
}

void StopWatcher::Start() {
  if (g_wake_read >= 0 && pipe2(quit_pipe_, O_CLOEXEC) == 0) {
    signal_thread_ = std::thread([this] { WatchSignal(); });
  }
  thread_ = std::thread([this] {
    std::string why;
    while (!quit_.WaitForNotificationWithTimeout(period_)) {
      if (Poll(&why)) StopNow(why);
    }
  });
}

void StopWatcher::WatchSignal() {
  for (;;) {
    pollfd fds[2] = {{g_wake_read, POLLIN, 0}, {quit_pipe_[0], POLLIN, 0}};
    const int n = poll(fds, 2, /*timeout_ms=*/-1);
    if (g_sigterm) StopNow("SIGTERM");
    if (n > 0 && fds[1].revents != 0) return;
    if (n < 0 && errno != EINTR) absl::SleepFor(absl::Milliseconds(10));  // ENOMEM: try again
  }
}

bool StopWatcher::Poll(std::string* why) {
  if (g_sigterm) {
    *why = "SIGTERM";
    return true;
  }
  store::CallOptions o;
  o.timeout = absl::Seconds(2);
  // One round trip for both keys.
  auto v = job_.MultiGet({std::string(job::keys::kStop), std::string(job::keys::kDrain)}, o);
  if (!v.ok() || v->size() != 2) return false;
  if ((*v)[1].has_value() && !drain_.exchange(true)) {
    spdlog::info("rank {}: checkpoint-and-stop requested ({}); stopping after the next agreed step", rank_, *(*v)[1]);
  }
  if ((*v)[0].has_value()) {
    *why = (*v)[0]->empty() ? "job stopped" : *(*v)[0];
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
