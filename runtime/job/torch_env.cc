#include "runtime/job/torch_env.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ember::job {

std::vector<std::pair<std::string, std::string>> TorchEnv::ToEnv() const {
  std::vector<std::pair<std::string, std::string>> env = {
      {kTorchRank, absl::StrCat(rank)},
      {kTorchLocalRank, absl::StrCat(local_rank)},
      {kTorchWorldSize, absl::StrCat(world_size)},
      {kTorchLocalWorldSize, absl::StrCat(local_world_size)},
      {kTorchGroupRank, absl::StrCat(group_rank)},
      {kTorchGroupWorldSize, absl::StrCat(group_world_size)},
      {kTorchRoleRank, absl::StrCat(rank)},
      {kTorchRoleWorldSize, absl::StrCat(world_size)},
      {kTorchRoleName, "default"},
      {kTorchMasterAddr, master_addr},
      {kTorchMasterPort, absl::StrCat(master_port)},
      {kTorchRestartCount, absl::StrCat(restart_count)},
      {kTorchMaxRestarts, absl::StrCat(max_restarts)},
      {kTorchRunId, run_id},
      {kTorchUseAgentStore, "True"},
      {kTorchCudaVisible, cuda ? cuda_visible_devices : ""},
      {kTorchTraceBufferSize, absl::StrCat(kTorchTraceEntries)},
      {kTorchDumpOnTimeout, "1"},
      {kTorchDebugInfoFile, absl::StrCat(flight_dir, "/", kTorchDumpPrefix)},
  };
  if (local_world_size > 1) env.push_back({kTorchOmpThreads, "1"});
  if (!gloo_socket_ifname.empty()) env.push_back({kGlooSocketIfname, gloo_socket_ifname});
  return env;
}

bool IsTorchContractName(absl::string_view name) {
  if (absl::StartsWith(name, "EMBER_")) return true;
  static const char* const kNames[] = {
      kTorchRank,       kTorchLocalRank,      kTorchWorldSize,     kTorchLocalWorldSize,
      kTorchGroupRank,  kTorchGroupWorldSize, kTorchRoleRank,      kTorchRoleWorldSize,
      kTorchRoleName,   kTorchMasterAddr,     kTorchMasterPort,    kTorchRestartCount,
      kTorchMaxRestarts, kTorchRunId,         kTorchUseAgentStore, kTorchCudaVisible,
      kTorchTraceBufferSize, kTorchDumpOnTimeout, kTorchDebugInfoFile};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace ember::job
