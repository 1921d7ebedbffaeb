#include "kernels/gemm.h"

#include <cblas.h>
#include <cpuid.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cast.h"
#include "oneapi/dnnl/dnnl.h"

namespace ember::kernels {
namespace {

void PinOpenBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Splits the larger output dimension into tiles and runs `fn(m0, m1, n0, n1)` per tile.
template <typename Fn>
void ForEachTile(const ExecContext& ctx, int64_t M, int64_t N, int64_t K, Fn fn) {
  const int threads = ctx.num_threads();
  const bool split_m = M >= N;
  const int64_t dim = split_m ? M : N;
  int64_t tile;
  if (static_cast<double>(M) * N * K < 64.0 * 64 * 64) {
    tile = dim;
  } else if (ctx.deterministic) {
    tile = std::max<int64_t>(64, (dim + 7) / 8);  // from the shape only
  } else {
    // Two tiles per thread: a descheduled thread's second tile is taken by the others.
    tile = std::max<int64_t>(64, (dim + 2 * threads - 1) / (2 * threads));
  }
  tile = (tile + 15) / 16 * 16;
  const int64_t tiles = (dim + tile - 1) / tile;
  auto run = [&](int64_t t) {
    int64_t b = t * tile, e = std::min(dim, b + tile);
    if (split_m) fn(b, e, 0, N); else fn(0, M, b, e);
  };
  if (tiles == 1 || ctx.pool == nullptr) {
    for (int64_t t = 0; t < tiles; ++t) run(t);
  } else {
    ctx.pool->Run(tiles, run);
  }
}

template <typename T>
const T* OffsetA(const T* A, bool trans_a, int64_t lda, int64_t m0) {
  return trans_a ? A + m0 : A + m0 * lda;
}
template <typename T>
const T* OffsetB(const T* B, bool trans_b, int64_t ldb, int64_t n0) {
  return trans_b ? B + n0 * ldb : B + n0;
}

// ---- oneDNN, loaded at run time ---------------------------------------------------------------
//
// libdnnl.so.2 is opened with dlopen on first use rather than linked: binaries that never run a
// bf16 GEMM (and machines without the library, such as the GPU test carry set) do not need it,
// and a missing library is a logged reason for the fp32 path, not a failed start.

#define EMBER_DNNL_FUNCS(X) \
  X(engine_create) \
  X(get_effective_cpu_isa) \
  X(matmul_desc_init) \
  X(memory_create) \
  X(memory_desc_get_size) \
  X(memory_desc_init_by_strides) \
  X(memory_destroy) \
  X(post_ops_append_sum) \
  X(post_ops_create) \
  X(post_ops_destroy) \
  X(primitive_attr_create) \
  X(primitive_attr_destroy) \
  X(primitive_attr_set_output_scales) \
  X(primitive_attr_set_post_ops) \
  X(primitive_attr_set_scratchpad_mode) \
  X(primitive_create) \
  X(primitive_desc_create) \
  X(primitive_desc_destroy) \
  X(primitive_desc_query) \
  X(primitive_desc_query_md) \
  X(primitive_destroy) \
  X(primitive_execute) \
  X(stream_create) \
  X(stream_destroy) \
  X(stream_wait) \
  X(version)

struct DnnlApi {
#define EMBER_DNNL_MEMBER(n) decltype(&::dnnl_##n) n = nullptr;
  EMBER_DNNL_FUNCS(EMBER_DNNL_MEMBER)
#undef EMBER_DNNL_MEMBER
  void (*omp_set_num_threads)(int) = nullptr;  // libgomp's, which Debian's oneDNN threads with
};
DnnlApi g_dnnl;  // filled once by LoadDnnl (in Detect, before any other use); then read-only

// Empty on success, else why the library cannot be used.
std::string LoadDnnl() {
  void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return std::string("libdnnl.so.2 could not be loaded (") + (e ? e : "?") +
           "; deploy/install-deps.sh installs libdnnl-dev)";
  }
#define EMBER_DNNL_LOAD(n)                                                   \
  g_dnnl.n = reinterpret_cast<decltype(g_dnnl.n)>(dlsym(h, "dnnl_" #n));     \
  if (g_dnnl.n == nullptr) return "libdnnl.so.2 lacks dnnl_" #n " (not oneDNN 2.x)";
  EMBER_DNNL_FUNCS(EMBER_DNNL_LOAD)
#undef EMBER_DNNL_LOAD
  // dlsym on the handle searches the library's dependencies too: libgomp for the OpenMP build.
  g_dnnl.omp_set_num_threads =
      reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"));
  if (g_dnnl.omp_set_num_threads == nullptr) {
    return "libdnnl.so.2 is not the OpenMP build (no omp_set_num_threads to keep it on one thread)";
  }
  if (g_dnnl.version()->major != 2) {
    return "libdnnl.so.2 reports version " + std::to_string(g_dnnl.version()->major) + ", not 2";
  }
  return "";
}

// oneDNN (Debian's build uses OpenMP) runs single-threaded inside each pool task, like OpenBLAS:
// the job's pool is the only parallelism. nthreads-var is per thread, so this is set once in every
// thread that calls oneDNN (before its first primitive is created, which reads it).
void PinOneDnnSingleThreaded() {
  thread_local bool pinned = [] {
    g_dnnl.omp_set_num_threads(1);
    return true;
  }();
  (void)pinned;
}

// ---- CPU features ----------------------------------------------------------------------------

std::string CpuModelName() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = colon + 1;
        while (b < line.size() && line[b] == ' ') ++b;
        return line.substr(b);
      }
    }
  }
  return "unknown CPU";
}

