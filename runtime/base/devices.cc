#include "runtime/base/devices.h"

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ember::base {

bool BuiltWithCuda() {
#ifdef EMBER_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount(std::string* why_none) {
#ifdef EMBER_WITH_CUDA
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why_none) *why_none = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (n == 0 && why_none) *why_none = "no CUDA devices";
  return n;
#else
  if (why_none) *why_none = "built without CUDA";
  return 0;
#endif
}

}  // namespace ember::base
