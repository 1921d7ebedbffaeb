// CpuCommDriver: a CommDriver (comm_driver.h) whose communicators are the cpu backend's, so the
// device backends' policy (device_backend.h) runs with real processes on CPU-only machines.
//
// A unique id is a random string; InitRank connects a cpu backend whose store keys live under
// cpucomm/<id>/. Split publishes (color, key) under cpucomm/<parent id>/split<n>/<rank> and the
// members read every rank's entry (a rank that never calls makes them fail with DEADLINE_EXCEEDED
// after the init timeout, not hang); Shrink connects the survivors under
// cpucomm/<parent id>/shrink<n>/<excluded>. Streams and events are trivial: an op is done when it
// returns, and its "device" times are the host's.
//
// Test hooks: Log() lists what the driver did ("init main rank 0/2", "abort p2p 0-1", ...), and
// InjectAsyncError makes every communicator of this driver report an error to the watchdog.
// Thread-safe.
#ifndef EMBER_RUNTIME_COMM_CPU_COMM_DRIVER_H_
#define EMBER_RUNTIME_COMM_CPU_COMM_DRIVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "runtime/comm/comm_driver.h"
#include "runtime/comm/rendezvous.h"

namespace ember::comm {

class CpuCommDriver : public CommDriver {
 public:
  // `base` supplies the cpu backends' transport options (host, shm); `rdzv` the store.
  CpuCommDriver(std::shared_ptr<Rendezvous> rdzv, BackendOptions base)
      : rdzv_(std::move(rdzv)), base_(std::move(base)) {}

  std::string name() const override { return "cpu-comm"; }
  absl::StatusOr<std::string> NewUniqueId() override;
  absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const std::string& id, int rank, int size,
                                                         const CommInitOptions& o) override;
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> InitRanks(
      const std::string& id, const std::vector<int>& ranks, int size,
      const std::vector<std::string>& devices, const CommInitOptions& o) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Split(Communicator& parent, int color, int key,
                                                      const CommInitOptions& o) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(Communicator& parent,
                                                       const std::vector<int>& excluded,
                                                       const CommInitOptions& o) override;
  absl::Status GroupCollective(const std::vector<Communicator*>& comms,
                               const std::vector<OpDesc>& ops) override;

  // Test hooks.
  std::vector<std::string> Log() const;
  void Note(std::string line);
  void InjectAsyncError(absl::Status s);
  absl::Status injected() const;

 private:
  const std::shared_ptr<Rendezvous> rdzv_;
  const BackendOptions base_;
  mutable absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  absl::Status injected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_CPU_COMM_DRIVER_H_
