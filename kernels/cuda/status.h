// cudaError_t -> absl::Status for //kernels/cuda's host code. Internal.
#ifndef EMBER_KERNELS_CUDA_STATUS_H_
#define EMBER_KERNELS_CUDA_STATUS_H_

#ifdef EMBER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ember::kernels::cuda {

// OK for cudaSuccess; otherwise Internal naming `what` and CUDA's message (the error is cleared).
inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

}  // namespace ember::kernels::cuda

#define EMBER_CUDA_RETURN_IF_ERROR(expr, what)                                        \
  do {                                                                                \
    absl::Status st_ = ::ember::kernels::cuda::CudaStatus((expr), (what));            \
    if (!st_.ok()) return st_;                                                        \
  } while (0)

#endif  // EMBER_WITH_CUDA
#endif  // EMBER_KERNELS_CUDA_STATUS_H_
