// A CUDA interpreter for CPU CI (issue 33): with this header the kernels in kernels/cuda/*.cu
// compile as host C++ (g++ -x c++) and run on the CPU. Each CUDA thread is a fiber with its own
// 64 KiB stack (mmap'ed, guard page below) switched by a hand-written x86-64 context switch
// (interp.cc); the blocks of a grid run one after the other on the calling OS thread. Within a
// block a warp runs (lane by lane, each lane up to its next synchronization point) until all its
// lanes wait at __syncthreads or have exited, completing its warp intrinsics as they fill; then
// the next warp runs. Kernels launch through EMBER_LAUNCH(kernel, grid, block, smem, stream)(...)
// (device_util.cuh; <<<...>>> under nvcc) and declare shared arrays with EMBER_SHARED.
//
// Work is queued per stream and runs when the host synchronizes with it (interp.cc, "streams"):
// the legacy default stream's and non-blocking streams' ordering, events between streams, graph
// capture and replay, so a missing stream dependency reads stale (poisoned) memory.
//
// Checks (a kernel's error is reported when it runs, by the synchronize that ran it and then by
// cudaGetLastError, as cudaErrorLaunchFailure, not sticky, with a message naming kernel, block and
// thread on stderr and in ember_interp::LastKernelError()):
//   - shared memory: every access to an EMBER_SHARED array goes through SharedAccess, a race
//     detector (two threads touch one word between barriers, at least one writing, not ordered by
//     a warp collective of both: kernel, both threads, both source lines, address), plus reads of
//     words the block never wrote and indexes outside the array. Off with
//     EMBER_CUDA_INTERP_RACECHECK=0 / SetSharedChecks(false).
//   - every launch runs twice on the same snapshot of device memory, in forward and in reverse
//     block / warp / lane order; the results must be bitwise equal (global-memory races).
//   - __syncthreads completes when every thread of the block is there; a thread that exits while
//     others wait is "barrier not reached by every thread" (CUDA UB).
//   - warp intrinsics (__shfl_*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp) complete
//     when every lane named in the mask has arrived with the same mask; a mask naming an exited
//     lane, a caller outside its mask, or a shuffle reading a lane outside the mask is an error;
//     lanes that can never meet are a deadlock error.
//   - launch limits of an H100 as the CUDA runtime reports them (cudaErrorInvalidConfiguration;
//     dynamic shared memory above 48 KiB without the cudaFuncSetAttribute opt-in, or above it, or
//     an opt-in above 227 KiB: cudaErrorInvalidValue).
//   - cudaMalloc returns exact-size host allocations, poisoned with 0xFF bytes (NaN), 16-byte
//     aligned and ending at a PROT_NONE guard page; the alignment slack holds 0xFF in the
//     forward run and 0x3F (0.747f) in the reverse one, so a write there is found after the
//     kernel and a read that matters makes the two results differ; further out an access faults
//     (the SIGSEGV handler names the kernel, block and thread); cudaMemcpy / cudaMemset outside
//     an allocation are cudaErrorInvalidValue.
// The device reports itself as an H100 (sm_90, 132 SMs, 48 KiB / 227 KiB opt-in shared memory).
// cuBLASLt (include/cublasLt.h) is a host matmul that validates its arguments as cuBLASLt
// documents them first. Thread-safety: launches and the runtime API are serialized by a
// process-wide mutex (queued work runs under it); __shared__ arrays are function statics (valid
// because one block runs at a time).
#ifndef EMBER_KERNELS_CUDA_INTERP_CUDA_INTERP_H_
#define EMBER_KERNELS_CUDA_INTERP_CUDA_INTERP_H_

#define EMBER_CUDA_INTERP 1

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __grid_constant__
#define __launch_bounds__(...)

// ---- types --------------------------------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorIllegalState = 401,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
struct CUgraphExec_st;
using cudaGraphExec_t = CUgraphExec_st*;
struct CUgraphNode_st;
using cudaGraphNode_t = CUgraphNode_st*;
using cudaHostFn_t = void (*)(void*);
#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
  size_t sharedMemPerMultiprocessor;
};

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

