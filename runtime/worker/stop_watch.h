// StopWatcher: makes a worker stop within a fraction of a second when its job is told to stop
// (a peer died, the job was cancelled, a node was lost) or when it gets SIGTERM, and dump its
// flight recorder first. Two threads, so that neither cause waits on the other:
//  - a signal thread blocks on the self-pipe InstallStopSignalHandler's handler writes to and acts
//    on SIGTERM at once (milliseconds), never touching the store — even while the store is
//    unreachable (link cut, store down) and every store call hangs until its deadline;
//  - a poll thread reads the attempt-scoped store key `stop` (the daemon sets it on the first
//    failure, DESIGN.md key space) every `period`; each read has a 2 s deadline, which the store
//    client keeps also against a silent store (client_silent_store_test; it was ~7 s before), so
//    a cut-off rank may sit 2 s in one read: SIGTERM has its own thread.
// On a stop it writes the recorder to <dump_dir>/rank-<r>.json with reason "stop: <why>" (why =
// "SIGTERM", or the stop key's value), logs one line and ends the process with
// _exit(kExitStopped) — training state needs no clean-up (checkpoints are committed atomically,
// a half-written one is never `latest`).
//
// Exit code kExitStopped (75) tells the daemon "stopped because told to", never a root cause.
//
// Thread-safe: Start once; the destructor stops both threads (it waits for a store read the poll
// thread is in). Without InstallStopSignalHandler there is no signal thread (SIGTERM keeps
// its default action).
//
//   InstallStopSignalHandler();  // in main, before threads start
//   StopWatcher w(job_client, &recorder, dump_dir, rank);
//   w.Start();
//   ... train ...
//   if (!st.ok() && ShouldWaitForStop(st)) w.AwaitStop(absl::Seconds(3));  // _exits on a stop
#ifndef EMBER_RUNTIME_WORKER_STOP_WATCH_H_
#define EMBER_RUNTIME_WORKER_STOP_WATCH_H_

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "runtime/flight/recorder.h"
#include "runtime/store/client.h"

namespace ember::worker {

inline constexpr int kExitStopped = 75;
// The job was told to checkpoint and stop (the attempt's `drain` key): every rank saved the
// checkpoint of the step they agreed on and exited with this code.
inline constexpr int kExitDrained = 76;

// Routes SIGTERM to a flag and a self-pipe (async-signal-safe) that every started StopWatcher's
// signal thread waits on. Call once, before threads start; later calls do nothing.
void InstallStopSignalHandler();

// True for errors a dying peer causes (UNAVAILABLE, ABORTED): the rank should wait briefly for the
// job's stop key rather than report itself as the root cause.
bool ShouldWaitForStop(const absl::Status& st);

class StopWatcher {
 public:
  // `job` is the attempt-scoped client (prefix jobs/<job>/attempt/<n>/); `recorder` must outlive
  // this object (may be null: no dump). `dump_dir` "" = no dump.
  StopWatcher(store::Client job, flight::FlightRecorder* recorder, std::string dump_dir, int rank,
              absl::Duration period = absl::Milliseconds(100));
  ~StopWatcher();

  void Start();
  // Blocks up to `timeout` for a stop (which ends the process); returns if none came.
  void AwaitStop(absl::Duration timeout);
  // True once the attempt's `drain` key was seen (the poll thread reads it with the stop key).
  bool drain_requested() const { return drain_.load(std::memory_order_relaxed); }
  // Writes the recorder dump now (best effort) with `reason`.
  void Dump(const std::string& reason);

 private:
  bool Poll(std::string* why);
  void WatchSignal();  // the signal thread's body
  [[noreturn]] void StopNow(const std::string& why);

  store::Client job_;
  flight::FlightRecorder* const recorder_;
  const std::string dump_dir_;
  const int rank_;
  const absl::Duration period_;
  std::atomic<bool> done_{false};
  std::atomic<bool> drain_{false};
  absl::Notification quit_;
  int quit_pipe_[2] = {-1, -1};  // the destructor writes to [1] to wake the signal thread
  std::thread thread_;          // polls the store
  std::thread signal_thread_;   // waits for SIGTERM
};

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_STOP_WATCH_H_
