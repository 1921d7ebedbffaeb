// The worker environment: the contract between emberd (or a test, or a person) and ember-worker.
// docs/fsdp.md and /work/shared/DESIGN.md list the variables; a worker started by hand with them
// set behaves exactly like one started by a daemon.
//
// Thread safety: pure functions.
//
//   ASSIGN_OR_RETURN(WorkerEnv env, ReadWorkerEnv(getenv));
#ifndef EMBER_RUNTIME_WORKER_ENV_H_
#define EMBER_RUNTIME_WORKER_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/base/auth.h"

namespace ember::worker {

struct WorkerEnv {
  std::string store_addr;       // EMBER_STORE_ADDR  host:port
  std::string job_id;           // EMBER_JOB_ID
  int attempt = 0;              // EMBER_ATTEMPT
  int rank = 0;                 // EMBER_RANK
  int world_size = 1;           // EMBER_WORLD_SIZE
  int local_rank = 0;           // EMBER_LOCAL_RANK
  int local_world_size = 1;     // EMBER_LOCAL_WORLD_SIZE
  int node_rank = 0;            // EMBER_NODE_RANK
  std::string device = "cpu";   // EMBER_DEVICE  cpu | cuda:N
  std::string job_dir;          // EMBER_JOB_DIR
  std::string auth_token_file;  // EMBER_AUTH_TOKEN_FILE (optional)
  std::string job_spec;         // EMBER_JOB_SPEC (optional; default <job_dir>/job.yaml)
  std::string fr_dump_dir;      // EMBER_FR_DUMP_DIR (optional; default <job_dir>/flight)
  // EMBER_TLS_CA, EMBER_TLS_CERT, EMBER_TLS_KEY (optional paths): dial the store with TLS when
  // either of the first two is set, presenting the certificate (mTLS) when given.
  base::TlsOptions tls;
  // EMBER_UPLOAD_DIR (optional; default <job_dir>): relative data paths (data.path,
  // data.text_path, checkpoint.init_from_safetensors) resolve here; emberd sets <job_dir>/uploads.
  std::string upload_dir;
  // EMBER_WORKER_FAULT (tests only): "hang:rank=R,step=S[,attempt=A]" makes rank R stop making
  // progress at step S (alive, never joining the next collective) in attempt A (default 0).
  std::string fault;

  // Store keys of this job attempt: "jobs/<job>/attempt/<n>/".
  std::string prefix() const;
};

// Reads and checks every variable; INVALID_ARGUMENT names the variable and what it must be.
absl::StatusOr<WorkerEnv> ReadWorkerEnv(const std::function<const char*(const char*)>& getenv);

}  // namespace ember::worker

#endif  // EMBER_RUNTIME_WORKER_ENV_H_
