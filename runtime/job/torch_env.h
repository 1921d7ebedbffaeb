// torchrun's environment contract for script jobs (issue 23): what `torch.distributed.run` sets for
// each worker, so that an unmodified script's `init_process_group("env://")` and its reads of
// RANK/LOCAL_RANK/... work under emberd. One definition of every name, here; the daemon fills a
// TorchEnv per rank (supervise.cc) and a spec's worker.env may set none of them except
// OMP_NUM_THREADS (IsTorchContractName), as torchrun too leaves a user's OMP_NUM_THREADS alone.
//
// Differences from torchrun (docs/operations.md "Running PyTorch scripts"):
//   * MASTER_ADDR:MASTER_PORT is a TCPStore-protocol listener the daemon starts per job attempt,
//     not a store hosted by rank 0; TORCHELASTIC_USE_AGENT_STORE=True makes every rank a client
//     (rank 0 would otherwise try to bind MASTER_PORT itself).
//   * TORCHELASTIC_RESTART_COUNT is the Ember attempt number (0, 1, ...), a restart of the whole
//     gang; TORCHELASTIC_RUN_ID is the job id.
//   * The flight-recorder variables (TORCH_NCCL_*) are set on every rank; torch 1.13 (Debian's)
//     reads none of them and gloo never records: they matter from torch 2.2 on with NCCL.
//
// Thread safety: plain value type, pure functions.
#ifndef EMBER_RUNTIME_JOB_TORCH_ENV_H_
#define EMBER_RUNTIME_JOB_TORCH_ENV_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace ember::job {

inline constexpr char kTorchRank[] = "RANK";
inline constexpr char kTorchLocalRank[] = "LOCAL_RANK";
inline constexpr char kTorchWorldSize[] = "WORLD_SIZE";
inline constexpr char kTorchLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kTorchGroupRank[] = "GROUP_RANK";
inline constexpr char kTorchGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kTorchRoleRank[] = "ROLE_RANK";
inline constexpr char kTorchRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kTorchRoleName[] = "ROLE_NAME";
inline constexpr char kTorchMasterAddr[] = "MASTER_ADDR";
inline constexpr char kTorchMasterPort[] = "MASTER_PORT";
inline constexpr char kTorchRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kTorchMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kTorchRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kTorchUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kTorchOmpThreads[] = "OMP_NUM_THREADS";
inline constexpr char kTorchCudaVisible[] = "CUDA_VISIBLE_DEVICES";
inline constexpr char kTorchTraceBufferSize[] = "TORCH_NCCL_TRACE_BUFFER_SIZE";
inline constexpr char kTorchDumpOnTimeout[] = "TORCH_NCCL_DUMP_ON_TIMEOUT";
inline constexpr char kTorchDebugInfoFile[] = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";
// Not torchrun's, and a spec's worker.env (or the daemon's worker_env) may override it: the
// interface gloo binds to. Unset, gloo binds the address the host name resolves to, often
// 127.0.1.1 (Debian's /etc/hosts), and falls back to loopback: unreachable from other nodes.
inline constexpr char kGlooSocketIfname[] = "GLOO_SOCKET_IFNAME";

// The file prefix of PyTorch flight-recorder dumps in an attempt's flight directory: torch writes
// <prefix><rank> (TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank), a pickle (runtime/flight/torch_dump.h).
inline constexpr char kTorchDumpPrefix[] = "torch-rank-";
inline constexpr int kTorchTraceEntries = 2000;

struct TorchEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;         // the node's rank among the job's nodes
  int group_world_size = 1;   // the job's nodes
  std::string master_addr;    // the attempt's TCPStore listener
  int master_port = 0;
  int restart_count = 0;      // the attempt number
  int max_restarts = 0;
  std::string run_id;         // the job id
  // Comma-separated device indices of this node's ranks in local-rank order, so that
  // cuda:LOCAL_RANK is the rank's bound device; "" on CPU (then CUDA_VISIBLE_DEVICES is "" too:
  // a CPU rank sees no GPU).
  std::string cuda_visible_devices;
  bool cuda = false;
  std::string flight_dir;     // <job dir>/flight/attempt-<n>
  // The interface of the node's advertised address (its peers reach it there): GLOO_SOCKET_IFNAME
  // when not "" (the daemon leaves it "" for a loopback or wildcard address: gloo's default).
  std::string gloo_socket_ifname;

  // Every variable above, as torchrun names them; OMP_NUM_THREADS=1 when local_world_size > 1
  // (torchrun's rule; a spec's worker.env may override it); GLOO_SOCKET_IFNAME when set.
  std::vector<std::pair<std::string, std::string>> ToEnv() const;
};

// True for the names ToEnv sets (except OMP_NUM_THREADS and GLOO_SOCKET_IFNAME) and every EMBER_* name: a spec's
// worker.env may not set them.
bool IsTorchContractName(absl::string_view name);

}  // namespace ember::job

#endif  // EMBER_RUNTIME_JOB_TORCH_ENV_H_
