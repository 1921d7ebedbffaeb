// GPU telemetry through NVML (libnvidia-ml.so.1), loaded at run time with dlopen so that one emberd
// binary runs on CPU-only nodes: Load() returns null when the library or a GPU driver is absent.
// The few entry points used are declared in nvml.cc from NVML's documented C ABI (no nvml.h needed
// at build time).
//
//   std::unique_ptr<Nvml> nvml = Nvml::Load();           // null: no telemetry, not an error
//   if (nvml) for (int i = 0; i < nvml->Count(); ++i) GpuSample s = nvml->Sample(i);
//
// Thread-safe (reads are serialised on an internal mutex).
#ifndef EMBER_RUNTIME_DAEMON_NVML_H_
#define EMBER_RUNTIME_DAEMON_NVML_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace ember::daemon {

// One device's readings; -1 where NVML could not tell (unsupported on that device).
struct GpuSample {
  int index = 0;
  std::string name, uuid;
  int64_t memory_used_bytes = -1, memory_total_bytes = -1;
  int utilization_pct = -1;         // GPU (SM) busy percentage over NVML's sample period
  int memory_utilization_pct = -1;  // memory controller busy percentage
  int64_t power_mw = -1;
  int sm_clock_mhz = -1;
  int temperature_c = -1;
  int64_t ecc_corrected_volatile = -1;    // single-bit errors since the driver loaded
  int64_t ecc_uncorrected_volatile = -1;  // double-bit errors since the driver loaded
};

class Nvml {
 public:
  static std::unique_ptr<Nvml> Load();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  int Count() const;
  // Readings of device `index` (0 <= index < Count()); fields stay -1 when a call fails.
  GpuSample Sample(int index) const;

  struct Api;  // resolved entry points (nvml.cc)

 private:
  Nvml(void* lib, std::unique_ptr<Api> api);
  void* lib_;
  std::unique_ptr<Api> api_;
  mutable std::mutex mu_;
};

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_NVML_H_
