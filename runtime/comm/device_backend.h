// The device backends' policy, written once over a CommDriver (comm_driver.h):
//
// - "nccl" (eager): one device per process; the main communicator is created in Connect (at group
//   creation), its unique id published by rank 0 under <prefix>nccl/uid/<n> (the n-th main
//   communicator of the group pairs with the n-th on every rank). P2P runs on the main communicator.
// - "nccl-lazy": the main communicator is created at the first collective; the first send/recv to
//   a peer bootstraps a 2-rank communicator for that pair (the lower rank publishes the id under
//   <prefix>p2p/<lo>-<hi>/<n>; each side's n-th connect to that peer pairs with the other's n-th),
//   so P2P never queues behind collectives. Each pair is created once.
// - "nccl-legacy": communicators at the first collective; several devices per process
//   ("cuda:0,cuda:1": one communicator per device, ranks rank*k+d of size*k, and the op's in/out
//   are arrays of k per-device pointers); P2P as nccl-lazy (one device only). The first legacy
//   backend of a process logs one deprecation warning naming the replacement.
// - "nccl" or "nccl-lazy" given several devices fails, pointing at nccl-legacy.
// - Abort (from the group, the watchdog, or an async error) aborts every communicator of every
//   device backend of this process together: all are marked aborted first (no new op starts on
//   any; ops still running fail with the abort's status), then each is revoked (ncclCommRevoke:
//   the handle stays valid for threads inside a call and for Shrink), so one group's abort cannot
//   wait on another's pending op. A handle is freed only with its last reference.
// - NCCL's non-blocking contract: a call that returns in progress is polled (AsyncError) to
//   completion before the next call on its communicator and before its end event is recorded.
// - Device ops need a current stream (SetCurrentStream): one submitted on the legacy stream fails
//   with FAILED_PRECONDITION.
// - Split uses the driver's split (non-members get FAILED_PRECONDITION, not a hang); Shrink the
//   driver's shrink (survivors only).
//
// Thread-safety: as Backend (backend.h).
#ifndef EMBER_RUNTIME_COMM_DEVICE_BACKEND_H_
#define EMBER_RUNTIME_COMM_DEVICE_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/comm/backend.h"

namespace ember::comm {

enum class DeviceMode { kEager, kLazy, kLegacy };

// "nccl" -> kEager, "nccl-lazy" -> kLazy, "nccl-legacy" -> kLegacy; INVALID_ARGUMENT otherwise.
absl::StatusOr<DeviceMode> ParseDeviceBackend(absl::string_view name);

// The policy backend for options.backend over options.comm_driver (null: MakeNcclDriver, which is
// UNIMPLEMENTED on a build without NCCL).
absl::StatusOr<std::unique_ptr<Backend>> MakeDeviceBackend(BackendOptions options);

namespace internal {
// How many nccl-legacy deprecation warnings this process logged (0 or 1).
int LegacyWarningCount();
}  // namespace internal

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_DEVICE_BACKEND_H_
