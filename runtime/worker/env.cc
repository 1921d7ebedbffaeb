#include "runtime/worker/env.h"

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::worker {

std::string WorkerEnv::prefix() const { return absl::StrCat("jobs/", job_id, "/attempt/", attempt, "/"); }

absl::StatusOr<WorkerEnv> ReadWorkerEnv(const std::function<const char*(const char*)>& getenv) {
  auto str = [&](const char* name, bool required, std::string* out) -> absl::Status {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') {
      if (required) return absl::InvalidArgumentError(absl::StrCat(name, " is not set"));
      return absl::OkStatus();
    }
    *out = v;
    return absl::OkStatus();
  };
  auto num = [&](const char* name, bool required, int lo, int* out) -> absl::Status {
    std::string s;
    RETURN_IF_ERROR(str(name, required, &s));
    if (s.empty()) return absl::OkStatus();
    if (!absl::SimpleAtoi(s, out) || *out < lo) {
      return absl::InvalidArgumentError(absl::StrCat(name, "='", s, "' must be an integer >= ", lo));
    }
    return absl::OkStatus();
  };
  WorkerEnv e;
  RETURN_IF_ERROR(str("EMBER_STORE_ADDR", true, &e.store_addr));
  RETURN_IF_ERROR(str("EMBER_JOB_ID", true, &e.job_id));
  if (absl::StrContains(e.job_id, "/")) {
    return absl::InvalidArgumentError(absl::StrCat("EMBER_JOB_ID='", e.job_id, "' must not contain '/'"));
  }
  RETURN_IF_ERROR(num("EMBER_ATTEMPT", false, 0, &e.attempt));
  RETURN_IF_ERROR(num("EMBER_RANK", true, 0, &e.rank));
  RETURN_IF_ERROR(num("EMBER_WORLD_SIZE", true, 1, &e.world_size));
  if (e.rank >= e.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("EMBER_RANK=", e.rank, " must be < EMBER_WORLD_SIZE=", e.world_size));
  }
  e.local_rank = e.rank;
  e.local_world_size = e.world_size;
  RETURN_IF_ERROR(num("EMBER_LOCAL_RANK", false, 0, &e.local_rank));
  RETURN_IF_ERROR(num("EMBER_LOCAL_WORLD_SIZE", false, 1, &e.local_world_size));
  RETURN_IF_ERROR(num("EMBER_NODE_RANK", false, 0, &e.node_rank));
  RETURN_IF_ERROR(str("EMBER_DEVICE", false, &e.device));
  if (e.device != "cpu" && !absl::StartsWith(e.device, "cuda:")) {
    return absl::InvalidArgumentError(absl::StrCat("EMBER_DEVICE='", e.device, "' must be cpu or cuda:N"));
  }
  RETURN_IF_ERROR(str("EMBER_JOB_DIR", true, &e.job_dir));
  RETURN_IF_ERROR(str("EMBER_AUTH_TOKEN_FILE", false, &e.auth_token_file));
  RETURN_IF_ERROR(str("EMBER_JOB_SPEC", false, &e.job_spec));
  RETURN_IF_ERROR(str("EMBER_FR_DUMP_DIR", false, &e.fr_dump_dir));
  if (e.fr_dump_dir.empty()) e.fr_dump_dir = absl::StrCat(e.job_dir, "/flight");
  RETURN_IF_ERROR(str("EMBER_UPLOAD_DIR", false, &e.upload_dir));
  if (e.upload_dir.empty()) e.upload_dir = e.job_dir;
  RETURN_IF_ERROR(str("EMBER_WORKER_FAULT", false, &e.fault));
  RETURN_IF_ERROR(str("EMBER_TLS_CA", false, &e.tls.ca_file));
  RETURN_IF_ERROR(str("EMBER_TLS_CERT", false, &e.tls.cert_file));
  RETURN_IF_ERROR(str("EMBER_TLS_KEY", false, &e.tls.key_file));
  if (e.tls.cert_file.empty() != e.tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "EMBER_TLS_CERT and EMBER_TLS_KEY go together (a client certificate and its key)");
  }
  return e;
}

}  // namespace ember::worker
