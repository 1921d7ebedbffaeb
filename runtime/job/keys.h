// The store keys of a job that emberd and ember-worker share (DESIGN.md "Store key space"): one
// definition each, here. Keys only the daemon uses (nodes/, alloc/, scheduler/leader,
// submissions/, the job record) are in runtime/daemon/keys.h. Thread-safe (pure functions).
//
//   jobs/<job>/                            JobPrefix
//   jobs/<job>/files/<name>                File: an uploaded input file (FilesPrefix lists them)
//   jobs/<job>/fence                       Fence: the number of the job's newest attempt, decimal;
//                                          the scheduling daemon sets it before it starts that
//                                          attempt. Workers' writes carry (Fence(job), their
//                                          attempt) and the store refuses them once it is larger
//                                          (proto/store.proto Fence): stale workers cannot write.
//   jobs/<job>/attempt/<n>/                AttemptPrefix; below it, relative to it:
//     stop                  kStop         reason every rank of the attempt must stop (any writer)
//     drain                 kDrain        reason the ranks must checkpoint, then stop (emberd Cancel)
//     failure               kFailure      first failing rank's jobs.v1.RankExit (first writer wins)
//     exit/<rank>           ExitOf        jobs.v1.RankExit of a rank that ended (daemon)
//     progress/<rank>       ProgressOf    jobs.v1.Progress, binary (worker, every log_every steps)
//     worker_exit/<rank>    WorkerExitOf  jobs.v1.WorkerExit, binary (worker, as it exits)
//     replicas/<rank>       ReplicasOf    steps this rank can restore from in-memory replicas,
//                                         "disk=N;s1,s2;held" (worker, at resume; runtime/worker/replicas.h)
//     replica_layout/<rank> ReplicaLayoutOf  "payload_bytes:fingerprint" of a rank's replica (cross-host
//                                         replicas: its buddy creates the file it holds from it)
//     replica_held/<r>/<h>  ReplicaHeldOf the descriptor of the copy of rank r's state that rank h
//                                         holds in its host's memory (the onesided agent's region)
//     replica_onesided/     kReplicaOnesided  the replica agents' address exchange
//     fr/dump_request       kDumpRequest  flight-recorder dump trigger (docs/flight-recorder.md);
//                                         the comm layer names it again in runtime/comm/env_knobs.h
//                                         (comm knows nothing of jobs; the worker static_asserts
//                                         that the two agree)
//     torch/                kTorchStore   script jobs: the keys PyTorch's TCPStore clients of the
//                                         attempt see (the daemon's per-attempt listener, torch_env.h)
//     torch_master          kTorchMaster  script jobs: "host:port" of that listener (its daemon)
//     weights/manifest      kWeightsManifest  live weight publishing (docs/onesided.md): the
//                                         model's tensors, rank 0 writes it once per attempt
//     weights/sub/<name>    WeightsSubscriber a subscriber's buffer descriptor (the subscriber)
//     weights/onesided/     kWeightsOnesided  the onesided agents' address exchange
//     weights/stats/<rank>  WeightsStatsOf    a rank's publish counters (published, skipped, dropped)
//     weights/names/<rank>  WeightsNamesOf    the tensors a rank publishes (name and shape per line)
//
// Values are binary protos (proto/jobs.proto), not JSON: every reader is C++ code that has the
// message, people see progress through the Jobs API (`emberctl status`, StreamMetrics), and one
// encoding leaves nothing to parse leniently (no int64-as-string, NaN or unknown-field cases).
//
// A worker's store client is scoped to its attempt (client.WithPrefix(AttemptPrefix(job, n)), which
// is WorkerEnv::prefix()) and uses the relative forms; the daemon uses the absolute ones.
//
//   store::Client attempt = client.WithPrefix(job::keys::AttemptPrefix(id, n));
//   attempt.Get(job::keys::kStop);   // == client.Get(job::keys::Stop(id, n))
#ifndef EMBER_RUNTIME_JOB_KEYS_H_
#define EMBER_RUNTIME_JOB_KEYS_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ember::job::keys {