namespace ember_interp {

// ---- execution state (interp.cc) ------------------------------------------------------------
struct Fiber;
// Plain globals, not thread_local: the runtime lock serializes launches, and a thread_local read
// from the kernels' shared object costs a __tls_get_addr call per access.
extern Fiber* g_current;  // the running CUDA thread
extern uint3 g_block_idx;
extern dim3 g_block_dim, g_grid_dim;
const uint3& CurrentThreadIdx();

// Blocks the calling fiber at a block barrier.
void SyncThreads();
// Warp collective: the calling lane posts `value`; returns when every lane in `mask` has posted
// with the same mask; `out` gets the posted values of all 32 lanes (valid for lanes in mask).
void WarpCollective(unsigned mask, const char* what, uint64_t value, uint64_t out[32]);
unsigned LaneId();
[[noreturn]] void KernelError(const std::string& msg);

// The error of the last failed kernel, "" if none ("kernel K: block (x,y,z) thread ...: what").
std::string LastKernelError();

// Launches `body` (runs one CUDA thread's kernel call) on grid x block; returns the launch error
// (configuration) or records a kernel error. `name` names the kernel in messages.
// `args_hash` identifies the argument bytes: a launch equal in kernel, configuration and
// arguments to one the shared-memory checker already checked is not checked again.
void Launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem,
            cudaStream_t s, uint64_t args_hash, std::function<void()> body);
// Queues fn on stream s (it runs when the host synchronizes with s; see interp.cc, streams).
void RunOnStream(cudaStream_t s, std::function<void()> fn);
// Records an asynchronous device error (reported by the next synchronize and cudaGetLastError).
// Called by queued work, which runs with the runtime's lock held.
void DeviceFault(cudaError_t e, const std::string& msg);
// Runs only the blocks `keep(blockIdx, gridDim, blockDim)` accepts, each launch once (no
// two-order check), until reset with an empty function: for tests that address more than 2^31
// elements (cudaMalloc of 1 GiB and more maps memory lazily, unpoisoned) and look at a few blocks.
void SetBlockFilter(std::function<bool(uint3, dim3, dim3)> keep);
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void SetKernelMaxDynamicSharedMemory(const void* kernel, int bytes);

