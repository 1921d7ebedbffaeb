// The CUDA interpreter's runtime: fibers, the block scheduler, the two-order launch check and the
// runtime API on host memory. See cuda_interp.h for the semantics.
#include "kernels/cuda/interp/cuda_interp.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
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
  unsigned index = 0;     // linear thread index in the block (warp = index / 32)
  // Vector clock over the lanes of this thread's warp (the shared-memory checker): vc[lane] is
  // this thread's own clock, the others what it has synchronized with through warp collectives.
  uint32_t vc[32] = {};
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

Fiber* g_current = nullptr;
uint3 g_block_idx{0, 0, 0};
dim3 g_block_dim, g_grid_dim;

namespace {

constexpr size_t kStackBytes = 64 << 10;
constexpr size_t kPage = 4096;

struct BlockRun {
  std::vector<Fiber> fibers;
  void* sched_sp = nullptr;
  const std::function<void()>* body = nullptr;
  bool failed = false;
  std::string error;
  // The first read of unwritten shared memory: reported when the block ends without another
  // error (a race on the same word, reported as such, is the likelier cause).
  std::string unwritten_read;
};
BlockRun* g_run = nullptr;
const char* g_kernel = nullptr;
// Barrier intervals of the shared-memory checker: g_interval advances at every block start and
// every completed __syncthreads; g_block_start is the interval the running block started in.
uint64_t g_interval = 0, g_block_start = 0;
}  // namespace
bool g_checking_shared = false;
namespace {
bool g_shared_checks = [] {
  const char* e = std::getenv("EMBER_CUDA_INTERP_RACECHECK");
  return e == nullptr || std::string(e) != "0";
}();

std::mutex g_mu;  // serializes launches and the runtime API
std::vector<char*> g_stacks;  // pool of fiber stacks (usable part), reused across blocks

struct Allocation {
  char* map;
  size_t map_bytes;
  size_t bytes;
  // The launch check's copies (before the launch, after the forward run), kept between launches
  // so that each launch does not fault fresh pages in.
  std::unique_ptr<char[]> snap, first;
  // 1 GiB and more: mapped without reserving memory, not poisoned (zero pages), left out of the
  // two-order check's snapshots, so that a test can address more than 2^31 elements.
  bool lazy = false;
};
// Only the blocks this accepts run (SetBlockFilter); then each launch runs once, forward.
std::function<bool(uint3, dim3, dim3)> g_block_filter;
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
    // The collective orders the participants' shared accesses before it with those after it:
    // every participant's clock becomes the join of theirs, then each ticks its own entry.
    uint32_t join[32] = {};
    for (unsigned b = 0; b < 32; ++b) {
      if (!(mask >> b & 1u)) continue;
      const Fiber& o = r.fibers[w + b];
      for (unsigned k = 0; k < 32; ++k) join[k] = std::max(join[k], o.vc[k]);
    }
    for (unsigned b = 0; b < 32; ++b) {
      if (!(mask >> b & 1u)) continue;
      Fiber& o = r.fibers[w + b];
      std::memcpy(o.out, vals, sizeof vals);
      std::memcpy(o.vc, join, sizeof join);
      ++o.vc[b];
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
  r.unwritten_read.clear();
  g_block_start = ++g_interval;  // shared memory starts unwritten, with no accesses recorded
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = r.fibers[i];
    f.tid = uint3{static_cast<unsigned>(i % g_block_dim.x),
                  static_cast<unsigned>(i / g_block_dim.x % g_block_dim.y),
                  static_cast<unsigned>(i / (size_t{g_block_dim.x} * g_block_dim.y))};
    f.lane = static_cast<unsigned>(i % 32);
    f.index = static_cast<unsigned>(i);
    f.vc[f.lane] = 1;
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
    if (done == n) {
      if (!r.unwritten_read.empty()) Fail(r, r.unwritten_read);
      return;
    }
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
      ++g_interval;  // the barrier orders every shared access before it with every one after
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
    if (g_block_filter && !g_block_filter(g_block_idx, grid, block)) continue;
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

// ---- the shared-memory checker ---------------------------------------------------------------
namespace {

// What the checker knows of one 4-byte word of a shared array in the current barrier interval.
struct SharedWord {
  uint64_t interval = 0;  // the interval the records below belong to (older: none)
  uint64_t written = 0;   // the interval of the last write (before g_block_start: unwritten)
  int32_t writer = -1;    // the thread of the last write in `interval`, -1 none
  uint32_t wclock = 0;    // its own clock at the write
  int32_t rwarp = -1;     // the warp whose lanes read in `interval`; -1 none, -2 several warps
  uint32_t rmask = 0;     // lanes of rwarp that read
  const char* wfile = nullptr;
  int wline = 0;
  // Two readers of different warps (for the report when several warps read).
  int32_t r1 = -1, r2 = -1;
  int r1line = 0, r2line = 0;
  const char *r1file = nullptr, *r2file = nullptr;
};
// A shared array's records: one SharedWord per word, and per lane (lane-major, so one lane's
// sweep over an array touches consecutive memory) the clock and source line of its last read.
struct SharedShadow {
  explicit SharedShadow(size_t n)
      : words(n), n(n), clock(32 * n), line(32 * n), file(32 * n) {}
  std::vector<SharedWord> words;
  size_t n;
  std::vector<uint32_t> clock;
  std::vector<int> line;
  std::vector<const char*> file;
};

std::string ThreadName(unsigned index) {
  const unsigned x = g_block_dim.x, y = g_block_dim.y;
  return "(" + std::to_string(index % x) + "," + std::to_string(index / x % y) + "," +
         std::to_string(index / (x * y)) + ")";
}

// True when `other`'s access at clock `c` happens before the current point of `f`: same thread,
// or same warp and synchronized since through a warp collective of both.
bool Ordered(const Fiber& f, int32_t other, uint32_t c) {
  if (static_cast<unsigned>(other) == f.index) return true;
  if (static_cast<unsigned>(other) / 32 != f.index / 32) return false;
  return c <= f.vc[other % 32];
}

[[noreturn]] void SharedError(const SharedRegion* r, const char* addr, const char* what,
                              const char* file, int line, int32_t other, const char* ofile,
                              int oline, const char* odid) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%p, byte %zu of", static_cast<const void*>(addr),
                static_cast<size_t>(addr - r->base));
  std::string msg = std::string("shared-memory race: ") + what + " " + r->name + " (" + buf +
                    " __shared__ " + r->name + " declared at " + r->file + ":" +
                    std::to_string(r->line) + ") at " + file + ":" + std::to_string(line);
  if (other >= 0) {
    msg += "; thread " + ThreadName(static_cast<unsigned>(other)) + " " + odid + " it at " +
           ofile + ":" + std::to_string(oline) + " since the last __syncthreads, and no barrier" +
           (static_cast<unsigned>(other) / 32 == g_current->index / 32
                ? " or __syncwarp/shuffle of both lanes"
                : " (the threads are in different warps)") +
           " orders the two";
  }
  KernelError(msg);
}

}  // namespace

