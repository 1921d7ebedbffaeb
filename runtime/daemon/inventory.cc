#include "runtime/daemon/inventory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/devices.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

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
    if (!cuda || nvml_ == nullptr) continue;
    GpuSample g = nvml_->Sample(std::stoi(id.substr(5)));
    jobs::v1::GpuTelemetry* t = d->mutable_gpu();
    if (g.memory_used_bytes >= 0) t->set_memory_used_bytes(g.memory_used_bytes);
    if (g.memory_total_bytes >= 0) t->set_memory_total_bytes(g.memory_total_bytes);
    if (g.utilization_pct >= 0) t->set_utilization_pct(g.utilization_pct);
    if (g.power_mw >= 0) t->set_power_mw(static_cast<int>(g.power_mw));
    if (g.sm_clock_mhz >= 0) t->set_sm_clock_mhz(g.sm_clock_mhz);
    if (g.temperature_c >= 0) t->set_temperature_c(g.temperature_c);
    t->set_name(g.name);
  }
}

}  // namespace ember::daemon
