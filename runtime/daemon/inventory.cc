#include "runtime/daemon/inventory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/devices.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

// The handful of NVML entry points we use, declared here so nothing needs nvml.h at build time.
class Inventory::Nvml {
 public:
  struct Memory { unsigned long long total, free, used; };
  struct Utilization { unsigned int gpu, memory; };
  using Device = void*;

  static std::unique_ptr<Nvml> Load() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    auto n = std::unique_ptr<Nvml>(new Nvml(lib));
    if (!n->ok_) return nullptr;
    return n;
  }
  ~Nvml() {
    if (shutdown_ != nullptr) shutdown_();
    dlclose(lib_);
  }
  int Count() const {
    unsigned int c = 0;
    return count_(&c) == 0 ? static_cast<int>(c) : 0;
  }
  void Fill(int index, jobs::v1::GpuTelemetry* t) const {
    std::lock_guard<std::mutex> l(mu_);
    Device d = nullptr;
    if (handle_(static_cast<unsigned int>(index), &d) != 0) return;
    Memory m{};
    if (memory_ && memory_(d, &m) == 0) {
      t->set_memory_used_bytes(static_cast<int64_t>(m.used));
      t->set_memory_total_bytes(static_cast<int64_t>(m.total));
    }
    Utilization u{};
    if (util_ && util_(d, &u) == 0) t->set_utilization_pct(static_cast<int>(u.gpu));
    unsigned int v = 0;
    if (power_ && power_(d, &v) == 0) t->set_power_mw(static_cast<int>(v));
    if (clock_ && clock_(d, /*NVML_CLOCK_SM=*/1, &v) == 0) t->set_sm_clock_mhz(static_cast<int>(v));
    if (temp_ && temp_(d, /*NVML_TEMPERATURE_GPU=*/0, &v) == 0) {
      t->set_temperature_c(static_cast<int>(v));
    }
    char name[96] = {0};
    if (name_ && name_(d, name, sizeof(name)) == 0) t->set_name(name);
  }

 private:
  explicit Nvml(void* lib) : lib_(lib) {
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"));
    count_ = reinterpret_cast<int (*)(unsigned int*)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
    handle_ = reinterpret_cast<int (*)(unsigned int, Device*)>(
        dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    memory_ = reinterpret_cast<int (*)(Device, Memory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    util_ = reinterpret_cast<int (*)(Device, Utilization*)>(
        dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    power_ = reinterpret_cast<int (*)(Device, unsigned int*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    clock_ = reinterpret_cast<int (*)(Device, int, unsigned int*)>(
        dlsym(lib, "nvmlDeviceGetClockInfo"));
    temp_ = reinterpret_cast<int (*)(Device, int, unsigned int*)>(
        dlsym(lib, "nvmlDeviceGetTemperature"));
    name_ = reinterpret_cast<int (*)(Device, char*, unsigned int)>(dlsym(lib, "nvmlDeviceGetName"));
    ok_ = init != nullptr && count_ != nullptr && handle_ != nullptr && init() == 0;
    if (!ok_) shutdown_ = nullptr;
  }

  void* lib_;
  bool ok_ = false;
  mutable std::mutex mu_;  // NVML is thread-safe, but we keep telemetry reads one at a time
  int (*shutdown_)() = nullptr;
  int (*count_)(unsigned int*) = nullptr;
  int (*handle_)(unsigned int, Device*) = nullptr;
  int (*memory_)(Device, Memory*) = nullptr;
  int (*util_)(Device, Utilization*) = nullptr;
  int (*power_)(Device, unsigned int*) = nullptr;
  int (*clock_)(Device, int, unsigned int*) = nullptr;
  int (*temp_)(Device, int, unsigned int*) = nullptr;
  int (*name_)(Device, char*, unsigned int) = nullptr;
};

void ReadMemInfo(int64_t* total, int64_t* available) {
  *total = 0;
  *available = 0;
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemTotal:") *total = kb * 1024;
    if (key == "MemAvailable:") *available = kb * 1024;
  }
}

Inventory::Inventory(const InventoryOptions& options) {
  nvml_ = Nvml::Load();
  cuda_ = options.cuda_devices;
  if (cuda_ < 0) {
    std::string why;
    cuda_ = base::CudaDeviceCount(&why);
    if (cuda_ == 0 && nvml_ != nullptr) cuda_ = nvml_->Count();
  }
  cpu_slots_ = options.cpu_slots;
  if (cpu_slots_ < 0) cpu_slots_ = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  for (int i = 0; i < cuda_; ++i) devices_.push_back(absl::StrCat("cuda:", i));
  for (int i = 0; i < cpu_slots_; ++i) devices_.push_back(absl::StrCat("cpu:", i));
  spdlog::info("inventory: {} cuda device(s), {} cpu slot(s), NVML {}", cuda_, cpu_slots_,
               nvml_ ? "loaded" : "not present");
}

Inventory::~Inventory() = default;

bool Inventory::nvml_loaded() const { return nvml_ != nullptr; }

void Inventory::Fill(jobs::v1::Node* node) const {
  node->set_cpu_slots(cpu_slots_);
  int64_t total = 0, avail = 0;
  ReadMemInfo(&total, &avail);
  node->set_memory_total_bytes(total);
  node->set_memory_available_bytes(avail);
  for (const std::string& id : devices_) {
    jobs::v1::Device* d = node->add_devices();
    d->set_id(id);
    bool cuda = id.rfind("cuda:", 0) == 0;
    d->set_kind(cuda ? "cuda" : "cpu");
    if (cuda && nvml_ != nullptr) nvml_->Fill(std::stoi(id.substr(5)), d->mutable_gpu());
  }
}

}  // namespace ember::daemon