void SetSharedChecks(bool on) { g_shared_checks = on; }
bool SharedChecks() { return g_shared_checks; }

void SharedRegionInit(SharedRegion* r) {
  r->shadow = new SharedShadow((r->bytes + 3) / 4);  // lives as long as the static array
}

void SharedAccess(const SharedRegion* r, const void* addr, size_t bytes, int kind,
                  const char* file, int line) {
  if (g_current == nullptr) return;
  const char* a = static_cast<const char*>(addr);
  if (a < r->base || a + bytes > r->base + r->bytes) {
    KernelError(std::string("shared-memory access out of bounds: ") + std::to_string(bytes) +
                " bytes at offset " + std::to_string(static_cast<int64_t>(a - r->base)) +
                " of __shared__ " + r->name + " (" + std::to_string(r->bytes) +
                " bytes, declared at " + r->file + ":" + std::to_string(r->line) + ") at " +
                file + ":" + std::to_string(line));
  }
  Fiber& f = *g_current;
  const unsigned lane = f.lane;
  const int32_t me = static_cast<int32_t>(f.index), warp = static_cast<int32_t>(f.index / 32);
  SharedShadow& sh = *static_cast<SharedShadow*>(r->shadow);
  SharedWord* words = sh.words.data();
  uint32_t* my_clock = sh.clock.data() + lane * sh.n;
  const size_t w0 = static_cast<size_t>(a - r->base) / 4;
  const size_t w1 = static_cast<size_t>(a - r->base + bytes - 1) / 4;
  for (size_t wi = w0; wi <= w1; ++wi) {
    SharedWord& w = words[wi];
    // Fast path: this thread read the word before in this interval at its current clock (no
    // write since, which would have cleared rmask), or several warps read it and nobody wrote.
    if (kind == kSharedRead && w.interval == g_interval &&
        ((w.rwarp == warp && (w.rmask >> lane & 1u) && my_clock[wi] == f.vc[lane]) ||
         (w.rwarp == -2 && w.writer < 0))) {
      continue;
    }
    if (w.interval != g_interval) {
      w.interval = g_interval;
      w.writer = -1;
      w.rwarp = -1;
      w.rmask = 0;
      w.r1 = w.r2 = -1;
    }
    if (kind & kSharedRead) {
      if (w.written < g_block_start && g_run->unwritten_read.empty()) {
        g_run->unwritten_read =
            Where(&f) + ": shared-memory read of a word no thread of this block wrote: " +
            r->name + " byte " + std::to_string(wi * 4) + " (__shared__ " + r->name +
            " declared at " + r->file + ":" + std::to_string(r->line) + ") at " + file + ":" +
            std::to_string(line);
      }
      if (w.writer >= 0 && !Ordered(f, w.writer, w.wclock)) {
        SharedError(r, a, "reads", file, line, w.writer, w.wfile, w.wline, "wrote");
      }
      if (!(kind & kSharedWrite)) {
        if (w.rwarp == -1) {
          w.rwarp = warp;
          w.r1 = me;
          w.r1file = file;
          w.r1line = line;
        } else if (w.rwarp >= 0 && w.rwarp != warp) {
          w.rwarp = -2;
          w.r2 = me;
          w.r2file = file;
          w.r2line = line;
        }
        if (w.rwarp == warp) {
          w.rmask |= 1u << lane;
          my_clock[wi] = f.vc[lane];
          sh.line[lane * sh.n + wi] = line;
          sh.file[lane * sh.n + wi] = file;
        }
      }
    }
    if (kind & kSharedWrite) {
      if (w.writer >= 0 && !Ordered(f, w.writer, w.wclock)) {
        SharedError(r, a, "writes", file, line, w.writer, w.wfile, w.wline, "wrote");
      }
      if (w.rwarp == -2 || (w.rwarp >= 0 && w.rwarp != warp)) {
        const bool first_other = w.r1 / 32 != warp;
        SharedError(r, a, "writes", file, line, first_other ? w.r1 : w.r2,
                    first_other ? w.r1file : w.r2file, first_other ? w.r1line : w.r2line, "read");
      }
      if (w.rwarp == warp) {
        for (unsigned l = 0; l < 32; ++l) {
          if (!(w.rmask >> l & 1u) || l == lane) continue;
          if (sh.clock[l * sh.n + wi] > f.vc[l]) {
            SharedError(r, a, "writes", file, line, warp * 32 + static_cast<int32_t>(l),
                        sh.file[l * sh.n + wi], sh.line[l * sh.n + wi], "read");
          }
        }
      }
      // Every earlier access is ordered before this write: later ones need only check it.
      w.writer = me;
      w.wclock = f.vc[lane];
      w.wfile = file;
      w.wline = line;
      w.rwarp = -1;
      w.rmask = 0;
      w.r1 = w.r2 = -1;
      w.written = g_interval;
    }
  }
}

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

namespace {

// ---- streams: work queued per stream, run at synchronization points ---------------------------
// Each stream holds a FIFO of operations (kernels, copies, memsets, cuBLASLt calls, event
// records, host functions) that run only when the host synchronizes with them: a
// cudaStreamSynchronize / cudaEventSynchronize / cudaDeviceSynchronize, a synchronous cudaMemcpy
// (on the legacy default stream), a cudaMemcpyAsync to host memory (pageable: synchronous), a
// cudaFree (an implicit device synchronization). Running an operation first runs what it waits
// for: the earlier operations of its stream, the stream point of each event it waits on, and,
// for the legacy default stream, what was queued before on every blocking stream (and for a
// blocking stream, what was queued before on the legacy stream). Nothing else runs, so an
// operation on one stream that needs another stream's result without an event wait reads the
// memory as it was before: a missing stream dependency is a wrong result. Non-blocking streams
// (cudaStreamNonBlocking) do not synchronize with the legacy stream.
struct Op {
  uint64_t seq;
  std::vector<std::pair<CUstream_st*, uint64_t>> waits;  // run these stream points first
  std::function<void()> fn;
};

}  // namespace
}  // namespace ember_interp

