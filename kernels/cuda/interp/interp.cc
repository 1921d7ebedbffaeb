// The CUDA interpreter's runtime: fibers, the block scheduler, the two-order launch check and the
// runtime API on host memory. See cuda_interp.h for the semantics.
#include "kernels/cuda/interp/cuda_interp.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/interp/include/cublasLt.h"

namespace ember_interp {

struct Fiber {
  void* sp = nullptr;
  uint3 tid{0, 0, 0};
  unsigned lane = 0;
  enum State { kRunnable, kBarrier, kWarp, kDone } state = kRunnable;
  unsigned mask = 0;
  const char* what = nullptr;
  uint64_t value = 0;
  uint64_t* out = nullptr;
  char* stack = nullptr;  // lowest usable byte; a guard page lies below
};

}  // namespace ember_interp

extern "C" void ember_interp_switch(void** save_sp, void* to_sp);
extern "C" void ember_interp_trampoline();
extern "C" void ember_interp_fiber_main(ember_interp::Fiber* f);

// Saves the callee-saved registers, mxcsr and the x87 control word on the current stack, stores
// the stack pointer in *save_sp (rdi), switches to to_sp (rsi) and restores the same from there.
asm(R"(
  .text
  .globl ember_interp_switch
  .type ember_interp_switch, @function
ember_interp_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ember_interp_switch, .-ember_interp_switch
  .globl ember_interp_trampoline
  .type ember_interp_trampoline, @function
ember_interp_trampoline:
  movq %r12, %rdi
  andq $-16, %rsp
  call ember_interp_fiber_main@PLT
  ud2
  .size ember_interp_trampoline, .-ember_interp_trampoline
)");

namespace ember_interp {

thread_local Fiber* g_current = nullptr;
thread_local uint3 g_block_idx{0, 0, 0};
thread_local dim3 g_block_dim, g_grid_dim;

namespace {

constexpr size_t kStackBytes = 64 << 10;
constexpr size_t kPage = 4096;

struct BlockRun {
  std::vector<Fiber> fibers;
  void* sched_sp = nullptr;
  const std::function<void()>* body = nullptr;
  bool failed = false;
  std::string error;
};
thread_local BlockRun* g_run = nullptr;
thread_local const char* g_kernel = nullptr;

std::mutex g_mu;  // serializes launches and the runtime API
std::vector<char*> g_stacks;  // pool of fiber stacks (usable part), reused across blocks

struct Allocation {
  char* map;
  size_t map_bytes;
  size_t bytes;
  // The launch check's copies (before the launch, after the forward run), kept between launches
  // so that each launch does not fault fresh pages in.
  std::unique_ptr<char[]> snap, first;
};
std::map<char*, Allocation> g_allocs;  // by user pointer
cudaError_t g_last_error = cudaSuccess;
cudaError_t g_sync_error = cudaSuccess;
std::string g_last_kernel_error;

char* StackFor(size_t i) {
  while (g_stacks.size() <= i) {
    void* m = mmap(nullptr, kStackBytes + kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "cuda interp: mmap of a fiber stack failed\n");
      std::abort();
    }
    mprotect(m, kPage, PROT_NONE);  // guard page: a stack overflow faults
    g_stacks.push_back(static_cast<char*>(m) + kPage);
  }
  return g_stacks[i];
}

std::string Where(const Fiber* f) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "kernel %s block (%u,%u,%u) thread (%u,%u,%u)",
                g_kernel ? g_kernel : "?", g_block_idx.x, g_block_idx.y, g_block_idx.z,
                f ? f->tid.x : 0, f ? f->tid.y : 0, f ? f->tid.z : 0);
  return buf;
}

void Yield(Fiber* f) { ember_interp_switch(&f->sp, g_run->sched_sp); }

void SegvHandler(int sig, siginfo_t* info, void*) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf,
                        "cuda interp: invalid memory access at %p in %s (out of bounds of a "
                        "cudaMalloc allocation, or a fiber stack overflow)\n",
                        info->si_addr, g_current ? Where(g_current).c_str() : "host code");
  if (n > 0) (void)!write(2, buf, static_cast<size_t>(n));
  signal(sig, SIG_DFL);
  raise(sig);
}

