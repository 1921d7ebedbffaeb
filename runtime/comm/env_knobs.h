// The environment variables the comm layer reads itself, and the one store key it writes and
// polls: every name is declared here once (comm knows nothing of jobs, so it does not use
// runtime/job; tools/check_contract.sh allows `"EMBER_` literals only here and in runtime/job).
// Thread-safe (constants).
#ifndef EMBER_RUNTIME_COMM_ENV_KNOBS_H_
#define EMBER_RUNTIME_COMM_ENV_KNOBS_H_

#include "absl/strings/string_view.h"

namespace ember::comm {

// "1"/"true": every group uses TCP only, never shared memory (process_group.cc).
inline constexpr char kEnvDisableShm[] = "EMBER_COMM_DISABLE_SHM";
// The address this rank advertises to its peers (default 127.0.0.1).
inline constexpr char kEnvHost[] = "EMBER_COMM_HOST";
// Flight-recorder dump directory when GroupOptions::dump_dir is empty. Same name as the worker
// environment's job::kEnvFrDumpDir (the worker sets dump_dir explicitly).
inline constexpr char kEnvFrDumpDir[] = "EMBER_FR_DUMP_DIR";
// Idle rounds a shm waiter spins before sleeping (progress_wait.cc).
inline constexpr char kEnvShmSpin[] = "EMBER_COMM_SHM_SPIN";
// Bytes per staging slot of large shm ops (same value on every rank).
inline constexpr char kEnvDirectStageBytes[] = "EMBER_COMM_DIRECT_STAGE_BYTES";
// "0": no direct (single-copy) shm path for large ops.
inline constexpr char kEnvShmDirect[] = "EMBER_COMM_SHM_DIRECT";
// TCP congestion control of the comm layer's sockets (default "cubic"; "system": the kernel's).
inline constexpr char kEnvTcpCongestion[] = "EMBER_COMM_TCP_CONGESTION";
// Tests: pretend to be another host (ranks with different boot ids never share memory).
inline constexpr char kEnvBootId[] = "EMBER_COMM_BOOT_ID";

// Rendezvous key (relative to the rendezvous' prefix) that asks every rank to dump its flight
// recorder (docs/flight-recorder.md). The job contract names the same key job::keys::kDumpRequest;
// the worker static_asserts that the two agree.
inline constexpr absl::string_view kDumpRequestKey = "fr/dump_request";

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_ENV_KNOBS_H_