// --- relative to AttemptPrefix(job, attempt) ---
inline constexpr absl::string_view kStop = "stop";
// Checkpoint, then stop (emberctl cancel --checkpoint, Slurm's time-limit warning): the ranks agree
// on a step, save a checkpoint there and exit kExitDrained (76); the value is the reason.
inline constexpr absl::string_view kDrain = "drain";
inline constexpr absl::string_view kFailure = "failure";
inline constexpr absl::string_view kDumpRequest = "fr/dump_request";
inline constexpr absl::string_view kTorchStore = "torch/";
inline constexpr absl::string_view kTorchMaster = "torch_master";
inline std::string ExitOf(int rank) { return absl::StrCat("exit/", rank); }
inline std::string ProgressOf(int rank) { return absl::StrCat("progress/", rank); }
inline std::string WorkerExitOf(int rank) { return absl::StrCat("worker_exit/", rank); }
inline std::string ReplicasOf(int rank) { return absl::StrCat("replicas/", rank); }
inline std::string ReplicaLayoutOf(int rank) { return absl::StrCat("replica_layout/", rank); }
inline std::string ReplicaHeldOf(int rank, int holder) { return absl::StrCat("replica_held/", rank, "/", holder); }
inline constexpr absl::string_view kReplicaOnesided = "replica_onesided/";
inline constexpr absl::string_view kWorkerExitPrefix = "worker_exit/";
inline constexpr absl::string_view kWeightsManifest = "weights/manifest";
inline constexpr absl::string_view kWeightsSubscribers = "weights/sub/";
inline constexpr absl::string_view kWeightsOnesided = "weights/onesided/";
inline std::string WeightsSubscriber(absl::string_view name) { return absl::StrCat(kWeightsSubscribers, name); }
inline std::string WeightsStatsOf(int rank) { return absl::StrCat("weights/stats/", rank); }
inline std::string WeightsNamesOf(int rank) { return absl::StrCat("weights/names/", rank); }

// --- absolute ---
// Every top-level key space of emberd and its workers (this header's and runtime/daemon/keys.h's;
// daemon_unit_test checks that each daemon key falls in one). A TCPStore listener, whose clients
// never authenticate, may not reach any of them: ember-store refuses a --tcpstore-prefix inside or
// above one (whoever could write jobs/<id>/... could forge a job or fence a running one).
inline constexpr absl::string_view kEmberdKeySpaces[] = {
    "jobs/", "nodes/", "alloc/", "scheduler/", "submissions/", "joblist/", "active/"};
inline std::string JobPrefix(absl::string_view job) { return absl::StrCat("jobs/", job, "/"); }
inline std::string FilesPrefix(absl::string_view job) { return absl::StrCat(JobPrefix(job), "files/"); }
inline std::string File(absl::string_view job, absl::string_view name) {
  return absl::StrCat(FilesPrefix(job), name);
}
inline std::string Fence(absl::string_view job) { return absl::StrCat(JobPrefix(job), "fence"); }
inline std::string AttemptsPrefix(absl::string_view job) { return absl::StrCat(JobPrefix(job), "attempt/"); }
inline std::string AttemptPrefix(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptsPrefix(job), attempt, "/");
}
inline std::string Drain(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptPrefix(job, attempt), kDrain);
}
inline std::string Stop(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptPrefix(job, attempt), kStop);
}
inline std::string Failure(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptPrefix(job, attempt), kFailure);
}
inline std::string DumpRequest(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptPrefix(job, attempt), kDumpRequest);
}
inline std::string TorchStore(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptPrefix(job, attempt), kTorchStore);
}
inline std::string TorchMaster(absl::string_view job, int attempt) {
  return absl::StrCat(AttemptPrefix(job, attempt), kTorchMaster);
}
inline std::string Exit(absl::string_view job, int attempt, int rank) {
  return absl::StrCat(AttemptPrefix(job, attempt), ExitOf(rank));
}
inline std::string Progress(absl::string_view job, int attempt, int rank) {
  return absl::StrCat(AttemptPrefix(job, attempt), ProgressOf(rank));
}
inline std::string WorkerExit(absl::string_view job, int attempt, int rank) {
  return absl::StrCat(AttemptPrefix(job, attempt), WorkerExitOf(rank));
}

}  // namespace ember::job::keys

#endif  // EMBER_RUNTIME_JOB_KEYS_H_