struct CUgraph_st {
  std::vector<std::function<void()>> ops;  // in capture order
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};
struct CUstream_st {
  bool legacy = false;
  bool blocking = true;  // synchronizes with the legacy stream
  bool destroyed = false;
  std::deque<ember_interp::Op> q;
  uint64_t enqueued = 0, done = 0;  // sequence numbers
  CUgraph_st* capture = nullptr;    // capturing into this graph
  bool capture_origin = false;      // cudaStreamBeginCapture was called on this stream
  bool capture_invalid = false;
};
struct CUevent_st {
  CUstream_st* stream = nullptr;  // where it was last recorded (null: never)
  uint64_t seq = 0;
  bool done = false;
  double ms = 0;  // host time when it completed
  CUgraph_st* captured = nullptr;  // recorded during a capture into this graph
};

namespace ember_interp {
namespace {

CUstream_st g_legacy_stream = [] {
  CUstream_st s;
  s.legacy = true;
  return s;
}();
std::vector<CUstream_st*> g_streams;  // created, not destroyed (newest last)
std::map<const void*, int> g_max_dynamic_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize

CUstream_st* S(cudaStream_t s) {
  const auto v = reinterpret_cast<uintptr_t>(s);
  return v <= 2 ? &g_legacy_stream : s;  // 0, cudaStreamLegacy (1), cudaStreamPerThread (2)
}

bool AnyCapture() {
  for (CUstream_st* s : g_streams)
    if (s->capture != nullptr) return true;
  return false;
}

// Runs stream s up to (and including) operation `seq`.
void RunUntil(CUstream_st* s, uint64_t seq) {
  while (s->done < seq && !s->q.empty()) {
    Op op = std::move(s->q.front());
    s->q.pop_front();
    for (const auto& [other, n] : op.waits) RunUntil(other, n);
    op.fn();
    s->done = op.seq;
  }
}
void RunAll() {
  // Newest stream first: any order the dependencies allow is what a GPU may do.
  for (auto it = g_streams.rbegin(); it != g_streams.rend(); ++it) RunUntil(*it, (*it)->enqueued);
  RunUntil(&g_legacy_stream, g_legacy_stream.enqueued);
}

// Queues fn on s (or appends it to the graph s captures into); returns its sequence number (0
// when captured). Caller holds g_mu.
uint64_t Enqueue(CUstream_st* s, std::function<void()> fn,
                 std::vector<std::pair<CUstream_st*, uint64_t>> waits = {}) {
  if (s->capture != nullptr) {
    s->capture->ops.push_back(std::move(fn));
    return 0;
  }
  if (s->legacy) {
    for (CUstream_st* o : g_streams)
      if (o->blocking && o->enqueued > o->done) waits.emplace_back(o, o->enqueued);
  } else if (s->blocking && g_legacy_stream.enqueued > g_legacy_stream.done) {
    waits.emplace_back(&g_legacy_stream, g_legacy_stream.enqueued);
  }
  Op op{++s->enqueued, std::move(waits), std::move(fn)};
  s->q.push_back(std::move(op));
  return s->enqueued;
}

// The legacy stream may not be used while a stream captures (cudaStreamCaptureModeGlobal /
// ThreadLocal): that invalidates the capture. Caller holds g_mu.
bool LegacyUseBreaksCapture(CUstream_st* s) {
  if (!s->legacy || !AnyCapture()) return false;
  for (CUstream_st* o : g_streams)
    if (o->capture != nullptr) o->capture_invalid = true;
  g_last_error = cudaErrorStreamCaptureImplicit;
  return true;
}

double NowMs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Runs a kernel now (two orders, compared). Caller holds g_mu.
// Launches the shared-memory checker has checked (kernel, configuration, argument bytes): a
// repeat (the op tests run every op twice) makes the same accesses unless they depend on the
// data, and is not checked again, which halves the checker's cost in the op tests.
std::set<uint64_t> g_checked_launches;

void ExecuteKernel(const char* name, dim3 grid, dim3 block, uint64_t key,
                   const std::function<void()>& body) {
  InstallSegvHandler();
  g_kernel = name;
  // Run 1 (forward order) on a snapshot of device memory; run 2 (reverse) on the same snapshot.
  // The alignment slack after each allocation (up to 15 bytes before its guard page) holds 0xFF
  // bytes (NaN) in run 1 and 0x3F bytes (0.747f, a normal number, so arithmetic on it changes it)
  // in run 2: a write there changes one of them, a read that matters makes the results differ.
  const bool two_orders = !g_block_filter;
  for (auto& [p, a] : g_allocs) {
    if (a.lazy || !two_orders) continue;
    if (!a.snap) {
      a.snap.reset(new char[a.bytes]);
      a.first.reset(new char[a.bytes]);
    }
    std::memcpy(a.snap.get(), p, a.bytes);
  }
  auto slack_changed = [&](unsigned char fill) {
    for (auto it = g_allocs.begin(); it != g_allocs.end(); ++it) {
      const Allocation& a = it->second;
      if (a.lazy) continue;
      const size_t end = (a.bytes + 15) / 16 * 16;
      for (size_t i = a.bytes; i < end; ++i) {
        if (static_cast<unsigned char>(it->first[i]) == fill) continue;
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "kernel %s wrote past the end of a cudaMalloc allocation: byte %zu of the "
                      "%zu-byte allocation %p (an out-of-bounds write inside its 16-byte "
                      "alignment slack)",
                      name, i, a.bytes, static_cast<void*>(it->first));
        g_last_kernel_error = buf;
        return true;
      }
    }
    return false;
  };
  auto fill_slack = [&](unsigned char fill) {
    for (auto& [p, a] : g_allocs)
      if (!a.lazy) std::memset(p + a.bytes, fill, (a.bytes + 15) / 16 * 16 - a.bytes);
  };
  g_checking_shared = g_shared_checks && g_checked_launches.count(key) == 0;
  bool ok = RunGrid(body, grid, block, /*reverse=*/false);
  g_checking_shared = false;
  if (ok && slack_changed(0xFF)) ok = false;
  if (ok && two_orders) {
    for (auto& [p, a] : g_allocs) {
      if (a.lazy) continue;
      std::memcpy(a.first.get(), p, a.bytes);
      std::memcpy(p, a.snap.get(), a.bytes);
    }
    fill_slack(0x3F);
    ok = RunGrid(body, grid, block, /*reverse=*/true);
    if (ok && slack_changed(0x3F)) ok = false;
    for (auto it = g_allocs.begin(); ok && it != g_allocs.end(); ++it) {
      if (it->second.lazy) continue;
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
                    "__syncwarp, or threads writing the same address; or a read past the end of "
                    "an allocation, whose slack differs between the two runs)",
                    name, off, bytes, static_cast<void*>(p));
      g_last_kernel_error = buf;
      ok = false;
    }
  }
  fill_slack(0xFF);
  g_kernel = nullptr;
  if (ok && g_shared_checks) g_checked_launches.insert(key);
  if (!ok) {
    std::fprintf(stderr, "cuda interp: %s\n", g_last_kernel_error.c_str());
    g_last_error = g_sync_error = cudaErrorLaunchFailure;
  }
}

}  // namespace

