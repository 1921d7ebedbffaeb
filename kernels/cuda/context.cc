// CudaContext, the cudaMalloc allocator backend and the cuBLASLt GEMM (cuda_ops.h).
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/status.h"

#ifdef EMBER_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

namespace ember::kernels::cuda {

#ifdef EMBER_WITH_CUDA  // cuda_ops.h declares the GEMM API only with CUDA
namespace {
std::atomic<GemmAlignmentObserver> g_gemm_alignment_observer{nullptr};
}  // namespace

uint32_t PointerAlignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  const uintptr_t low = v & (~v + 1);  // lowest set bit
  return static_cast<uint32_t>(low >= 256 ? 256 : low);
}

void SetGemmAlignmentObserver(GemmAlignmentObserver f) { g_gemm_alignment_observer.store(f); }
#endif  // EMBER_WITH_CUDA

#ifndef EMBER_WITH_CUDA

namespace {
class NoCudaBackend : public CachingAllocator::Backend {
 public:
  absl::StatusOr<void*> Allocate(size_t) override {
    return absl::UnavailableError("built without CUDA: no device memory");
  }
  void Deallocate(void*, size_t) override {}
};
}  // namespace

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(int) {
  return absl::UnavailableError(
      "built without CUDA (no toolkit at configure time; see third_party/cuda)");
}
CudaContext::~CudaContext() = default;
absl::Status CudaContext::Synchronize() { return absl::OkStatus(); }
std::string CudaContext::DeviceName() const { return "none"; }
std::unique_ptr<CachingAllocator> NewCudaAllocator() {
  return std::make_unique<CachingAllocator>(std::make_unique<NoCudaBackend>());
}

#else  // EMBER_WITH_CUDA

namespace {

class CudaMallocBackend : public CachingAllocator::Backend {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc(", bytes,
                                                       "): ", cudaGetErrorString(err)));
    }
    return p;
  }
  void Deallocate(void* p, size_t) override { cudaFree(p); }
#ifndef EMBER_CUDA_INTERP  // the interpreter runs every stream's work at once: no events needed
  // Record-stream events (allocator.h): disable timing (cheaper), polled, never synchronized.
  void* RecordEvent(void* stream) override {
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(e, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      // Without an event the block cannot be ordered: wait for the stream instead.
      cudaGetLastError();
      if (e != nullptr) cudaEventDestroy(e);
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
      return nullptr;
    }
    return e;
  }
  bool EventDone(void* e) override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) return false;
    if (r != cudaSuccess) cudaGetLastError();  // a sticky device error: nothing runs any more
    return true;
  }
  void DestroyEvent(void* e) override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
#endif
};

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

struct ContextAccess {
  static cublasLtHandle_t Lt(CudaContext& c) { return static_cast<cublasLtHandle_t>(c.cublaslt_); }
  static void* Workspace(CudaContext& c) { return c.workspace_; }
  static size_t WorkspaceBytes(CudaContext& c) { return c.workspace_bytes_; }
};

std::unique_ptr<CachingAllocator> NewCudaAllocator() {
#ifdef EMBER_CUDA_INTERP
  // Exact-size cudaMalloc allocations, each ending at a guard page (kernels/cuda/interp).
  return std::make_unique<CachingAllocator>(std::make_unique<CudaMallocBackend>(),
                                            CachingAllocator::Mode::kExact);
#else
  return std::make_unique<CachingAllocator>(std::make_unique<CudaMallocBackend>());
#endif
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(int device) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no usable GPU: ", err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA devices"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " visible)"));
  }
  std::unique_ptr<CudaContext> c(new CudaContext());
  c->device_ = device;
  EMBER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s;
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                             "cudaStreamCreate");
  c->stream_ = s;
  cublasLtHandle_t lt;
  if (cublasStatus_t st = cublasLtCreate(&lt); st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasLtCreate failed: ", cublasLtGetStatusString(st)));
  }
  c->cublaslt_ = lt;
  c->allocator_ = NewCudaAllocator();
  absl::StatusOr<void*> ws = c->allocator_->Allocate(kWorkspaceBytes);
  if (!ws.ok()) return ws.status();
  c->workspace_ = *ws;
  c->workspace_bytes_ = kWorkspaceBytes;
  return c;
}