struct CpuBf16 {
  bool avx512_bf16 = false;
  bool amx_bf16 = false;
  bool os_avx512 = false;  // XCR0 enables the opmask and ZMM state
};

CpuBf16 DetectCpu() {
  CpuBf16 c;
  unsigned a, b, cx, d;
  if (__get_cpuid(1, &a, &b, &cx, &d) && (cx & (1u << 27))) {  // OSXSAVE
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    c.os_avx512 = (lo & 0xe6u) == 0xe6u;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  }
  if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
    c.amx_bf16 = (d >> 22) & 1u;
    const unsigned max_sub = a;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &cx, &d)) c.avx512_bf16 = (a >> 5) & 1u;
  }
  return c;
}

// ---- oneDNN matmul primitives, cached by shape -------------------------------------------------

struct Key {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t alpha, beta;  // bit patterns
  bool operator<(const Key& o) const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldc, alpha, beta) <
           std::tie(o.ta, o.tb, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.alpha, o.beta);
  }
};

// One created primitive (immutable after creation; executed concurrently from the pool's threads,
// each with its own stream and scratchpad: the scratchpad is user-managed for that reason).
struct Prim {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
  size_t scratch_bytes = 0;
  std::string impl;
  ~Prim() {
    if (prim != nullptr) g_dnnl.primitive_destroy(prim);
  }
};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Creates the matmul primitive C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C with the
// strides of gemm.h's row-major contract; nullptr and *why when oneDNN refuses.
std::unique_ptr<Prim> CreatePrim(dnnl_engine_t engine, const Key& key, std::string* why) {
  auto p = std::make_unique<Prim>();
  const dnnl_dims_t a_dims = {key.m, key.k}, b_dims = {key.k, key.n}, c_dims = {key.m, key.n};
  const dnnl_dims_t a_str = {key.ta ? 1 : key.lda, key.ta ? key.lda : 1};
  const dnnl_dims_t b_str = {key.tb ? 1 : key.ldb, key.tb ? key.ldb : 1};
  const dnnl_dims_t c_str = {key.ldc, 1};
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t ops = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  float alpha, beta;
  std::memcpy(&alpha, &key.alpha, 4);
  std::memcpy(&beta, &key.beta, 4);
  auto fail = [&](const char* what, dnnl_status_t s) {
    *why = std::string(what) + " failed (dnnl status " + std::to_string(static_cast<int>(s)) + ")";
    if (pd != nullptr) g_dnnl.primitive_desc_destroy(pd);
    if (ops != nullptr) g_dnnl.post_ops_destroy(ops);
    if (attr != nullptr) g_dnnl.primitive_attr_destroy(attr);
    return nullptr;
  };
  dnnl_status_t s;
  if ((s = g_dnnl.memory_desc_init_by_strides(&p->a_md, 2, a_dims, dnnl_bf16, a_str)) != dnnl_success ||
      (s = g_dnnl.memory_desc_init_by_strides(&p->b_md, 2, b_dims, dnnl_bf16, b_str)) != dnnl_success ||
      (s = g_dnnl.memory_desc_init_by_strides(&p->c_md, 2, c_dims, dnnl_f32, c_str)) != dnnl_success) {
    return fail("dnnl_memory_desc_init_by_strides", s);
  }
  if ((s = g_dnnl.matmul_desc_init(&desc, &p->a_md, &p->b_md, nullptr, &p->c_md)) != dnnl_success) {
    return fail("dnnl_matmul_desc_init", s);
  }
  if ((s = g_dnnl.primitive_attr_create(&attr)) != dnnl_success) return fail("attr_create", s);
  if ((s = g_dnnl.primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) != dnnl_success) {
    return fail("set_scratchpad_mode", s);
  }
  if (alpha != 1.0f && (s = g_dnnl.primitive_attr_set_output_scales(attr, 1, 0, &alpha)) != dnnl_success) {
    return fail("set_output_scales", s);
  }
  if (beta != 0.0f) {
    if ((s = g_dnnl.post_ops_create(&ops)) != dnnl_success) return fail("post_ops_create", s);
    if ((s = g_dnnl.post_ops_append_sum(ops, beta)) != dnnl_success) return fail("append_sum", s);
    if ((s = g_dnnl.primitive_attr_set_post_ops(attr, ops)) != dnnl_success) return fail("set_post_ops", s);
  }
  if ((s = g_dnnl.primitive_desc_create(&pd, &desc, attr, engine, nullptr)) != dnnl_success) {
    return fail("dnnl_primitive_desc_create (bf16 matmul)", s);
  }
  const char* impl = nullptr;
  if (g_dnnl.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) {
    p->impl = impl;
  }
  if (p->impl.rfind("ref", 0) == 0) {
    *why = "oneDNN offers only its reference implementation (" + p->impl + ") for this shape";
    g_dnnl.primitive_desc_destroy(pd);
    if (ops != nullptr) g_dnnl.post_ops_destroy(ops);
    g_dnnl.primitive_attr_destroy(attr);
    return nullptr;
  }
  const dnnl_memory_desc_t* smd = g_dnnl.primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  if (smd != nullptr) {
    p->scratch_md = *smd;
    p->scratch_bytes = g_dnnl.memory_desc_get_size(smd);
  }
  s = g_dnnl.primitive_create(&p->prim, pd);
  g_dnnl.primitive_desc_destroy(pd);
  if (ops != nullptr) g_dnnl.post_ops_destroy(ops);
  g_dnnl.primitive_attr_destroy(attr);
  if (s != dnnl_success) {
    p->prim = nullptr;
    *why = "dnnl_primitive_create failed (dnnl status " + std::to_string(static_cast<int>(s)) + ")";
    return nullptr;
  }
  return p;
}

