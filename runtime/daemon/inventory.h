// What a node has: CPU slots or CUDA devices, memory, and GPU telemetry through NVML.
//
// NVML (libnvidia-ml.so.1) is loaded at run time with dlopen, so one emberd binary works on CPU-only
// nodes (no telemetry, no error). Thread-safe: Telemetry() may be called from any thread.
#ifndef EMBER_RUNTIME_DAEMON_INVENTORY_H_
#define EMBER_RUNTIME_DAEMON_INVENTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/jobs.pb.h"
#include "runtime/daemon/nvml.h"

namespace ember::daemon {

struct InventoryOptions {
  int cpu_slots = -1;     // CPU ranks this node offers; -1 = online cores
  int cuda_devices = -1;  // -1 = detect (CUDA runtime, then NVML); 0 = none
};

class Inventory {
 public:
  explicit Inventory(const InventoryOptions& options);
  ~Inventory();

  // Devices in placement order: "cuda:0".. then "cpu:0".. (ids are stable for the process life).
  const std::vector<std::string>& devices() const { return devices_; }
  int cpu_slots() const { return cpu_slots_; }
  int cuda_devices() const { return cuda_; }
  bool nvml_loaded() const;
  const Nvml* nvml() const { return nvml_.get(); }  // null without NVML

  // Fills devices (without job ids), memory and GPU telemetry of `node`.
  void Fill(jobs::v1::Node* node) const;

 private:
  std::unique_ptr<Nvml> nvml_;
  int cpu_slots_ = 0;
  int cuda_ = 0;
  std::vector<std::string> devices_;
};

// MemTotal / MemAvailable from /proc/meminfo in bytes (0 when unreadable).
void ReadMemInfo(int64_t* total, int64_t* available);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_INVENTORY_H_