template <typename... P>
struct Launcher {
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  void operator()(P... args) const {
    auto k = kernel;
    std::tuple<std::decay_t<P>...> a(args...);
    uint64_t h = 1469598103934665603ull;  // FNV-1a over each argument's bytes
    auto mix = [&h](const auto& v) {
      const unsigned char* b = reinterpret_cast<const unsigned char*>(&v);
      for (size_t i = 0; i < sizeof(v); ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    std::apply([&mix](const auto&... v) { (mix(v), ...); }, a);
    Launch(name, reinterpret_cast<const void*>(k), grid, block, smem, stream, h,
           [k, a]() { std::apply(k, a); });
  }
};
template <typename... P>
Launcher<P...> MakeLauncher(const char* name, void (*k)(P...), dim3 grid, dim3 block,
                            size_t smem, cudaStream_t s) {
  return Launcher<P...>{name, k, grid, block, smem, s};
}

// ---- shared memory: arrays with a per-access race detector ---------------------------------
// A __shared__ array is declared EMBER_SHARED(type, name, dims) (device_util.cuh; under nvcc
// `__shared__ type name dims`) and becomes a static SharedArray: storage plus a region that
// every access through it reports to SharedAccess (interp.cc). Pointers into shared memory are
// SharedPtr<T> (device_util.cuh's SharedPtr; a raw T* under nvcc); SharedPtr does not convert to
// a raw pointer, so an access that would bypass the detector does not compile. Indexing records
// the source line of the index expression (SharedIndex's default arguments).
struct SharedRegion {
  const char* name;  // the array's name
  const char* file;  // where it is declared
  int line;
  char* base;
  size_t bytes;
  void* shadow;  // interp.cc's per-word records, allocated by SharedRegionInit
};
void SharedRegionInit(SharedRegion* r);
enum SharedAccessKind { kSharedRead = 1, kSharedWrite = 2, kSharedReadWrite = 3 };
// Checks one access of `bytes` at `addr` (inside r or an error) by the running CUDA thread:
// another thread's conflicting access since the last barrier, not ordered by a warp collective
// of both, is a race (KernelError naming both threads, both source lines, the address); so is a
// read of a word no thread of this block has written. No-op when the check is off.
void SharedAccess(const SharedRegion* r, const void* addr, size_t bytes, int kind,
                  const char* file, int line);
// The shared-memory checker is on unless EMBER_CUDA_INTERP_RACECHECK=0; tests may switch it.
void SetSharedChecks(bool on);
bool SharedChecks();
// True while the running grid is checked (the checker is on and this is the forward run: the
// reverse run of the two-order check repeats the same accesses and is not checked again).
extern bool g_checking_shared;

struct SharedIndex {
  int64_t i;
  const char* file;
  int line;
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  SharedIndex(I v, const char* f = __builtin_FILE(), int l = __builtin_LINE())  // NOLINT
      : i(static_cast<int64_t>(v)), file(f), line(l) {}
};

// One element of shared memory: reads and writes go through SharedAccess.
template <typename T>
class SharedRef {
 public:
  SharedRef(const SharedRegion* r, T* p, const char* file, int line)
      : r_(r), p_(p), file_(file), line_(line) {}
  operator std::remove_const_t<T>() const {  // NOLINT: a read
    if (g_checking_shared) SharedAccess(r_, p_, sizeof(T), kSharedRead, file_, line_);
    return *p_;
  }
  T operator=(const std::remove_const_t<T>& v) const {
    if (g_checking_shared) SharedAccess(r_, p_, sizeof(T), kSharedWrite, file_, line_);
    return *p_ = v;
  }
  T operator=(const SharedRef& o) const { return *this = static_cast<T>(o); }
#define EMBER_INTERP_COMPOUND(op)                                   \
  template <typename U>                                             \
  T operator op(const U& v) const {                                 \
    if (g_checking_shared)                                           \
      SharedAccess(r_, p_, sizeof(T), kSharedReadWrite, file_, line_); \
    return *p_ op v;                                                \
  }
  EMBER_INTERP_COMPOUND(+=)
  EMBER_INTERP_COMPOUND(-=)
  EMBER_INTERP_COMPOUND(*=)
  EMBER_INTERP_COMPOUND(/=)
  EMBER_INTERP_COMPOUND(|=)
  EMBER_INTERP_COMPOUND(&=)
#undef EMBER_INTERP_COMPOUND

 private:
  const SharedRegion* r_;
  T* p_;
  const char* file_;
  int line_;
};

// A pointer into a shared array (T may be an array type: a pointer to rows).
template <typename T>
class SharedPtr {
 public:
  SharedPtr() = default;
  SharedPtr(const SharedRegion* r, T* p) : r_(r), p_(p) {}
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U*, T*>>>
  SharedPtr(const SharedPtr<U>& o) : r_(o.region()), p_(o.raw()) {}  // NOLINT
  auto operator[](SharedIndex i) const {
    if constexpr (std::is_array_v<T>) {
      return SharedPtr<std::remove_extent_t<T>>(r_, p_[i.i]);
    } else {
      return SharedRef<T>(r_, p_ + i.i, i.file, i.line);
    }
  }
  SharedPtr operator+(int64_t k) const { return SharedPtr(r_, p_ + k); }
  T* raw() const { return p_; }
  const SharedRegion* region() const { return r_; }

 private:
  const SharedRegion* r_ = nullptr;
  T* p_ = nullptr;
};

// A __shared__ array of type A (e.g. float[32][65]); static storage: one block runs at a time.
template <typename A>
class SharedArray : public SharedPtr<std::remove_extent_t<A>> {
 public:
  SharedArray(const char* name, const char* file, int line)
      : SharedPtr<std::remove_extent_t<A>>(&region_, data_),
        region_{name, file, line, reinterpret_cast<char*>(&data_), sizeof(A), nullptr} {
    SharedRegionInit(&region_);
  }
  SharedArray(const SharedArray&) = delete;
  SharedArray& operator=(const SharedArray&) = delete;

 private:
  alignas(16) A data_;
  SharedRegion region_;
};

template <typename T>
inline uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8, "warp intrinsic value wider than 64 bits");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
template <typename T>
inline T Shuffle(unsigned mask, T v, int src_lane, int width, const char* what, int kind,
                 int arg) {
  uint64_t all[32];
  WarpCollective(mask, what, ToBits(v), all);
  const int lane = static_cast<int>(LaneId());
  const int base = lane & ~(width - 1);
  int src;
  switch (kind) {
    case 0: src = base + (src_lane & (width - 1)); break;                        // idx
    case 1: src = (lane ^ arg) < base + width ? (lane ^ arg) : lane; break;      // xor
    case 2: src = (lane & (width - 1)) + arg < width ? lane + arg : lane; break;  // down
    default: src = (lane & (width - 1)) - arg >= 0 ? lane - arg : lane; break;    // up
  }
  if (!(mask >> src & 1u)) {
    KernelError(std::string(what) + ": lane " + std::to_string(lane) + " reads lane " +
                std::to_string(src) + ", which the mask does not name");
  }
  return FromBits<T>(all[src]);
}

}  // namespace ember_interp