void RunOnStream(cudaStream_t stream, std::function<void()> fn) {
  std::lock_guard<std::mutex> l(g_mu);
  Enqueue(S(stream), std::move(fn));
}

void DeviceFault(cudaError_t e, const std::string& msg) {
  g_last_kernel_error = msg;
  std::fprintf(stderr, "cuda interp: %s\n", msg.c_str());
  g_last_error = g_sync_error = e;
}

void SetBlockFilter(std::function<bool(uint3, dim3, dim3)> keep) {
  std::lock_guard<std::mutex> l(g_mu);
  g_block_filter = std::move(keep);
}

void SetKernelMaxDynamicSharedMemory(const void* kernel, int bytes) {
  std::lock_guard<std::mutex> l(g_mu);
  g_max_dynamic_smem[kernel] = bytes;
}

void Launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem,
            cudaStream_t stream, uint64_t args_hash, std::function<void()> body) {
  std::lock_guard<std::mutex> l(g_mu);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 ||
      block.z > 64 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    g_last_error = cudaErrorInvalidConfiguration;
    std::fprintf(stderr,
                 "cuda interp: launch of %s refused (cudaErrorInvalidConfiguration): grid "
                 "(%u,%u,%u) block (%u,%u,%u); limits: 1024 threads per block, block (1024, "
                 "1024, 64), grid (2^31-1, 65535, 65535)\n",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    return;
  }
  // Dynamic shared memory: 48 KiB unless the kernel opted in to more (up to 227 KiB) with
  // cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
  auto opt = g_max_dynamic_smem.find(kernel);
  const size_t limit = opt != g_max_dynamic_smem.end() ? static_cast<size_t>(opt->second)
                                                       : size_t{48} << 10;
  if (smem > limit) {
    g_last_error = cudaErrorInvalidValue;
    std::fprintf(stderr,
                 "cuda interp: launch of %s refused (cudaErrorInvalidValue): %zu bytes of "
                 "dynamic shared memory, above the kernel's %zu (48 KiB without "
                 "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize), 227 KiB "
                 "at most)\n",
                 name, smem, limit);
    return;
  }
  CUstream_st* s = S(stream);
  if (LegacyUseBreaksCapture(s)) return;
  // The launch's identity for the shared-memory checker (see ExecuteKernel).
  uint64_t key = args_hash ^ reinterpret_cast<uintptr_t>(kernel) * 0x9E3779B97F4A7C15ull;
  for (unsigned v : {grid.x, grid.y, grid.z, block.x, block.y, block.z})
    key = (key ^ v) * 1099511628211ull;
  Enqueue(s, [name, grid, block, key, body = std::move(body)]() {
    ExecuteKernel(name, grid, block, key, body);
  });
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
cudaError_t TakeSyncError() {
  cudaError_t e = g_sync_error;
  g_sync_error = cudaSuccess;
  return e;
}
// Synchronization inside a capture is an error that invalidates it.
bool SyncBreaksCapture(CUstream_st* s) {
  if (s->capture == nullptr) return false;
  s->capture_invalid = true;
  g_last_error = cudaErrorStreamCaptureUnsupported;
  return true;
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

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(p.sharedMemPerMultiprocessor);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    default: {
      std::lock_guard<std::mutex> l(g_mu);
      return SetError(cudaErrorInvalidValue);
    }
  }
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 12080;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 12080;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** out, size_t bytes) {
  std::lock_guard<std::mutex> l(g_mu);
  *out = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  const size_t map_bytes = rounded + kPage;
  const bool lazy = bytes >= (size_t{1} << 30);
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (lazy ? MAP_NORESERVE : 0), -1, 0);
  if (m == MAP_FAILED) return SetError(cudaErrorMemoryAllocation);
  char* base = static_cast<char*>(m);
  mprotect(base + rounded, kPage, PROT_NONE);  // guard page right after the allocation
  char* p = base + rounded - (bytes + 15) / 16 * 16;  // 16-byte aligned (float4 loads)
  // Poisoned (NaN); the alignment slack after the end too: a write there is found after the
  // kernel (ExecuteKernel), one further faults at the guard page.
  if (!lazy) std::memset(p, 0xFF, (bytes + 15) / 16 * 16);
  Allocation a{base, map_bytes, bytes, nullptr, nullptr};
  a.lazy = lazy;
  g_allocs[p] = std::move(a);
  *out = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> l(g_mu);
  if (p == nullptr) return cudaSuccess;
  auto it = g_allocs.find(static_cast<char*>(p));
  if (it == g_allocs.end()) return SetError(cudaErrorInvalidValue);
  RunAll();  // cudaFree synchronizes the device: queued work may still use the memory
  munmap(it->second.map, it->second.map_bytes);
  g_allocs.erase(it);
  return cudaSuccess;
}