// Called by every launch: a test framework may have replaced the handler since the last one.
void InstallSegvHandler() {
  static thread_local std::unique_ptr<char[]> alt;
  if (!alt) {
    alt.reset(new char[1 << 16]);
    stack_t ss{};
    ss.ss_sp = alt.get();
    ss.ss_size = 1 << 16;
    sigaltstack(&ss, nullptr);
  }
  struct sigaction sa {};
  sa.sa_sigaction = SegvHandler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

void Fail(BlockRun& r, const std::string& msg) {
  if (!r.failed) {
    r.failed = true;
    r.error = msg;
  }
}

// Completes the warp collectives of the warp starting at thread w whose lanes have all arrived
// with the same mask; true when any did. Fails the run when a mask names an exited lane.
bool ResolveWarp(BlockRun& r, size_t w, size_t n) {
  bool released = false;
  for (size_t l = w; l < n && l < w + 32; ++l) {
    Fiber& f = r.fibers[l];
    if (f.state != Fiber::kWarp) continue;
    bool ready = true;
    for (unsigned b = 0; b < 32; ++b) {
      if (!(f.mask >> b & 1u)) continue;
      if (w + b >= n || r.fibers[w + b].state == Fiber::kDone) {
        char m[16];
        std::snprintf(m, sizeof m, "%08x", f.mask);
        Fail(r, Where(&f) + ": " + f.what + " with mask 0x" + m + " names lane " +
                    std::to_string(b) + ", which has exited (or does not exist)");
        return false;
      }
      const Fiber& o = r.fibers[w + b];
      if (o.state != Fiber::kWarp || o.mask != f.mask) ready = false;
    }
    if (!ready) continue;
    uint64_t vals[32] = {};
    for (unsigned b = 0; b < 32; ++b)
      if (f.mask >> b & 1u) vals[b] = r.fibers[w + b].value;
    const unsigned mask = f.mask;
    for (unsigned b = 0; b < 32; ++b) {
      if (!(mask >> b & 1u)) continue;
      Fiber& o = r.fibers[w + b];
      std::memcpy(o.out, vals, sizeof vals);
      o.state = Fiber::kRunnable;
    }
    released = true;
  }
  return released;
}

// Runs one block; `reverse` runs the threads in reverse order between synchronization points.
void RunBlock(BlockRun& r, bool reverse) {
  const size_t n = static_cast<size_t>(g_block_dim.x) * g_block_dim.y * g_block_dim.z;
  r.fibers.assign(n, Fiber{});
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    f.tid = uint3{static_cast<unsigned>(i % g_block_dim.x),
                  static_cast<unsigned>(i / g_block_dim.x % g_block_dim.y),
                  static_cast<unsigned>(i / (size_t{g_block_dim.x} * g_block_dim.y))};
    f.lane = static_cast<unsigned>(i % 32);
    f.stack = StackFor(i);
    uint64_t* s = reinterpret_cast<uint64_t*>(f.stack + kStackBytes);
    *--s = 0;  // alignment
    *--s = reinterpret_cast<uint64_t>(&ember_interp_trampoline);
    *--s = 0;                                  // rbp
    *--s = 0;                                  // rbx
    *--s = reinterpret_cast<uint64_t>(&f);     // r12: the fiber
    *--s = 0;                                  // r13
    *--s = 0;                                  // r14
    *--s = 0;                                  // r15
    *--s = (uint64_t{0x037F} << 32) | 0x1F80;  // x87 control word, mxcsr (defaults)
    f.sp = s;
  }
  // Warp-major: each warp runs (its lanes in order) until all its lanes wait at a barrier or
  // have exited, completing its warp collectives as they fill, before the next warp runs; so one
  // warp runs ahead of the others between barriers, as on a GPU. `reverse` reverses both orders.
  const size_t warps = (n + 31) / 32;
  for (;;) {
    for (size_t wk = 0; wk < warps; ++wk) {
      const size_t w = (reverse ? warps - 1 - wk : wk) * 32;
      const size_t lanes = std::min<size_t>(32, n - w);
      for (;;) {
        for (size_t k = 0; k < lanes; ++k) {
          Fiber& f = r.fibers[w + (reverse ? lanes - 1 - k : k)];
          if (f.state != Fiber::kRunnable) continue;
          g_current = &f;
          ember_interp_switch(&r.sched_sp, f.sp);
          g_current = nullptr;
          if (r.failed) return;
        }
        if (!ResolveWarp(r, w, n)) break;
        if (r.failed) return;
      }
      if (r.failed) return;
    }
    size_t done = 0, barrier = 0, warp = 0;
    for (const Fiber& f : r.fibers) {
      done += f.state == Fiber::kDone;
      barrier += f.state == Fiber::kBarrier;
      warp += f.state == Fiber::kWarp;
    }
    if (done == n) return;
    if (barrier > 0 && warp == 0) {
      if (done > 0) {
        const Fiber* waiting = nullptr;
        for (const Fiber& f : r.fibers)
          if (f.state == Fiber::kBarrier) { waiting = &f; break; }
        Fail(r, Where(waiting) + ": __syncthreads: barrier not reached by every thread (" +
                    std::to_string(done) + " of " + std::to_string(n) +
                    " threads exited while " + std::to_string(barrier) + " wait)");
        return;
      }
      for (Fiber& f : r.fibers) f.state = Fiber::kRunnable;
      continue;
    }
    const Fiber* stuck = nullptr;
    for (const Fiber& f : r.fibers)
      if (f.state == Fiber::kWarp) { stuck = &f; break; }
    Fail(r, Where(stuck) + ": deadlock: " + std::to_string(warp) +
                " threads wait at a warp intrinsic whose lanes never arrive with the same mask, " +
                std::to_string(barrier) + " at __syncthreads");
    return;
  }
}