// Process-wide state of the oneDNN path. Never destroyed (used from pool threads up to exit).
struct OneDnn {
  Bf16GemmSupport support;
  dnnl_engine_t engine = nullptr;
  std::mutex mu;
  std::map<Key, std::shared_ptr<const Prim>> cache;  // guarded by mu; nullptr: refused shape
};

OneDnn* Detect() {
  auto* d = new OneDnn;
  Bf16GemmSupport& s = d->support;
  s.cpu = CpuModelName();
  const CpuBf16 cpu = DetectCpu();
  s.cpu_bf16 = cpu.os_avx512 && (cpu.avx512_bf16 || cpu.amx_bf16);
  const char* env = std::getenv("EMBER_BF16_GEMM");
  if (env != nullptr && std::strcmp(env, "off") == 0) {
    s.reason = "EMBER_BF16_GEMM=off: bf16 GEMMs widen to fp32 (OpenBLAS sgemm)";
    return d;
  }
  if (!s.cpu_bf16) {
    s.reason = std::string("the CPU (") + s.cpu + ") has neither avx512_bf16 nor AMX-BF16" +
               (cpu.os_avx512 ? "" : " (or the OS does not enable AVX-512 state)") +
               ": bf16 GEMMs widen to fp32 (OpenBLAS sgemm)";
    return d;
  }
  if (std::string why = LoadDnnl(); !why.empty()) {
    s.reason = why + ": bf16 GEMMs widen to fp32 (OpenBLAS sgemm)";
    return d;
  }
  const unsigned isa = static_cast<unsigned>(g_dnnl.get_effective_cpu_isa());
  const unsigned need = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  if ((isa & need) != need) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "oneDNN's effective ISA (0x%x) lacks avx512_core_bf16 (DNNL_MAX_CPU_ISA set?): "
                  "bf16 GEMMs widen to fp32",
                  isa);
    s.reason = buf;
    return d;
  }
  if (g_dnnl.engine_create(&d->engine, dnnl_cpu, 0) != dnnl_success) {
    s.reason = "oneDNN could not create its CPU engine: bf16 GEMMs widen to fp32";
    return d;
  }
  // A probe shape: oneDNN must offer a jit/brgemm kernel, not its reference loop.
  PinOneDnnSingleThreaded();
  std::string why;
  auto probe = CreatePrim(d->engine, Key{false, true, 64, 64, 64, 64, 64, 64, Bits(1.0f), 0}, &why);
  if (probe == nullptr) {
    s.reason = why + ": bf16 GEMMs widen to fp32";
    return d;
  }
  s.native = true;
  s.reason = std::string("oneDNN ") + std::to_string(g_dnnl.version()->major) + "." +
             std::to_string(g_dnnl.version()->minor) + " bf16 matmul (" + probe->impl + ") on " +
             s.cpu + (cpu.amx_bf16 ? " (AMX-BF16)" : " (avx512_bf16)");
  return d;
}