namespace {
// A copy's direction: (destination on the device, source on the device).
std::pair<bool, bool> Sides(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDefault) return {Inside(dst, bytes ? 1 : 0), Inside(src, bytes ? 1 : 0)};
  return {kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice,
          kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice};
}
// Queues (or runs) a copy on s. Caller holds g_mu.
cudaError_t Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, CUstream_st* s,
                 bool sync) {
  const auto [dst_dev, src_dev] = Sides(dst, src, bytes, kind);
  if ((dst_dev && !Inside(dst, bytes)) || (src_dev && !Inside(src, bytes))) {
    std::fprintf(stderr,
                 "cuda interp: cudaMemcpy%s of %zu bytes: the %s range is outside every "
                 "cudaMalloc allocation (cudaErrorInvalidValue)\n",
                 sync ? "" : "Async", bytes, dst_dev && !Inside(dst, bytes) ? "destination"
                                                                           : "source");
    return SetError(cudaErrorInvalidValue);
  }
  if (bytes == 0) return cudaSuccess;
  if (LegacyUseBreaksCapture(s)) return cudaErrorStreamCaptureImplicit;
  if (!dst_dev && !src_dev) {  // host to host: the host does it
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  std::function<void()> fn;
  if (!src_dev && s->capture == nullptr) {
    // From pageable host memory the source is consumed by the call.
    std::shared_ptr<std::vector<char>> staged =
        std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                            static_cast<const char*>(src) + bytes);
    fn = [dst, staged]() { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    fn = [dst, src, bytes]() { std::memmove(dst, src, bytes); };
  }
  const uint64_t seq = Enqueue(s, std::move(fn));
  // Synchronous copies, and copies into pageable host memory, return when done.
  if (seq != 0 && (sync || !dst_dev)) RunUntil(s, seq);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  std::lock_guard<std::mutex> l(g_mu);
  return Copy(dst, src, bytes, kind, &g_legacy_stream, /*sync=*/true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  std::lock_guard<std::mutex> l(g_mu);
  return Copy(dst, src, bytes, kind, S(s), /*sync=*/false);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::mutex> l(g_mu);
  if (!Inside(p, bytes)) {
    std::fprintf(stderr,
                 "cuda interp: cudaMemset of %zu bytes outside every cudaMalloc allocation "
                 "(cudaErrorInvalidValue)\n",
                 bytes);
    return SetError(cudaErrorInvalidValue);
  }
  CUstream_st* s = S(stream);
  if (bytes == 0) return cudaSuccess;
  if (LegacyUseBreaksCapture(s)) return cudaErrorStreamCaptureImplicit;
  Enqueue(s, [p, value, bytes]() { std::memset(p, value, bytes); });
  return cudaSuccess;
}
// cudaMemset is queued on the legacy stream (asynchronous to the host for device memory).
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  return cudaMemsetAsync(p, value, bytes, nullptr);
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  std::lock_guard<std::mutex> l(g_mu);
  CUstream_st* s = S(stream);
  if (LegacyUseBreaksCapture(s)) return cudaErrorStreamCaptureImplicit;
  Enqueue(s, [fn, data]() { fn(data); });
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> l(g_mu);
  if (AnyCapture()) {
    for (CUstream_st* o : g_streams)
      if (o->capture != nullptr) o->capture_invalid = true;
    return SetError(cudaErrorStreamCaptureUnsupported);
  }
  RunAll();
  return TakeSyncError();
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  std::lock_guard<std::mutex> l(g_mu);
  if (flags & ~cudaStreamNonBlocking) return SetError(cudaErrorInvalidValue);
  CUstream_st* st = new CUstream_st;
  st->blocking = !(flags & cudaStreamNonBlocking);
  g_streams.push_back(st);
  *s = st;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> l(g_mu);
  if (s == nullptr || S(s)->legacy) return SetError(cudaErrorInvalidResourceHandle);
  // Queued work still completes; the object stays (events may name it), marked destroyed.
  RunUntil(s, s->enqueued);
  s->destroyed = true;
  g_streams.erase(std::remove(g_streams.begin(), g_streams.end(), s), g_streams.end());
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard<std::mutex> l(g_mu);
  CUstream_st* s = S(stream);
  if (SyncBreaksCapture(s)) return cudaErrorStreamCaptureUnsupported;
  if (s->legacy) {
    RunAll();  // the legacy stream waits for every blocking stream
  } else {
    RunUntil(s, s->enqueued);
  }
  return TakeSyncError();
}
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> l(g_mu);
  // A recorded event may be destroyed before it completes (CUDA releases it then): the queued
  // record, which writes the event, runs first.
  if (e != nullptr && e->stream != nullptr) RunUntil(e->stream, e->seq);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  std::lock_guard<std::mutex> l(g_mu);
  if (e == nullptr) return SetError(cudaErrorInvalidResourceHandle);
  CUstream_st* s = S(stream);
  if (LegacyUseBreaksCapture(s)) return cudaErrorStreamCaptureImplicit;
  if (s->capture != nullptr) {
    // Recorded inside a capture: another stream that waits on it joins the capture.
    e->captured = s->capture;
    e->stream = nullptr;
    s->capture->ops.push_back([e]() { e->ms = NowMs(); });
    return cudaSuccess;
  }
  e->captured = nullptr;
  e->done = false;
  e->stream = s;
  e->seq = Enqueue(s, [e]() {
    e->done = true;
    e->ms = NowMs();
  });
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned) {
  std::lock_guard<std::mutex> l(g_mu);
  if (e == nullptr) return SetError(cudaErrorInvalidResourceHandle);
  CUstream_st* s = S(stream);
  if (e->captured != nullptr) {
    if (s->capture == nullptr) s->capture = e->captured;  // fork: s joins the capture
    return cudaSuccess;  // a graph replays in capture order
  }
  if (e->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  if (s->capture != nullptr) {
    // A captured stream waiting on outside work: the work must be done before the capture.
    RunUntil(e->stream, e->seq);
    return cudaSuccess;
  }
  Enqueue(s, [] {}, {{e->stream, e->seq}});
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard<std::mutex> l(g_mu);
  if (e == nullptr) return SetError(cudaErrorInvalidResourceHandle);
  if (e->stream != nullptr) RunUntil(e->stream, e->seq);
  return TakeSyncError();
}
// The interpreter has no concurrent device: a query makes the work before the event happen.
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  std::lock_guard<std::mutex> l(g_mu);
  if (a == nullptr || b == nullptr || a->stream == nullptr || b->stream == nullptr)
    return SetError(cudaErrorInvalidResourceHandle);
  if (!a->done || !b->done) return cudaErrorNotReady;
  *ms = static_cast<float>(b->ms - a->ms);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  std::lock_guard<std::mutex> l(g_mu);
  CUstream_st* s = S(stream);
  if (s->legacy) return SetError(cudaErrorStreamCaptureUnsupported);
  if (s->capture != nullptr) return SetError(cudaErrorIllegalState);
  s->capture = new CUgraph_st;
  s->capture_origin = true;
  s->capture_invalid = false;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> l(g_mu);
  CUstream_st* s = S(stream);
  *graph = nullptr;
  if (s->capture == nullptr || !s->capture_origin) return SetError(cudaErrorIllegalState);
  CUgraph_st* g = s->capture;
  bool invalid = false;
  for (CUstream_st* o : g_streams) {
    if (o->capture != g) continue;
    invalid |= o->capture_invalid;
    o->capture = nullptr;
    o->capture_origin = o->capture_invalid = false;
  }
  if (invalid) {
    delete g;
    return SetError(cudaErrorStreamCaptureInvalidated);
  }
  *graph = g;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> l(g_mu);
  CUstream_st* s = S(stream);
  *status = s->capture == nullptr ? cudaStreamCaptureStatusNone
            : s->capture_invalid  ? cudaStreamCaptureStatusInvalidated
                                  : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (g == nullptr) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{g->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t* nodes, size_t* count) {
  if (g == nullptr || count == nullptr) return cudaErrorInvalidValue;
  if (nodes != nullptr) {
    for (size_t i = 0; i < *count && i < g->ops.size(); ++i)
      nodes[i] = reinterpret_cast<cudaGraphNode_t>(i + 1);
  }
  *count = g->ops.size();
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::lock_guard<std::mutex> l(g_mu);
  if (exec == nullptr) return SetError(cudaErrorInvalidValue);
  CUstream_st* s = S(stream);
  if (LegacyUseBreaksCapture(s)) return cudaErrorStreamCaptureImplicit;
  for (const auto& fn : exec->ops) Enqueue(s, fn);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
  delete e;
  return cudaSuccess;
}

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
#define EMBER_INTERP_ERR(x) case x: return #x;
    EMBER_INTERP_ERR(cudaSuccess)
    EMBER_INTERP_ERR(cudaErrorInvalidValue)
    EMBER_INTERP_ERR(cudaErrorMemoryAllocation)
    EMBER_INTERP_ERR(cudaErrorInvalidConfiguration)
    EMBER_INTERP_ERR(cudaErrorInvalidDevice)
    EMBER_INTERP_ERR(cudaErrorNoDevice)
    EMBER_INTERP_ERR(cudaErrorInvalidResourceHandle)
    EMBER_INTERP_ERR(cudaErrorIllegalState)
    EMBER_INTERP_ERR(cudaErrorNotReady)
    EMBER_INTERP_ERR(cudaErrorIllegalAddress)
    EMBER_INTERP_ERR(cudaErrorLaunchFailure)
    EMBER_INTERP_ERR(cudaErrorStreamCaptureUnsupported)
    EMBER_INTERP_ERR(cudaErrorStreamCaptureInvalidated)
    EMBER_INTERP_ERR(cudaErrorStreamCaptureImplicit)
#undef EMBER_INTERP_ERR
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered (CUDA interpreter: see stderr)";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (CUDA interpreter: see ember_interp::LastKernelError "
             "and stderr)";
    default: return cudaGetErrorName(e);
  }
}