// Runs every block of the grid; false with r.error on a kernel error.
bool RunGrid(const std::function<void()>& body, dim3 grid, dim3 block, bool reverse) {
  BlockRun r;
  r.body = &body;
  g_run = &r;
  g_block_dim = block;
  g_grid_dim = grid;
  const size_t blocks = size_t{grid.x} * grid.y * grid.z;
  for (size_t k = 0; k < blocks; ++k) {
    const size_t b = reverse ? blocks - 1 - k : k;
    g_block_idx = uint3{static_cast<unsigned>(b % grid.x),
                        static_cast<unsigned>(b / grid.x % grid.y),
                        static_cast<unsigned>(b / (size_t{grid.x} * grid.y))};
    RunBlock(r, reverse);
    if (r.failed) {
      g_run = nullptr;
      g_last_kernel_error = r.error;
      return false;
    }
  }
  g_run = nullptr;
  return true;
}

}  // namespace

const uint3& CurrentThreadIdx() { return g_current->tid; }
unsigned LaneId() { return g_current->lane; }

void SyncThreads() {
  Fiber* f = g_current;
  f->state = Fiber::kBarrier;
  Yield(f);
}

void WarpCollective(unsigned mask, const char* what, uint64_t value, uint64_t out[32]) {
  Fiber* f = g_current;
  if (!(mask >> f->lane & 1u)) {
    char m[16];
    std::snprintf(m, sizeof m, "%08x", mask);
    KernelError(std::string(what) + " with mask 0x" + m + " called by lane " +
                std::to_string(f->lane) + ", which the mask does not name");
  }
  f->state = Fiber::kWarp;
  f->mask = mask;
  f->what = what;
  f->value = value;
  f->out = out;
  Yield(f);
}

void KernelError(const std::string& msg) {
  Fiber* f = g_current;
  Fail(*g_run, Where(f) + ": " + msg);
  f->state = Fiber::kDone;
  Yield(f);  // never resumed
  std::abort();
}

std::string LastKernelError() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_last_kernel_error;
}

void Launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t,
            std::function<void()> body) {
  std::lock_guard<std::mutex> l(g_mu);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 ||
      block.z > 64 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    g_last_error = cudaErrorInvalidConfiguration;
    std::fprintf(stderr, "cuda interp: launch of %s refused: grid (%u,%u,%u) block (%u,%u,%u)\n",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    return;
  }
  if (smem > 48 * 1024) {  // no kernel here sets cudaFuncAttributeMaxDynamicSharedMemorySize
    g_last_error = cudaErrorInvalidValue;
    return;
  }
  InstallSegvHandler();
  g_kernel = name;
  // Run 1 (forward order) on a snapshot of device memory; run 2 (reverse) on the same snapshot.
  for (auto& [p, a] : g_allocs) {
    if (!a.snap) {
      a.snap.reset(new char[a.bytes]);
      a.first.reset(new char[a.bytes]);
    }
    std::memcpy(a.snap.get(), p, a.bytes);
  }
  bool ok = RunGrid(body, grid, block, /*reverse=*/false);
  if (ok) {
    for (auto& [p, a] : g_allocs) {
      std::memcpy(a.first.get(), p, a.bytes);
      std::memcpy(p, a.snap.get(), a.bytes);
    }
    ok = RunGrid(body, grid, block, /*reverse=*/true);
    for (auto it = g_allocs.begin(); ok && it != g_allocs.end(); ++it) {
      char* p = it->first;
      const char* first = it->second.first.get();
      const size_t bytes = it->second.bytes;
      if (std::memcmp(p, first, bytes) == 0) continue;
      size_t off = 0;
      while (p[off] == first[off]) ++off;
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "kernel %s: result differs between forward and reverse thread order at "
                    "byte %zu of the %zu-byte allocation %p (a race: a missing __syncthreads or "
                    "__syncwarp, or threads writing the same address)",
                    name, off, bytes, static_cast<void*>(p));
      g_last_kernel_error = buf;
      ok = false;
    }
  }
  g_kernel = nullptr;
  if (!ok) {
    std::fprintf(stderr, "cuda interp: %s\n", g_last_kernel_error.c_str());
    g_last_error = g_sync_error = cudaErrorLaunchFailure;
  }
}

