#include <algorithm>

#include "kernels/exec_context.h"

namespace ember::kernels {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// Claims and runs tasks of the current generation until none are left. Called with mu_ unlocked.
void ThreadPool::Drain() {
  for (;;) {
    int64_t task;
    const std::function<void(int64_t)>* fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fn_ == nullptr || next_task_ >= num_tasks_) return;
      task = next_task_++;
      fn = fn_;
    }
    (*fn)(task);
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = ++done_tasks_ == num_tasks_;
    }
    if (last) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain();
  }
}

void ThreadPool::Run(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (num_tasks == 1 || num_threads_ == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    done_tasks_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  Drain();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return done_tasks_ == num_tasks_; });
  fn_ = nullptr;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  // A few parts per thread, so a thread that is descheduled (other processes on the machine)
  // does not hold up the rest: the others claim its remaining parts.
  int64_t parts = std::min<int64_t>(4 * num_threads_, (n + grain - 1) / grain);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  int64_t per = (n + parts - 1) / parts;
  Run(parts, [&](int64_t p) {
    int64_t b = p * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

}  // namespace ember::kernels
