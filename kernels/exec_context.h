// Execution context for every kernel: the one thread pool of the job, the determinism switch and
// (later) a CUDA stream. Kernels take `const ExecContext&` as their first argument.
//
// Thread safety: a ThreadPool may be used by one caller thread at a time (kernels are called from
// the training thread); ParallelFor must not be called re-entrantly from inside a task.
//
//   ThreadPool pool(2);
//   ExecContext ctx{&pool, /*deterministic=*/true};
//   RmsNormForward(ctx, x, w, y, rstd, N, C, 1e-5f);
#ifndef EMBER_KERNELS_EXEC_CONTEXT_H_
#define EMBER_KERNELS_EXEC_CONTEXT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ember::kernels {

// A fixed-size pool: `num_threads - 1` workers plus the calling thread, which also runs tasks.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(task) for task in [0, num_tasks), spread over the pool, and blocks until all are done.
  // Tasks are handed out dynamically, so fn must not depend on which thread runs it.
  void Run(int64_t num_tasks, const std::function<void(int64_t task)>& fn);

  // Splits [0, n) into contiguous ranges of at least `grain` items (up to four per thread) and
  // calls fn(begin, end) for each. Use for work whose per-item result does not depend on the split.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void Drain();

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Guarded by mu_.
  uint64_t generation_ = 0;
  bool stop_ = false;
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;
  int64_t done_tasks_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
};

struct ExecContext {
  ThreadPool* pool = nullptr;  // not owned; must outlive every kernel call using this context
  // true: every result is bitwise identical run to run and for any pool size (reductions use a
  // fixed partition independent of the thread count). false: reductions may be split by thread
  // count (still identical run to run at a fixed thread count).
  bool deterministic = true;
  void* cuda_stream = nullptr;  // reserved for CUDA kernels; CPU kernels ignore it
  // true: LinearForward/LinearBackward round their GEMM inputs (x, W, dy) to bf16 and multiply
  // with GemmBf16 (fp32 accumulation and output; oneDNN where the CPU has bf16 instructions,
  // widened sgemm elsewhere). The trainer sets it where precision.param_dtype is bf16 and
  // HasNativeBf16Gemm() (kernels/gemm.h); docs/model.md "Precision" has the numerics.
  bool bf16_linear = false;
  int num_threads() const { return pool ? pool->num_threads() : 1; }
};

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_EXEC_CONTEXT_H_
