// The worker environment: the contract between emberd (or a test, or a person) and ember-worker.
// Every variable name is a constant below, declared nowhere else; docs/fsdp.md and
// /work/shared/DESIGN.md list them. A worker started by hand with them set behaves exactly like one
// started by a daemon. The comm layer's own knobs (EMBER_COMM_*) live in runtime/comm/env_knobs.h.
//
// Thread safety: plain value type; FromEnv is a pure function of `getenv`.
//
//   ASSIGN_OR_RETURN(job::WorkerEnv env, job::WorkerEnv::FromEnv(getenv));   // ember-worker
//   for (auto& [k, v] : env.ToEnv()) spawn.env.push_back({k, v});            // emberd
#ifndef EMBER_RUNTIME_JOB_ENV_H_
#define EMBER_RUNTIME_JOB_ENV_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/base/auth.h"

namespace ember::job {

inline constexpr char kEnvStoreAddr[] = "EMBER_STORE_ADDR";
inline constexpr char kEnvJobId[] = "EMBER_JOB_ID";
inline constexpr char kEnvAttempt[] = "EMBER_ATTEMPT";
inline constexpr char kEnvRank[] = "EMBER_RANK";
inline constexpr char kEnvWorldSize[] = "EMBER_WORLD_SIZE";
inline constexpr char kEnvLocalRank[] = "EMBER_LOCAL_RANK";
inline constexpr char kEnvLocalWorldSize[] = "EMBER_LOCAL_WORLD_SIZE";
inline constexpr char kEnvNodeRank[] = "EMBER_NODE_RANK";
inline constexpr char kEnvDevice[] = "EMBER_DEVICE";
inline constexpr char kEnvJobDir[] = "EMBER_JOB_DIR";
inline constexpr char kEnvAuthTokenFile[] = "EMBER_AUTH_TOKEN_FILE";
inline constexpr char kEnvJobSpec[] = "EMBER_JOB_SPEC";
// Also read by the comm layer itself (runtime/comm/env_knobs.h names it again: comm knows nothing
// of jobs); the worker passes it to its process groups explicitly.
inline constexpr char kEnvFrDumpDir[] = "EMBER_FR_DUMP_DIR";
inline constexpr char kEnvUploadDir[] = "EMBER_UPLOAD_DIR";
inline constexpr char kEnvWorkerFault[] = "EMBER_WORKER_FAULT";
inline constexpr char kEnvTlsCa[] = "EMBER_TLS_CA";
inline constexpr char kEnvTlsCert[] = "EMBER_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "EMBER_TLS_KEY";
inline constexpr char kEnvReplicaDir[] = "EMBER_REPLICA_DIR";
// "1": cuda ranks run on the CUDA interpreter; only the test build ember-worker-cuda-interp
// accepts it (runtime/worker/cuda_trainer.h reads it; not part of WorkerEnv: a test switch).
inline constexpr char kEnvEmulateGpus[] = "EMBER_EMULATE_GPUS";

struct WorkerEnv {
  std::string store_addr;       // kEnvStoreAddr  host:port
  std::string job_id;           // kEnvJobId (no '/')
  int attempt = 0;              // kEnvAttempt (optional)
  int rank = 0;                 // kEnvRank
  int world_size = 1;           // kEnvWorldSize
  int local_rank = 0;           // kEnvLocalRank (optional; default rank)
  int local_world_size = 1;     // kEnvLocalWorldSize (optional; default world_size)
  int node_rank = 0;            // kEnvNodeRank (optional)
  std::string device = "cpu";   // kEnvDevice  cpu | cuda:N (optional)
  std::string job_dir;          // kEnvJobDir
  std::string auth_token_file;  // kEnvAuthTokenFile (optional)
  std::string job_spec;         // kEnvJobSpec (optional; default <job_dir>/job.yaml)
  std::string fr_dump_dir;      // kEnvFrDumpDir (optional; default <job_dir>/flight)
  // kEnvTlsCa, kEnvTlsCert, kEnvTlsKey (optional paths): dial the store with TLS when either of
  // the first two is set, presenting the certificate (mTLS) when given.
  base::TlsOptions tls;
  // kEnvUploadDir (optional; default <job_dir>): relative data paths (data.path,
  // data.text_path, checkpoint.init_from_safetensors) resolve here; emberd sets <job_dir>/uploads.
  std::string upload_dir;
  // kEnvWorkerFault (tests only): "hang:rank=R,step=S[,attempt=A]" makes rank R stop making
  // progress at step S (alive, never joining the next collective) in attempt A (default 0).
  std::string fault;
  // kEnvReplicaDir (optional): where fault_tolerance.replicas: memory keeps this job's replica
  // files (runtime/worker/replicas.h); emberd sets /dev/shm/ember-<uid>/<daemon>/<job>; default
  // /dev/shm/ember-<uid>/standalone/<job_id>.
  std::string replica_dir;

  // Store keys of this job attempt: job::AttemptPrefix(job_id, attempt) (keys.h).
  std::string prefix() const;

  // The variables that make FromEnv return this value: every required and numeric variable, and
  // each optional string that is non-empty (an empty one means "unset", i.e. its default).
  std::vector<std::pair<std::string, std::string>> ToEnv() const;

  // Reads and checks every variable; INVALID_ARGUMENT names the variable and what it must be.
  static absl::StatusOr<WorkerEnv> FromEnv(const std::function<const char*(const char*)>& getenv);
};

bool operator==(const WorkerEnv& a, const WorkerEnv& b);
inline bool operator!=(const WorkerEnv& a, const WorkerEnv& b) { return !(a == b); }

// Where rank `rank` appends its metrics lines (one JSON object per report, runtime/worker/step_io.h)
// and emberd's /metrics reads the newest one: <job_dir>/metrics/rank-<rank>.jsonl.
inline std::string MetricsPath(absl::string_view job_dir, int rank) {
  return absl::StrCat(job_dir, "/metrics/rank-", rank, ".jsonl");
}

}  // namespace ember::job

#endif  // EMBER_RUNTIME_JOB_ENV_H_
