#include "runtime/daemon/nvml.h"

#include <dlfcn.h>

namespace ember::daemon {
namespace {

// NVML's ABI (nvml.h): every call returns nvmlReturn_t (0 = NVML_SUCCESS); devices are opaque
// handles; structs below match nvmlMemory_t and nvmlUtilization_t.
using Device = void*;
struct Memory { unsigned long long total, free, used; };
struct Utilization { unsigned int gpu, memory; };
constexpr int kClockSm = 1;                // NVML_CLOCK_SM
constexpr int kTemperatureGpu = 0;         // NVML_TEMPERATURE_GPU
constexpr int kEccCorrected = 0;           // NVML_MEMORY_ERROR_TYPE_CORRECTED
constexpr int kEccUncorrected = 1;         // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kEccVolatile = 0;            // NVML_VOLATILE_ECC

template <typename F>
F Sym(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

}  // namespace

struct Nvml::Api {
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*count)(unsigned int*) = nullptr;
  int (*handle)(unsigned int, Device*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  int (*util)(Device, Utilization*) = nullptr;
  int (*power)(Device, unsigned int*) = nullptr;
  int (*clock)(Device, int, unsigned int*) = nullptr;
  int (*temp)(Device, int, unsigned int*) = nullptr;
  int (*name)(Device, char*, unsigned int) = nullptr;
  int (*uuid)(Device, char*, unsigned int) = nullptr;
  int (*ecc)(Device, int, int, unsigned long long*) = nullptr;
};

std::unique_ptr<Nvml> Nvml::Load() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return nullptr;
  auto api = std::make_unique<Api>();
  api->init = Sym<int (*)()>(lib, "nvmlInit_v2");
  api->shutdown = Sym<int (*)()>(lib, "nvmlShutdown");
  api->count = Sym<int (*)(unsigned int*)>(lib, "nvmlDeviceGetCount_v2");
  api->handle = Sym<int (*)(unsigned int, Device*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  api->memory = Sym<int (*)(Device, Memory*)>(lib, "nvmlDeviceGetMemoryInfo");
  api->util = Sym<int (*)(Device, Utilization*)>(lib, "nvmlDeviceGetUtilizationRates");
  api->power = Sym<int (*)(Device, unsigned int*)>(lib, "nvmlDeviceGetPowerUsage");
  api->clock = Sym<int (*)(Device, int, unsigned int*)>(lib, "nvmlDeviceGetClockInfo");
  api->temp = Sym<int (*)(Device, int, unsigned int*)>(lib, "nvmlDeviceGetTemperature");
  api->name = Sym<int (*)(Device, char*, unsigned int)>(lib, "nvmlDeviceGetName");
  api->uuid = Sym<int (*)(Device, char*, unsigned int)>(lib, "nvmlDeviceGetUUID");
  api->ecc = Sym<int (*)(Device, int, int, unsigned long long*)>(lib, "nvmlDeviceGetTotalEccErrors");
  if (api->init == nullptr || api->count == nullptr || api->handle == nullptr || api->init() != 0) {
    dlclose(lib);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(lib, std::move(api)));
}

Nvml::Nvml(void* lib, std::unique_ptr<Api> api) : lib_(lib), api_(std::move(api)) {}

Nvml::~Nvml() {
  if (api_->shutdown != nullptr) api_->shutdown();
  dlclose(lib_);
}

int Nvml::Count() const {
  std::lock_guard<std::mutex> l(mu_);
  unsigned int c = 0;
  return api_->count(&c) == 0 ? static_cast<int>(c) : 0;
}

GpuSample Nvml::Sample(int index) const {
  std::lock_guard<std::mutex> l(mu_);
  GpuSample s;
  s.index = index;
  Device d = nullptr;
  if (api_->handle(static_cast<unsigned int>(index), &d) != 0) return s;
  char buf[96] = {0};
  if (api_->name && api_->name(d, buf, sizeof(buf)) == 0) s.name = buf;
  char uuid[96] = {0};
  if (api_->uuid && api_->uuid(d, uuid, sizeof(uuid)) == 0) s.uuid = uuid;
  Memory m{};
  if (api_->memory && api_->memory(d, &m) == 0) {
    s.memory_used_bytes = static_cast<int64_t>(m.used);
    s.memory_total_bytes = static_cast<int64_t>(m.total);
  }
  Utilization u{};
  if (api_->util && api_->util(d, &u) == 0) {
    s.utilization_pct = static_cast<int>(u.gpu);
    s.memory_utilization_pct = static_cast<int>(u.memory);
  }
  unsigned int v = 0;
  if (api_->power && api_->power(d, &v) == 0) s.power_mw = v;
  if (api_->clock && api_->clock(d, kClockSm, &v) == 0) s.sm_clock_mhz = static_cast<int>(v);
  if (api_->temp && api_->temp(d, kTemperatureGpu, &v) == 0) s.temperature_c = static_cast<int>(v);
  unsigned long long e = 0;
  if (api_->ecc && api_->ecc(d, kEccCorrected, kEccVolatile, &e) == 0) {
    s.ecc_corrected_volatile = static_cast<int64_t>(e);
  }
  if (api_->ecc && api_->ecc(d, kEccUncorrected, kEccVolatile, &e) == 0) {
    s.ecc_uncorrected_volatile = static_cast<int64_t>(e);
  }
  return s;
}

}  // namespace ember::daemon