OneDnn& State() {
  static OneDnn* d = Detect();
  return *d;
}

struct ThreadStream {
  dnnl_stream_t stream = nullptr;
  std::vector<char> scratch;
  ~ThreadStream() {
    if (stream != nullptr) g_dnnl.stream_destroy(stream);
  }
};

// One tile through oneDNN; false when oneDNN refused the shape (the caller widens instead).
bool OneDnnTile(OneDnn& d, const Key& key, const uint16_t* A, const uint16_t* B, float* C) {
  PinOneDnnSingleThreaded();
  std::shared_ptr<const Prim> prim;
  {
    std::lock_guard<std::mutex> l(d.mu);
    auto it = d.cache.find(key);
    if (it != d.cache.end()) prim = it->second;
  }
  if (prim == nullptr) {
    std::lock_guard<std::mutex> l(d.mu);
    auto it = d.cache.find(key);
    if (it != d.cache.end()) {
      prim = it->second;
    } else {
      std::string why;
      prim = CreatePrim(d.engine, key, &why);
      d.cache.emplace(key, prim);
      if (prim == nullptr) {
        std::fprintf(stderr,
                     "ember: GemmBf16 %lldx%lldx%lld (trans %d%d): %s; this shape widens to fp32\n",
                     static_cast<long long>(key.m), static_cast<long long>(key.n),
                     static_cast<long long>(key.k), key.ta, key.tb, why.c_str());
      }
    }
  }
  if (prim == nullptr) return false;
  thread_local ThreadStream ts;
  if (ts.stream == nullptr && g_dnnl.stream_create(&ts.stream, d.engine, dnnl_stream_default_flags) != dnnl_success) {
    ts.stream = nullptr;
    return false;
  }
  if (ts.scratch.size() < prim->scratch_bytes) ts.scratch.resize(prim->scratch_bytes);
  dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr, ms = nullptr;
  bool ok = g_dnnl.memory_create(&ma, &prim->a_md, d.engine, const_cast<uint16_t*>(A)) == dnnl_success &&
            g_dnnl.memory_create(&mb, &prim->b_md, d.engine, const_cast<uint16_t*>(B)) == dnnl_success &&
            g_dnnl.memory_create(&mc, &prim->c_md, d.engine, C) == dnnl_success;
  int nargs = 3;
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {}};
  if (ok && prim->scratch_bytes > 0) {
    ok = g_dnnl.memory_create(&ms, &prim->scratch_md, d.engine, ts.scratch.data()) == dnnl_success;
    args[nargs++] = {DNNL_ARG_SCRATCHPAD, ms};
  }
  ok = ok && g_dnnl.primitive_execute(prim->prim, ts.stream, nargs, args) == dnnl_success &&
       g_dnnl.stream_wait(ts.stream) == dnnl_success;
  for (dnnl_memory_t m : {ma, mb, mc, ms}) {
    if (m != nullptr) g_dnnl.memory_destroy(m);
  }
  if (!ok) {
    // Execution failures are not expected once the primitive exists: stop rather than return
    // wrong numbers (C may be partly written, so widening now would be wrong with beta != 0).
    std::fprintf(stderr, "ember: GemmBf16: oneDNN matmul execution failed\n");
    std::abort();
  }
  return true;
}

