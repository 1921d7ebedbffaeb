// GPU telemetry as emberd reads it (runtime/daemon/nvml.h): loads NVML, prints every device's
// readings and fails (exit 1) when NVML is missing or a value is out of its physical range.
// Run on the GPU machine by tests/gpu/run.sh check.
#include <cstdio>

#include "runtime/daemon/nvml.h"

namespace {

int bad = 0;

void Check(bool ok, int gpu, const char* what, double value) {
  std::printf("  %-28s %.1f %s\n", what, value, ok ? "" : "OUT OF RANGE");
  if (!ok) {
    std::fprintf(stderr, "FAIL: gpu %d %s = %.1f out of range\n", gpu, what, value);
    ++bad;
  }
}

}  // namespace

int main() {
  auto nvml = ember::daemon::Nvml::Load();
  if (nvml == nullptr) {
    std::fprintf(stderr, "FAIL: NVML (libnvidia-ml.so.1) did not load or initialise\n");
    return 1;
  }
  const int n = nvml->Count();
  std::printf("NVML: %d device(s)\n", n);
  if (n < 1) return 1;
  for (int i = 0; i < n; ++i) {
    ember::daemon::GpuSample s = nvml->Sample(i);
    std::printf("gpu %d: %s %s\n", i, s.name.c_str(), s.uuid.c_str());
    if (s.name.empty() || s.uuid.rfind("GPU-", 0) != 0) {
      std::fprintf(stderr, "FAIL: gpu %d name '%s' uuid '%s'\n", i, s.name.c_str(), s.uuid.c_str());
      ++bad;
    }
    Check(s.memory_total_bytes > (int64_t{1} << 30), i, "memory_total_bytes", s.memory_total_bytes);
    Check(s.memory_used_bytes > 0 && s.memory_used_bytes <= s.memory_total_bytes, i,
          "memory_used_bytes", s.memory_used_bytes);
    Check(s.utilization_pct >= 0 && s.utilization_pct <= 100, i, "utilization_pct",
          s.utilization_pct);
    Check(s.power_mw > 1000 && s.power_mw < 1500000, i, "power_mw", s.power_mw);
    Check(s.temperature_c >= 5 && s.temperature_c <= 110, i, "temperature_c", s.temperature_c);
    Check(s.sm_clock_mhz > 0 && s.sm_clock_mhz < 4000, i, "sm_clock_mhz", s.sm_clock_mhz);
    // ECC may be disabled (-1); when on, volatile counts are small non-negative numbers.
    Check(s.ecc_corrected_volatile >= -1, i, "ecc_corrected_volatile", s.ecc_corrected_volatile);
    Check(s.ecc_uncorrected_volatile >= -1 && s.ecc_uncorrected_volatile < 1000, i,
          "ecc_uncorrected_volatile", s.ecc_uncorrected_volatile);
  }
  std::printf(bad == 0 ? "nvml_check: OK\n" : "nvml_check: %d value(s) out of range\n", bad);
  return bad == 0 ? 0 : 1;
}