// The opt-in to more than 48 KiB of dynamic shared memory (227 KiB at most on an H100).
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > (227 << 10))
    return cudaErrorInvalidValue;
  ::ember_interp::SetKernelMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), value);
  return cudaSuccess;
}

#define threadIdx (::ember_interp::CurrentThreadIdx())
#define blockIdx (static_cast<const uint3&>(::ember_interp::g_block_idx))
#define blockDim (static_cast<const dim3&>(::ember_interp::g_block_dim))
#define gridDim (static_cast<const dim3&>(::ember_interp::g_grid_dim))
constexpr int warpSize = 32;

// A __shared__ array: EMBER_SHARED(float, red, [32]) is `__shared__ float red[32]` under nvcc.
#define EMBER_SHARED(type, name, dims) \
  static ::ember_interp::SharedArray<type dims> name(#name, __FILE__, __LINE__)

#define EMBER_LAUNCH(kernel, grid, block, smem, stream) \
  ::ember_interp::MakeLauncher(#kernel, kernel, (grid), (block), (smem), (stream))

inline void __syncthreads() { ::ember_interp::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  uint64_t all[32];
  ::ember_interp::WarpCollective(mask, "__syncwarp", 0, all);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return ::ember_interp::Shuffle(mask, v, src, width, "__shfl_sync", 0, 0);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32) {
  return ::ember_interp::Shuffle(mask, v, 0, width, "__shfl_xor_sync", 1, lm);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return ::ember_interp::Shuffle(mask, v, 0, width, "__shfl_down_sync", 2, static_cast<int>(d));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
  return ::ember_interp::Shuffle(mask, v, 0, width, "__shfl_up_sync", 3, static_cast<int>(d));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  uint64_t all[32];
  ::ember_interp::WarpCollective(mask, "__ballot_sync", pred != 0, all);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && all[l]) r |= 1u << l;
  return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }

// CUDA's global min/max overloads.
#define EMBER_INTERP_MINMAX(T)                       \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
EMBER_INTERP_MINMAX(int)
EMBER_INTERP_MINMAX(unsigned)
EMBER_INTERP_MINMAX(long)
EMBER_INTERP_MINMAX(unsigned long)
EMBER_INTERP_MINMAX(long long)
EMBER_INTERP_MINMAX(unsigned long long)
#undef EMBER_INTERP_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

template <typename T>
inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
// Round-to-nearest intrinsics: IEEE single operations on the host (SSE, round to nearest even),
// never contracted into an FMA.
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
#endif  // EMBER_KERNELS_CUDA_INTERP_CUDA_INTERP_H_