void WidenedGemm(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N,
                 int64_t K, float alpha, const uint16_t* A, int64_t lda, const uint16_t* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  // bf16 -> fp32 is exact, so this is the same math (fp32 accumulation), without the speed.
  const int64_t a_rows = trans_a ? K : M, b_rows = trans_b ? N : K;
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  const int64_t a_n = a_rows == 0 ? 0 : (a_rows - 1) * lda + a_cols;
  const int64_t b_n = b_rows == 0 ? 0 : (b_rows - 1) * ldb + b_cols;
  std::vector<float> a(a_n), b(b_n);
  CastBf16ToF32(ctx, A, a.data(), a_n);
  CastBf16ToF32(ctx, B, b.data(), b_n);
  Gemm(ctx, trans_a, trans_b, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

}  // namespace

void Gemm(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
          float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  PinOpenBlasSingleThreaded();
  ForEachTile(ctx, M, N, K, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m1 - m0, n1 - n0, K, alpha,
                OffsetA(A, trans_a, lda, m0), lda, OffsetB(B, trans_b, ldb, n0), ldb, beta,
                C + m0 * ldc + n0, ldc);
  });
}

const Bf16GemmSupport& Bf16GemmInfo() { return State().support; }

bool HasNativeBf16Gemm() { return Bf16GemmInfo().native; }

void GemmBf16(const ExecContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              float alpha, const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
              float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  OneDnn& d = State();
  if (!d.support.native || K == 0) {
    WidenedGemm(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Tiles that oneDNN refuses (not expected for plain 2-D strided matmuls) are widened one by one.
  ForEachTile(ctx, M, N, K, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const uint16_t* a = OffsetA(A, trans_a, lda, m0);
    const uint16_t* b = OffsetB(B, trans_b, ldb, n0);
    float* c = C + m0 * ldc + n0;
    const Key key{trans_a, trans_b, m1 - m0, n1 - n0, K, lda, ldb, ldc, Bits(alpha), Bits(beta)};
    if (!OneDnnTile(d, key, a, b, c)) {
      ExecContext one;  // this tile alone, on this thread
      WidenedGemm(one, trans_a, trans_b, m1 - m0, n1 - n0, K, alpha, a, lda, b, ldb, beta, c, ldc);
    }
  });
}

}  // namespace ember::kernels