// ---- cuBLASLt: validation as documented, then a host matmul ---------------------------------
// Column-major, as cuBLASLt: D(m x n) = epilogue(alpha * op(A) * op(B) + beta * C + bias), op
// from TRANSA/TRANSB, inputs f32 or bf16 (raw bits), fp32 accumulation in k order, C not read
// when beta == 0, bias (length m) added per row of D, GELU the tanh approximation. It checks
// the wrapper's mapping (transposes, leading dimensions, epilogues) and what cuBLASLt requires
// of the arguments, not cuBLASLt's numerics or algorithm choice. What is validated, from the
// cuBLASLt API reference (cublasLtMatmul, cublasLtMatrixLayoutAttribute_t,
// cublasLtMatmulPreferenceAttributes_t, cublasLtMatmulDescAttributes_t):
//   - types: compute CUBLAS_COMPUTE_32F with scale CUDA_R_32F; A and B both CUDA_R_32F (C, D
//     CUDA_R_32F) or both CUDA_R_16BF (C, D CUDA_R_16BF or CUDA_R_32F; this host matmul writes
//     CUDA_R_32F only); C and D of one type. Else CUBLAS_STATUS_NOT_SUPPORTED.
//   - layouts (CUBLASLT_ORDER_COL): ld >= rows ("large enough so that matrix memory locations
//     are not overlapping"), rows and cols representable as int32; op(A) m x k, op(B) k x n,
//     C and D m x n; in place (C == D) needs ldc == ldd. Else CUBLAS_STATUS_INVALID_VALUE.
//   - transposes CUBLAS_OP_N / T / C (C is T for real types); else INVALID_VALUE.
//   - epilogues DEFAULT, BIAS, GELU, GELU_BIAS; a bias epilogue needs BIAS_POINTER (INVALID_VALUE
//     without); BIAS_DATA_TYPE CUDA_R_32F, or CUDA_R_16BF with bf16 inputs (else NOT_SUPPORTED).
//   - pointers: alpha, beta, A, B, D (and C when beta != 0) non-null (INVALID_VALUE); A, B, C, D
//     and bias aligned as the algorithm assumes: the heuristic assumes the preference's
//     MIN_ALIGNMENT_*_BYTES (default 256) and its kernels need 16 bytes, so a pointer less
//     aligned than min(16, preference) is CUBLAS_STATUS_NOT_SUPPORTED.
//   - workspace: the heuristic's algorithm asks for a split-K buffer of m * n floats when the
//     preference's MAX_WORKSPACE_BYTES allows it; cublasLtMatmul with a smaller workspaceSize (or
//     a workspace that is not device memory of that size) is CUBLAS_STATUS_INVALID_VALUE.
//   - every operand lies inside one cudaMalloc allocation over its whole layout extent
//     ((cols - 1) * ld + rows elements); outside is what a GPU would do: an illegal address
//     (cudaErrorIllegalAddress at the next synchronization), nothing written.
struct cublasLtContext {};
struct cublasLtMatmulDescOpaque_t {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType bias_type = CUDA_R_32F;
};
struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t min_align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {
std::string g_lt_error;
constexpr uint64_t kAlgoMagic = 0x656d6265724c7430ull;  // "emberLt0"

cublasStatus_t LtFail(cublasStatus_t st, const std::string& why) {
  std::lock_guard<std::mutex> l(g_mu);
  const char* name = st == CUBLAS_STATUS_INVALID_VALUE     ? "CUBLAS_STATUS_INVALID_VALUE"
                     : st == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED"
                                                           : "CUBLAS_STATUS_NOT_SUPPORTED";
  g_lt_error = std::string(name) + ": " + why;
  std::fprintf(stderr, "cuda interp: cuBLASLt refuses: %s\n", g_lt_error.c_str());
  return st;
}
size_t TypeBytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
bool IsOp(cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; }
bool Trans(cublasOperation_t o) { return o != CUBLAS_OP_N; }
std::string LayoutName(const char* which, const cublasLtMatrixLayoutOpaque_t& l) {
  return std::string(which) + " (" + std::to_string(l.rows) + " x " + std::to_string(l.cols) +
         ", ld " + std::to_string(l.ld) + ")";
}

// The checks that need no pointers (cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul).
cublasStatus_t ValidateShapes(const cublasLtMatmulDescOpaque_t* d,
                              const cublasLtMatrixLayoutOpaque_t* a,
                              const cublasLtMatrixLayoutOpaque_t* b,
                              const cublasLtMatrixLayoutOpaque_t* c,
                              const cublasLtMatrixLayoutOpaque_t* dd, uint64_t* k) {
  if (!d || !a || !b || !c || !dd) return LtFail(CUBLAS_STATUS_INVALID_VALUE, "a null descriptor");
  if (!IsOp(d->ta) || !IsOp(d->tb)) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "TRANSA/TRANSB " + std::to_string(d->ta) + "/" + std::to_string(d->tb) +
                      " is not CUBLAS_OP_N, CUBLAS_OP_T or CUBLAS_OP_C");
  }
  const std::pair<const char*, const cublasLtMatrixLayoutOpaque_t*> ls[] = {
      {"A", a}, {"B", b}, {"C", c}, {"D", dd}};
  for (const auto& [name, l] : ls) {
    if (l->ld < 0 || static_cast<uint64_t>(l->ld) < l->rows) {
      return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                    "leading dimension of " + LayoutName(name, *l) +
                        " is below its row count (column-major: ld >= rows)");
    }
    if (l->rows > 2147483647u || l->cols > 2147483647u) {
      return LtFail(CUBLAS_STATUS_NOT_SUPPORTED,
                    LayoutName(name, *l) + " has a dimension above INT32_MAX");
    }
  }
  const bool bf16 = a->type == CUDA_R_16BF && b->type == CUDA_R_16BF;
  const bool f32 = a->type == CUDA_R_32F && b->type == CUDA_R_32F;
  if ((!bf16 && !f32) || c->type != dd->type || dd->type != CUDA_R_32F) {
    return LtFail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "types A " + std::to_string(a->type) + ", B " + std::to_string(b->type) +
                      ", C " + std::to_string(c->type) + ", D " + std::to_string(dd->type) +
                      " with CUBLAS_COMPUTE_32F: supported are f32 x f32 -> f32 and "
                      "bf16 x bf16 -> f32 (the interpreter's host matmul writes f32 only)");
  }
  const uint64_t am = Trans(d->ta) ? a->cols : a->rows;
  *k = Trans(d->ta) ? a->rows : a->cols;
  const uint64_t bk = Trans(d->tb) ? b->cols : b->rows;
  const uint64_t bn = Trans(d->tb) ? b->rows : b->cols;
  if (am != dd->rows || bn != dd->cols || bk != *k || c->rows != dd->rows ||
      c->cols != dd->cols) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "shapes do not chain: op(" + LayoutName("A", *a) + ") is " +
                      std::to_string(am) + " x " + std::to_string(*k) + ", op(" +
                      LayoutName("B", *b) + ") is " + std::to_string(bk) + " x " +
                      std::to_string(bn) + ", " + LayoutName("C", *c) + ", " +
                      LayoutName("D", *dd));
  }
  switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: case CUBLASLT_EPILOGUE_GELU: break;
    case CUBLASLT_EPILOGUE_BIAS: case CUBLASLT_EPILOGUE_GELU_BIAS:
      if (d->bias == nullptr) {
        return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                      "a bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
      }
      if (!(d->bias_type == CUDA_R_32F || (bf16 && d->bias_type == CUDA_R_16BF))) {
        return LtFail(CUBLAS_STATUS_NOT_SUPPORTED,
                      "bias type " + std::to_string(d->bias_type) +
                          ": CUDA_R_32F, or CUDA_R_16BF with bf16 inputs");
      }
      break;
    default:
      return LtFail(CUBLAS_STATUS_NOT_SUPPORTED,
                    "epilogue " + std::to_string(d->epilogue) + " (the interpreter implements "
                    "DEFAULT, BIAS, GELU, GELU_BIAS)");
  }
  return CUBLAS_STATUS_SUCCESS;
}

