#include "runtime/onesided/cuda_ipc.h"

#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#ifdef EMBER_WITH_CUDA
#include <cuda.h>  // types of cuMemGetAddressRange only; the driver is reached through cudart
#include <cuda_runtime_api.h>
#endif

namespace ember::onesided::cuda_ipc {

bool IsExported(absl::string_view key) { return absl::StartsWith(key, kMagic); }

namespace {
constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t), CUDA_IPC_HANDLE_SIZE
constexpr size_t kExportedBytes = kMagic.size() + kHandleBytes + 8;

// A malformed descriptor is refused the same way with or without CUDA built in.
absl::Status CheckExported(absl::string_view exported) {
  if (!IsExported(exported) || exported.size() != kExportedBytes) {
    return absl::InvalidArgumentError(absl::StrCat("not an exported CUDA region (", exported.size(),
                                                   " bytes; expected ", kExportedBytes, ")"));
  }
  return absl::OkStatus();
}
}  // namespace

#ifndef EMBER_WITH_CUDA

namespace {
absl::Status NotBuilt(absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      what, ": this build has no CUDA (no toolkit at configure time; see third_party/cuda), so "
            "GPU memory cannot be registered or imported; use host memory"));
}
}  // namespace

absl::Status Available() { return NotBuilt("CUDA IPC"); }
absl::StatusOr<std::string> Export(const void*, uint64_t) { return NotBuilt("exporting GPU memory"); }
absl::StatusOr<std::unique_ptr<Mapping>> Mapping::Open(absl::string_view exported, uint64_t) {
  if (absl::Status s = CheckExported(exported); !s.ok()) return s;
  return NotBuilt("opening a peer's GPU memory");
}
Mapping::~Mapping() = default;
absl::StatusOr<bool> CopyAsync(const std::vector<Copy>&, void*, std::function<void()>) {
  return NotBuilt("a GPU-memory transfer");
}

#else  // EMBER_WITH_CUDA

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kHandleBytes, "CUDA IPC handle size changed");

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": CUDA error ", static_cast<int>(e), " (",
                                       cudaGetErrorName(e), ": ", cudaGetErrorString(e), ")");
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInitializationError ||
      e == cudaErrorDevicesUnavailable || e == cudaErrorSystemDriverMismatch ||
      e == cudaErrorCompatNotSupportedOnDevice || e == cudaErrorStubLibrary) {
    return absl::FailedPreconditionError(absl::StrCat(
        msg, "; CUDA IPC needs an NVIDIA GPU and its driver on this machine; use host memory here"));
  }
  if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

// The allocation holding `ptr` (cuMemGetAddressRange, reached through the runtime's entry-point
// query, so that only cudart is linked).
absl::StatusOr<uintptr_t> AllocationBase(const void* ptr) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                   cudaEnableDefault, &q);
  if (e != cudaSuccess || fn == nullptr || q != cudaDriverEntryPointSuccess) {
    return CudaError(e == cudaSuccess ? cudaErrorNotSupported : e,
                     "looking up cuMemGetAddressRange in the CUDA driver");
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = reinterpret_cast<Fn>(fn)(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
      r != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuMemGetAddressRange(", absl::Hex(reinterpret_cast<uintptr_t>(ptr)), ") failed with CUresult ",
        static_cast<int>(r), ": not memory from cudaMalloc"));
  }
  return static_cast<uintptr_t>(base);
}

void RunDone(void* arg) {
  auto* done = static_cast<std::function<void()>*>(arg);
  (*done)();
  delete done;
}

}  // namespace

absl::Status Available() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return CudaError(e, "cudaGetDeviceCount");
  if (n == 0) return CudaError(cudaErrorNoDevice, "cudaGetDeviceCount");
  return absl::OkStatus();
}

absl::StatusOr<std::string> Export(const void* ptr, uint64_t bytes) {
  if (absl::Status a = Available(); !a.ok()) return a;
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) return CudaError(e, "cudaPointerGetAttributes");
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exporting ", bytes, " bytes at ", absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
        ": not device memory (CUDA memory type ", static_cast<int>(attr.type),
        "); register it as MemoryKind::kHost"));
  }
  auto base = AllocationBase(ptr);
  if (!base.ok()) return base.status();
  cudaIpcMemHandle_t h;
  e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(*base));
  if (e != cudaSuccess) return CudaError(e, "cudaIpcGetMemHandle");
  std::string out(kMagic);
  out.append(reinterpret_cast<const char*>(&h), kHandleBytes);
  const uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - *base;
  out.append(reinterpret_cast<const char*>(&offset), 8);
  return out;
}

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::Open(absl::string_view exported, uint64_t bytes) {
  if (absl::Status s = CheckExported(exported); !s.ok()) return s;
  if (absl::Status a = Available(); !a.ok()) return a;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, exported.data() + kMagic.size(), kHandleBytes);
  uint64_t offset = 0;
  std::memcpy(&offset, exported.data() + kMagic.size() + kHandleBytes, 8);
  void* base = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    absl::Status st = CudaError(e, "cudaIpcOpenMemHandle");
    if (st.code() == absl::StatusCode::kInternal || st.code() == absl::StatusCode::kInvalidArgument) {
      return absl::FailedPreconditionError(absl::StrCat(
          st.message(), " (the exporter must be another live process on this node)"));
    }
    return st;
  }
  return std::unique_ptr<Mapping>(new Mapping(base, static_cast<char*>(base) + offset, bytes));
}

Mapping::~Mapping() {
  if (base_ != nullptr) cudaIpcCloseMemHandle(base_);
}

absl::StatusOr<bool> CopyAsync(const std::vector<Copy>& copies, void* stream_ptr,
                               std::function<void()> done) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &cs);
  if (e != cudaSuccess) return CudaError(e, "cudaStreamIsCapturing");
  for (const Copy& c : copies) {
    if (c.bytes == 0) continue;
    e = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream);
    if (e != cudaSuccess) return CudaError(e, absl::StrCat("cudaMemcpyAsync of ", c.bytes, " bytes"));
  }
  if (cs == cudaStreamCaptureStatusActive) return true;
  auto* fn = new std::function<void()>(std::move(done));
  e = cudaLaunchHostFunc(stream, &RunDone, fn);
  if (e != cudaSuccess) {
    delete fn;
    return CudaError(e, "cudaLaunchHostFunc");
  }
  return false;
}

#endif  // EMBER_WITH_CUDA

}  // namespace ember::onesided::cuda_ipc