namespace {
// True when [p, p + n) lies inside one allocation (or n == 0).
bool Inside(const void* p, size_t n) {
  if (n == 0) return true;
  const char* c = static_cast<const char*>(p);
  auto it = g_allocs.upper_bound(const_cast<char*>(c));
  if (it == g_allocs.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + it->second.bytes;
}
cudaError_t SetError(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
  return e;
}
}  // namespace

}  // namespace ember_interp

using namespace ember_interp;  // NOLINT: the C API below is global

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  std::lock_guard<std::mutex> l(g_mu);
  return SetError(device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device != 0) {
    std::lock_guard<std::mutex> l(g_mu);
    return SetError(cudaErrorInvalidDevice);
  }
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (ember CUDA interpreter)");
  p->totalGlobalMem = size_t{80} << 30;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 227 << 10;
  p->sharedMemPerMultiprocessor = 228 << 10;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** out, size_t bytes) {
  std::lock_guard<std::mutex> l(g_mu);
  *out = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  const size_t map_bytes = rounded + kPage;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return SetError(cudaErrorMemoryAllocation);
  char* base = static_cast<char*>(m);
  mprotect(base + rounded, kPage, PROT_NONE);  // guard page right after the allocation
  char* p = base + rounded - (bytes + 15) / 16 * 16;  // 16-byte aligned (float4 loads)
  std::memset(p, 0xFF, bytes);
  g_allocs[p] = Allocation{base, map_bytes, bytes, nullptr, nullptr};
  *out = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> l(g_mu);
  if (p == nullptr) return cudaSuccess;
  auto it = g_allocs.find(static_cast<char*>(p));
  if (it == g_allocs.end()) return SetError(cudaErrorInvalidValue);
  munmap(it->second.map, it->second.map_bytes);
  g_allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  std::lock_guard<std::mutex> l(g_mu);
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((dst_dev && !Inside(dst, bytes)) || (src_dev && !Inside(src, bytes))) {
    std::fprintf(stderr, "cuda interp: cudaMemcpy of %zu bytes outside a cudaMalloc allocation\n",
                 bytes);
    return SetError(cudaErrorInvalidValue);
  }
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::lock_guard<std::mutex> l(g_mu);
  if (!Inside(p, bytes)) {
    std::fprintf(stderr, "cuda interp: cudaMemset of %zu bytes outside a cudaMalloc allocation\n",
                 bytes);
    return SetError(cudaErrorInvalidValue);
  }
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}
static cudaError_t TakeSyncError() {
  std::lock_guard<std::mutex> l(g_mu);
  cudaError_t e = g_sync_error;
  g_sync_error = cudaSuccess;
  return e;
}
cudaError_t cudaDeviceSynchronize() { return TakeSyncError(); }
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return TakeSyncError(); }
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new char(0));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return TakeSyncError(); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> l(g_mu);
  cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_last_error;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (CUDA interpreter: see ember_interp::LastKernelError "
             "and stderr)";
    default: return cudaGetErrorName(e);
  }
}