// Bytes a column-major layout spans from its first element.
uint64_t Extent(const cublasLtMatrixLayoutOpaque_t& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows) * TypeBytes(l.type);
}

// op(X)(i, j) of a column-major matrix with layout l, op = t.
float At(const void* p, const cublasLtMatrixLayoutOpaque_t& l, cublasOperation_t t, uint64_t i,
         uint64_t j) {
  const uint64_t r = Trans(t) ? j : i, c = Trans(t) ? i : j;
  const uint64_t off = r + c * static_cast<uint64_t>(l.ld);
  if (l.type == CUDA_R_32F) return static_cast<const float*>(p)[off];
  return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[off]) << 16);
}
}  // namespace

std::string ember_interp::LastCublasLtError() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_lt_error;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (h == nullptr) return LtFail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate(nullptr)");
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusString(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE (CUDA interpreter: see stderr or "
             "ember_interp::LastCublasLtError)";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED (CUDA interpreter: see stderr or "
             "ember_interp::LastCublasLtError)";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t c,
                                        cudaDataType_t scale) {
  if (c != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) {
    return LtFail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "compute type " + std::to_string(c) + " with scale type " +
                      std::to_string(scale) + ": the interpreter has CUBLAS_COMPUTE_32F with "
                      "CUDA_R_32F");
  }
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
  // cublasLt*SetAttribute: INVALID_VALUE when buf is null or sizeInBytes does not match.
  auto set = [&](auto* field) {
    if (v == nullptr || n != sizeof(*field)) {
      return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                    "matmul descriptor attribute " + std::to_string(a) + ": size " +
                        std::to_string(n) + ", expected " + std::to_string(sizeof(*field)));
    }
    std::memcpy(field, v, n);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(&d->ta);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(&d->tb);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(&d->epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&d->bias_type);
  }
  return LtFail(CUBLAS_STATUS_INVALID_VALUE, "unknown matmul descriptor attribute " +
                                                 std::to_string(a));
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType t,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  // cuBLASLt checks layouts when they are used (heuristic, matmul), as here.
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
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* v, size_t n) {
  const size_t want = a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? 8 : 4;
  if (v == nullptr || n != want) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "preference attribute " + std::to_string(a) + ": size " + std::to_string(n) +
                      ", expected " + std::to_string(want));
  }
  switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      std::memcpy(&p->max_workspace, v, n);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      std::memcpy(&p->min_align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], v, n);
      return CUBLAS_STATUS_SUCCESS;
  }
  return LtFail(CUBLAS_STATUS_INVALID_VALUE, "unknown preference attribute " + std::to_string(a));
}

