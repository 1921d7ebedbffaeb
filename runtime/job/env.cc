#include "runtime/job/env.h"

#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/keys.h"

namespace ember::job {

std::string WorkerEnv::prefix() const { return keys::AttemptPrefix(job_id, attempt); }

std::vector<std::pair<std::string, std::string>> WorkerEnv::ToEnv() const {
  std::vector<std::pair<std::string, std::string>> env = {
      {kEnvStoreAddr, store_addr},
      {kEnvJobId, job_id},
      {kEnvAttempt, absl::StrCat(attempt)},
      {kEnvRank, absl::StrCat(rank)},
      {kEnvWorldSize, absl::StrCat(world_size)},
      {kEnvLocalRank, absl::StrCat(local_rank)},
      {kEnvLocalWorldSize, absl::StrCat(local_world_size)},
      {kEnvNodeRank, absl::StrCat(node_rank)},
      {kEnvDevice, device},
      {kEnvJobDir, job_dir},
  };
  auto optional = [&](const char* name, const std::string& value) {
    if (!value.empty()) env.push_back({name, value});
  };
  optional(kEnvAuthTokenFile, auth_token_file);
  optional(kEnvJobSpec, job_spec);
  optional(kEnvFrDumpDir, fr_dump_dir);
  optional(kEnvUploadDir, upload_dir);
  optional(kEnvWorkerFault, fault);
  optional(kEnvTlsCa, tls.ca_file);
  optional(kEnvTlsCert, tls.cert_file);
  optional(kEnvTlsKey, tls.key_file);
  optional(kEnvReplicaDir, replica_dir);
  return env;
}

absl::StatusOr<WorkerEnv> WorkerEnv::FromEnv(const std::function<const char*(const char*)>& getenv) {
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
  RETURN_IF_ERROR(str(kEnvStoreAddr, true, &e.store_addr));
  RETURN_IF_ERROR(str(kEnvJobId, true, &e.job_id));
  if (absl::StrContains(e.job_id, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvJobId, "='", e.job_id, "' must not contain '/'"));
  }
  RETURN_IF_ERROR(num(kEnvAttempt, false, 0, &e.attempt));
  RETURN_IF_ERROR(num(kEnvRank, true, 0, &e.rank));
  RETURN_IF_ERROR(num(kEnvWorldSize, true, 1, &e.world_size));
  if (e.rank >= e.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvRank, "=", e.rank, " must be < ", kEnvWorldSize, "=", e.world_size));
  }
  e.local_rank = e.rank;
  e.local_world_size = e.world_size;
  RETURN_IF_ERROR(num(kEnvLocalRank, false, 0, &e.local_rank));
  RETURN_IF_ERROR(num(kEnvLocalWorldSize, false, 1, &e.local_world_size));
  RETURN_IF_ERROR(num(kEnvNodeRank, false, 0, &e.node_rank));
  RETURN_IF_ERROR(str(kEnvDevice, false, &e.device));
  if (e.device != "cpu" && !absl::StartsWith(e.device, "cuda:")) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvDevice, "='", e.device, "' must be cpu or cuda:N"));
  }
  RETURN_IF_ERROR(str(kEnvJobDir, true, &e.job_dir));
  RETURN_IF_ERROR(str(kEnvAuthTokenFile, false, &e.auth_token_file));
  RETURN_IF_ERROR(str(kEnvJobSpec, false, &e.job_spec));
  RETURN_IF_ERROR(str(kEnvFrDumpDir, false, &e.fr_dump_dir));
  if (e.fr_dump_dir.empty()) e.fr_dump_dir = absl::StrCat(e.job_dir, "/flight");
  RETURN_IF_ERROR(str(kEnvUploadDir, false, &e.upload_dir));
  if (e.upload_dir.empty()) e.upload_dir = e.job_dir;
  RETURN_IF_ERROR(str(kEnvWorkerFault, false, &e.fault));
  RETURN_IF_ERROR(str(kEnvTlsCa, false, &e.tls.ca_file));
  RETURN_IF_ERROR(str(kEnvTlsCert, false, &e.tls.cert_file));
  RETURN_IF_ERROR(str(kEnvTlsKey, false, &e.tls.key_file));
  RETURN_IF_ERROR(str(kEnvReplicaDir, false, &e.replica_dir));
  if (!e.replica_dir.empty() && e.replica_dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(kEnvReplicaDir, "='", e.replica_dir, "' must be an absolute path"));
  }
  if (e.tls.cert_file.empty() != e.tls.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvTlsCert, " and ", kEnvTlsKey,
                                                   " go together (a client certificate and its key)"));
  }
  return e;
}

bool operator==(const WorkerEnv& a, const WorkerEnv& b) {
  auto tie = [](const WorkerEnv& e) {
    return std::tie(e.store_addr, e.job_id, e.attempt, e.rank, e.world_size, e.local_rank,
                    e.local_world_size, e.node_rank, e.device, e.job_dir, e.auth_token_file,
                    e.job_spec, e.fr_dump_dir, e.tls.ca_file, e.tls.cert_file, e.tls.key_file,
                    e.tls.verify_clients, e.upload_dir, e.fault, e.replica_dir);
  };
  return tie(a) == tie(b);
}

}  // namespace ember::job
