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
#include "runtime/fsdp/fsdp.h"
#include "runtime/store/client.h"
#include "runtime/worker/trainer.h"

namespace ember::worker {

// One optimizer step's numbers, as the loop measured them.
// A Publisher's counters (publisher.h), carried into the progress record.
struct PublishCounts {
  int64_t published = 0, skipped = 0, dropped = 0;
};

// In-memory replicas' counters (replicas.h), carried into the progress record (jobs.v1.ReplicaStats).
struct ReplicaCounts {
  std::string resumed_from = "init";  // "memory" | "disk" | "init": where this attempt's state came from
  int64_t resumed_step = 0;
  int64_t disk_checkpoint_reads = 0;  // disk checkpoints this attempt read
  int64_t memory_bytes = 0;           // /dev/shm bytes of this rank's replica files
  int64_t committed_step = -1;        // newest step whose replica (own and buddy copy) is committed
  double save_seconds = 0;            // training-thread time of the last Save
};

struct StepResult {
  int64_t step = 0;
  double loss = 0;        // mean over every rank
  double local_loss = 0;  // this rank's, over its micro-batches
  float lr = 0;
  double grad_norm = 0;   // NaN when not computed (pipeline jobs: no clipping)
  double seconds = 0;
  double comm_wait_s = 0;     // FSDP: time in collectives on the training thread
  fsdp::CommBytes bytes;      // FSDP: bytes moved by collectives in this step
  int64_t comm_memory_bytes = 0;  // held by the communicators outside any allocator
  double checkpoint_save_s = -1;  // the last checkpoint save before this step (-1: none yet)
  int64_t flight_entries = -1;    // entries in the flight recorder (-1: not known)
  int64_t device_memory_bytes = -1;       // GPU runs: the device allocator's allocated bytes (-1: cpu)
  int64_t device_peak_memory_bytes = -1;  // and its high-water mark
  double mfu = -1;  // GPU runs: model FLOPs utilisation vs the device's dense bf16 peak, 0..1
                    // (runtime/model/flops.h); -1: not computed (cpu, or a device not in the table)
  std::optional<PublishCounts> publish;  // set when the job publishes its weights
  std::optional<ReplicaCounts> replicas;  // set with fault_tolerance.replicas: memory
};

// Tokens one optimizer step trains on, over every rank.
double TokensPerStep(const Plan& plan);

// Reporting every log_every steps and at the last: the log line (step, loss, tokens/s, ETA), the
// progress record (jobs.v1.Progress under the attempt's progress/<rank>, which emberctl shows)
// and a line of <job_dir>/metrics/rank-<r>.jsonl. `attempt` must outlive the Reporter.
class Reporter {
 public:
  Reporter(const Plan& plan, store::Client& attempt, int64_t state_bytes, int64_t first_step);
  void Start() const;
  bool Due(int64_t step) const;
  absl::Status Report(const StepResult& r);
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