// The algorithm the heuristic returns: data[0] magic, data[1..4] the alignment (bytes) it needs
// of A, B, C, D, data[5] its workspace.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t* r, int* found) {
  if (found) *found = 0;
  if (h == nullptr) return LtFail(CUBLAS_STATUS_NOT_INITIALIZED, "null handle");
  if (requested <= 0 || r == nullptr || found == nullptr || p == nullptr) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "requestedAlgoCount " + std::to_string(requested) + " (must be > 0) or a null "
                  "result / count / preference");
  }
  uint64_t k;
  if (cublasStatus_t st = ValidateShapes(d, a, b, c, dd, &k); st != CUBLAS_STATUS_SUCCESS)
    return st;
  *r = cublasLtMatmulHeuristicResult_t{};
  r->algo.data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) r->algo.data[1 + i] = std::min<uint32_t>(16, p->min_align[i]);
  const uint64_t split_k = dd->rows * dd->cols * sizeof(float);
  r->workspaceSize = split_k <= p->max_workspace ? split_k : 0;
  r->algo.data[5] = r->workspaceSize;
  r->state = CUBLAS_STATUS_SUCCESS;
  r->wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t* algo, void* ws, size_t ws_bytes,
                              cudaStream_t stream) {
  if (h == nullptr) return LtFail(CUBLAS_STATUS_NOT_INITIALIZED, "null handle");
  uint64_t k;
  if (cublasStatus_t st = ValidateShapes(d, a, b, c, dd, &k); st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (alpha == nullptr || beta == nullptr) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE, "alpha or beta is null");
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (A == nullptr || B == nullptr || D == nullptr || (be != 0 && C == nullptr)) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE, "A, B or D is null (or C with beta != 0)");
  }
  if (C == D && c->ld != dd->ld) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "in place (C == D) with ldc " + std::to_string(c->ld) + " != ldd " +
                      std::to_string(dd->ld));
  }
  uint64_t need_align[4] = {16, 16, 16, 16};
  uint64_t algo_ws = 0;
  if (algo != nullptr) {
    if (algo->data[0] != kAlgoMagic) {
      return LtFail(CUBLAS_STATUS_INVALID_VALUE, "algo was not returned by the heuristic");
    }
    for (int i = 0; i < 4; ++i) need_align[i] = algo->data[1 + i];
    algo_ws = algo->data[5];
  }
  const void* ptrs[4] = {A, B, C, D};
  const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    if (ptrs[i] != nullptr && reinterpret_cast<uintptr_t>(ptrs[i]) % need_align[i] != 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%p", ptrs[i]);
      return LtFail(CUBLAS_STATUS_NOT_SUPPORTED,
                    std::string("pointer ") + names[i] + " = " + buf + " is not " +
                        std::to_string(need_align[i]) + "-byte aligned (the algorithm's "
                        "requirement; set CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" + names[i] +
                        "_BYTES lower for another)");
    }
  }
  const bool bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS ||
                    d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool gelu = d->epilogue == CUBLASLT_EPILOGUE_GELU ||
                    d->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (bias && reinterpret_cast<uintptr_t>(d->bias) % 16 != 0) {
    return LtFail(CUBLAS_STATUS_NOT_SUPPORTED, "the bias pointer is not 16-byte aligned");
  }
  if (ws_bytes < algo_ws) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "workspaceSizeInBytes " + std::to_string(ws_bytes) + " is below the " +
                      std::to_string(algo_ws) + " bytes the algorithm needs");
  }
  bool ws_ok;
  {
    std::lock_guard<std::mutex> l(g_mu);
    ws_ok = ws_bytes == 0 || (ws != nullptr && Inside(ws, ws_bytes));
  }
  if (!ws_ok) {
    return LtFail(CUBLAS_STATUS_INVALID_VALUE,
                  "the workspace is not " + std::to_string(ws_bytes) + " bytes of device memory");
  }
  const cublasLtMatmulDescOpaque_t desc = *d;
  const cublasLtMatrixLayoutOpaque_t la = *a, lb = *b, lc = *c, ld = *dd;
  // The device side: operands outside their allocations fault as on a GPU.
  std::string fault;
  {
    std::lock_guard<std::mutex> l(g_mu);
    const std::pair<const void*, const cublasLtMatrixLayoutOpaque_t*> ops[4] = {
        {A, &la}, {B, &lb}, {be != 0 ? C : nullptr, &lc}, {D, &ld}};
    for (int i = 0; i < 4 && fault.empty(); ++i) {
      if (ops[i].first != nullptr && !Inside(ops[i].first, Extent(*ops[i].second))) {
        fault = "operand " + LayoutName(names[i], *ops[i].second) + " at " +
                std::to_string(reinterpret_cast<uintptr_t>(ops[i].first)) + " spans " +
                std::to_string(Extent(*ops[i].second)) +
                " bytes, past the end of its cudaMalloc allocation (or not device memory)";
      }
    }
    if (fault.empty() && bias && !Inside(desc.bias, ld.rows * TypeBytes(desc.bias_type))) {
      fault = "the bias (" + std::to_string(ld.rows) + " elements) is not inside a cudaMalloc "
              "allocation";
    }
  }
  RunOnStream(stream, [=]() {
    if (!fault.empty()) {
      DeviceFault(cudaErrorIllegalAddress, "cublasLtMatmul: " + fault);
      return;
    }
    std::vector<float> out(ld.rows * ld.cols);
    for (uint64_t j = 0; j < ld.cols; ++j) {
      for (uint64_t i = 0; i < ld.rows; ++i) {
        float acc = 0;
        for (uint64_t p = 0; p < k; ++p)
          acc += At(A, la, desc.ta, i, p) * At(B, lb, desc.tb, p, j);
        float v = al * acc;
        if (be != 0) v += be * static_cast<const float*>(C)[i + j * lc.ld];
        if (bias) {
          v += desc.bias_type == CUDA_R_32F
                   ? static_cast<const float*>(desc.bias)[i]
                   : __uint_as_float(uint32_t{static_cast<const uint16_t*>(desc.bias)[i]} << 16);
        }
        if (gelu) v = 0.5f * v * (1.0f + std::tanh(0.7978845608f * (v + 0.044715f * v * v * v)));
        out[i + j * ld.rows] = v;
      }
    }
    // Written after all reads: D may alias C.
    for (uint64_t j = 0; j < ld.cols; ++j)
      for (uint64_t i = 0; i < ld.rows; ++i)
        static_cast<float*>(D)[i + j * ld.ld] = out[i + j * ld.rows];
  });
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