CudaContext::~CudaContext() {
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (allocator_ && workspace_ != nullptr) allocator_->Free(workspace_).IgnoreError();
  allocator_.reset();
  if (cublaslt_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(cublaslt_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status CudaContext::Synchronize() {
  EMBER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                             "cudaStreamSynchronize");
  return absl::OkStatus();
}

std::string CudaContext::DeviceName() const {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return "unknown";
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ")");
}

namespace {

// Owns the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

#define EMBER_LT_RETURN_IF_ERROR(expr, what)                                                \
  do {                                                                                      \
    cublasStatus_t st_ = (expr);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      return absl::InternalError(absl::StrCat("cuBLASLt ", what, " failed: ",               \
                                              cublasLtGetStatusString(st_)));               \
  } while (0)

}  // namespace

absl::Status Gemm(CudaContext& ctx, GemmInput in, bool trans_a, bool trans_b, int64_t M, int64_t N,
                  int64_t K, float alpha, const void* A, int64_t lda, const void* B, int64_t ldb,
                  float beta, float* C, int64_t ldc, GemmEpilogue epilogue, const float* bias) {
  if (M <= 0 || N <= 0) return absl::OkStatus();
  const bool needs_bias = epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kGeluBias;
  if (needs_bias && bias == nullptr) {
    return absl::InvalidArgumentError("Gemm: the bias epilogue needs a bias pointer, got null");
  }
  // Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's "A" is
  // our B and its "B" our A, each described by its stored (column-major) shape.
  const cudaDataType_t t = in == GemmInput::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LtDescs d;
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                           "MatmulDescCreate");
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                          sizeof(op_a)), "set TRANSA");
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                          sizeof(op_b)), "set TRANSB");
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  if (epilogue == GemmEpilogue::kBias) ep = CUBLASLT_EPILOGUE_BIAS;
  if (epilogue == GemmEpilogue::kGelu) ep = CUBLASLT_EPILOGUE_GELU;
  if (epilogue == GemmEpilogue::kGeluBias) ep = CUBLASLT_EPILOGUE_GELU_BIAS;
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep,
                                                          sizeof(ep)), "set EPILOGUE");
  if (needs_bias) {
    const cudaDataType_t bt = CUDA_R_32F;
    EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)), "set BIAS_DATA_TYPE");
    EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "set BIAS_POINTER");
  }
  // Stored shapes (column-major rows x cols, ld).
  const uint64_t a_rows = trans_b ? K : N, a_cols = trans_b ? N : K;
  const uint64_t b_rows = trans_a ? M : K, b_cols = trans_a ? K : M;
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.a, t, a_rows, a_cols, ldb), "layout A");
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.b, t, b_rows, b_cols, lda), "layout B");
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, N, M, ldc), "layout C");
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&d.pref), "PreferenceCreate");
  const size_t ws = ContextAccess::WorkspaceBytes(ctx);
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "set workspace");
  // Alignment of the actual pointers (cuBLASLt's A is our B, its B our A; C and D are C), so the
  // heuristic returns only kernels valid for them instead of assuming 256 bytes. The values of
  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES (5..8 in cublasLt.h; the interpreter's
  // header does not name them).
  const GemmAlignment al{PointerAlignment(A), PointerAlignment(B), PointerAlignment(C),
                         PointerAlignment(C)};
  const uint32_t lt_align[4] = {al.b, al.a, al.c, al.d};
  for (int i = 0; i < 4; ++i) {
    EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        d.pref, static_cast<cublasLtMatmulPreferenceAttributes_t>(5 + i), &lt_align[i],
        sizeof(lt_align[i])), "set MIN_ALIGNMENT");
  }
  if (GemmAlignmentObserver f = g_gemm_alignment_observer.load()) f(al);
  cublasLtMatmulHeuristicResult_t heur;
  int found = 0;
  EMBER_LT_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(ContextAccess::Lt(ctx), d.op, d.a, d.b,
                                                          d.c, d.c, d.pref, 1, &heur, &found),
                           "AlgoGetHeuristic");
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for M=", M, " N=", N, " K=", K, " lda=", lda, " ldb=", ldb,
        " ldc=", ldc, " (check alignment: bf16 leading dimensions should be multiples of 8)"));
  }
  EMBER_LT_RETURN_IF_ERROR(
      cublasLtMatmul(ContextAccess::Lt(ctx), d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c,
                     &heur.algo, ContextAccess::Workspace(ctx), ws,
                     static_cast<cudaStream_t>(ctx.stream())),
      "Matmul");
  return absl::OkStatus();
}

#endif  // EMBER_WITH_CUDA

}  // namespace ember::kernels::cuda