// ---- cuBLASLt: a plain host matmul ----------------------------------------------------------
// Column-major, as cuBLASLt: D(m x n) = epilogue(alpha * op(A) * op(B) + beta * C + bias), op
// from TRANSA/TRANSB, inputs f32 or bf16 (raw bits), fp32 accumulation in k order, C not read
// when beta == 0, bias (f32, length m) added per row of D, GELU the tanh approximation. It checks
// the wrapper's mapping (transposes, leading dimensions, epilogues), not cuBLASLt's numerics.
struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const float* bias = nullptr;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusString(cublasStatus_t st) {
  return st == CUBLAS_STATUS_SUCCESS
             ? "CUBLAS_STATUS_SUCCESS"
             : "CUBLAS_STATUS_NOT_SUPPORTED (a layout, type or epilogue the CUDA interpreter's "
               "host matmul does not handle)";
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t c,
                                        cudaDataType_t scale) {
  if (c != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *d = new cublasLtMatmulDescOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void* v,
                                              size_t n) {
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      if (n != sizeof(d->ta)) return CUBLAS_STATUS_NOT_SUPPORTED;
      std::memcpy(&d->ta, v, n);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (n != sizeof(d->tb)) return CUBLAS_STATUS_NOT_SUPPORTED;
      std::memcpy(&d->tb, v, n);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (n != sizeof(d->epilogue)) return CUBLAS_STATUS_NOT_SUPPORTED;
      std::memcpy(&d->epilogue, v, n);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (n != sizeof(d->bias)) return CUBLAS_STATUS_NOT_SUPPORTED;
      std::memcpy(&d->bias, v, n);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      cudaDataType t;
      if (n != sizeof(t)) return CUBLAS_STATUS_NOT_SUPPORTED;
      std::memcpy(&t, v, n);
      return t == CUDA_R_32F ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType t,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if ((t != CUDA_R_32F && t != CUDA_R_16BF) || ld < static_cast<int64_t>(rows))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  *l = new cublasLtMatrixLayoutOpaque_t{t, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t,
                                                    const void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
namespace {
// op(X)(i, j) of a column-major matrix with layout l, op = t.
float At(const void* p, const cublasLtMatrixLayoutOpaque_t& l, cublasOperation_t t, uint64_t i,
         uint64_t j) {
  const uint64_t r = t == CUBLAS_OP_N ? i : j, c = t == CUBLAS_OP_N ? j : i;
  const uint64_t off = r + c * static_cast<uint64_t>(l.ld);
  if (l.type == CUDA_R_32F) return static_cast<const float*>(p)[off];
  return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[off]) << 16);
}
bool Shape(const cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, uint64_t* k) {
  const uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols;
  *k = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
  const bool bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS ||
                    d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  return am == dd->rows && bk == *k && bn == dd->cols && c->rows == dd->rows &&
         c->cols == dd->cols && a->type == b->type && c->type == CUDA_R_32F &&
         dd->type == CUDA_R_32F && (!bias || d->bias != nullptr);
}
}  // namespace
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* r, int* found) {
  uint64_t k;
  *found = 0;
  if (requested < 1 || !Shape(d, a, b, c, dd, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  *r = cublasLtMatmulHeuristicResult_t{};
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) {
  uint64_t k;
  if (!Shape(d, a, b, c, dd, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const bool bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS ||
                    d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool gelu = d->epilogue == CUBLASLT_EPILOGUE_GELU ||
                    d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  std::vector<float> out(dd->rows * dd->cols);
  for (uint64_t j = 0; j < dd->cols; ++j) {
    for (uint64_t i = 0; i < dd->rows; ++i) {
      float acc = 0;
      for (uint64_t p = 0; p < k; ++p) acc += At(A, *a, d->ta, i, p) * At(B, *b, d->tb, p, j);
      float v = al * acc;
      if (be != 0) v += be * static_cast<const float*>(C)[i + j * c->ld];
      if (bias) v += d->bias[i];
      if (gelu) v = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
      out[i + j * dd->rows] = v;
    }
  }
  // Written after all reads: D may alias C.
  for (uint64_t j = 0; j < dd->cols; ++j)
    for (uint64_t i = 0; i < dd->rows; ++i)
      static_cast<float*>(D)[i + j * dd->ld] = out[i + j * dd->rows];
  return CUBLAS_STATUS_SUCCESS;
}

// A fiber's first frame (entered from ember_interp_trampoline): runs the kernel for this CUDA
// thread, marks it exited and returns to the scheduler for good.
extern "C" void ember_interp_fiber_main(ember_interp::Fiber* f) {
  (*ember_interp::g_run->body)();
  f->state = ember_interp::Fiber::kDone;
  ember_interp::Yield(f);
  std::abort();
}
