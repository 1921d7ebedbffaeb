// What a training loop does around its steps, for the FSDP and the pipeline loop alike
// (trainer.cc): report each step (log line, progress record, metrics line) and save checkpoints on
// the spec's cadence.
//
// Thread safety: call from the training thread.
#ifndef EMBER_RUNTIME_WORKER_STEP_IO_H_
#define EMBER_RUNTIME_WORKER_STEP_IO_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "proto/jobs.pb.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/store/client.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

// A Publisher's counters (publisher.h), carried into the step's metrics.
struct PublishCounts {
  int64_t published = 0, skipped = 0, dropped = 0;
};

// One optimizer step's numbers, as the loop measured them: the one schema of a step's numbers
// (jobs.v1.StepMetrics, proto/jobs.proto). The loop sets what it measured (step, loss, local_loss,
// lr, grad_norm when computed, step_s, comm_wait_s, bytes, memory, ...); Report adds what the
// Reporter knows (tokens_per_s, peak_rss_bytes, state_bytes, attempt, unix_ms). Unset = not
// measured.
using StepResult = jobs::v1::StepMetrics;

// Sets the step's collective bytes (collective_bytes, reduce_scatter_promoted_bytes) from FSDP's
// counters.
void SetCommBytes(const fsdp::CommBytes& b, StepResult* r);
// Sets publish_published/skipped/dropped.
void SetPublishCounts(const PublishCounts& c, StepResult* r);

// In-memory replicas' counters (replicas.h), carried into the step's replica_* fields.
struct ReplicaCounts {
  bool from_memory = false;           // this attempt's state came from memory
  int64_t resumed_step = 0;           // the step it resumed after (0: fresh start)
  int64_t disk_checkpoint_reads = 0;  // disk checkpoints this attempt read
  int64_t memory_bytes = 0;           // /dev/shm bytes of this rank's replica files
  int64_t committed_step = -1;        // newest step whose replica (own and buddy copy) is committed
  double save_seconds = 0;            // training-thread time of the last Save
  bool from_network = false;          // ... pulled from a buddy on another host (cross-host replicas)
  int64_t network_bytes = 0;          // bytes this attempt pulled over the network to resume
};
// Sets replica_resumed_from_memory, _resumed_step, _disk_checkpoint_reads, _memory_bytes,
// _committed_step (when >= 0), replica_save_s, replica_resumed_from_network and
// replica_network_bytes.
void SetReplicaCounts(const ReplicaCounts& c, StepResult* r);

// The JSON form of `m`: one line (no newline), proto field names, unset fields left out.
std::string MetricsJson(const jobs::v1::StepMetrics& m);
// The log line of a report, formatted from `m` (a fixed selection: step, loss, lr, grad_norm,
// tok/s, mfu, eta, peak_rss, comm wait, all-gather/reduce-scatter bytes, device memory).
std::string LogLine(const jobs::v1::StepMetrics& m, int64_t steps, double eta_s);

// Tokens one optimizer step trains on, over every rank.
double TokensPerStep(const Plan& plan);

// Reporting every log_every steps and at the last, all three from one jobs.v1.StepMetrics: the log
// line (LogLine), the progress record (jobs.v1.Progress {steps, eta_s, metrics} under the
// attempt's progress/<rank>, which emberctl shows) and its JSON form (MetricsJson) as a line of
// <job_dir>/metrics/rank-<r>.jsonl. `attempt` must outlive the Reporter.
class Reporter {
 public:
  Reporter(const Plan& plan, store::Client& attempt, int64_t state_bytes, int64_t first_step);
  void Start() const;
  bool Due(int64_t step) const;
  absl::Status Report(StepResult r);
  void Done(int64_t step) const;

 private:
  const Plan& plan_;
  store::Client& attempt_;
  const int64_t state_bytes_;
  const int64_t first_;
  const absl::Time start_;
  std::ofstream metrics_;
};

// Checkpoint cadence: every checkpoint.every_steps and at the last step, committed through the
// attempt's store keys (synchronously, or in the background with checkpoint.async). `snapshot`
// returns what this rank saves at a step (views valid until the next optimizer step).
class Checkpointer {
 public:
  using SnapshotFn = std::function<ckpt::RankState(int64_t step)>;
  Checkpointer(const Plan& plan, store::Client& attempt, SnapshotFn snapshot);
  bool Due(int64_t step) const;
  absl::Status Save(int64_t step);
  // Seconds the last Save took (with async: until the background copy started); -1 before one.
  double last_save_seconds() const { return last_save_s_; }
  // Waits for a background save still in flight.
  absl::Status Finish() { return async_ ? async_->Wait() : absl::OkStatus(); }

 private:
  const Plan& plan_;
  SnapshotFn snapshot_;
  std::shared_ptr<ckpt::StoreCommitProtocol> protocol_;
  ckpt::SaveOptions options_;
  std::unique_ptr<ckpt::AsyncSaver> async_;
  double last_save_s_ = -1;
};

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_STEP_IO_H_
