// Device discovery shared by the daemon and workers.
//
// CudaDeviceCount() is 0 on a CPU-only build, and also on a CUDA build where no usable GPU or
// driver exists (cudaGetDeviceCount failing with "driver version is insufficient" or "no device"
// means "no GPUs", never an error). Thread-safe.
#ifndef EMBER_RUNTIME_BASE_DEVICES_H_
#define EMBER_RUNTIME_BASE_DEVICES_H_

#include <string>

namespace ember::base {

// True when this binary was built with CUDA (the toolkit was found at configure time).
bool BuiltWithCuda();

// Number of usable CUDA devices; 0 without CUDA. `why_none` (optional) receives the reason for 0.
int CudaDeviceCount(std::string* why_none = nullptr);

}  // namespace ember::base

#endif  // EMBER_RUNTIME_BASE_DEVICES_H_
