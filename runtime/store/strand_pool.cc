// StrandPool: see strand_pool.h.
#include "runtime/store/strand_pool.h"

#include <utility>

namespace ember::store {

StrandPool::StrandPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

void StrandPool::Post(uint64_t strand, std::function<void()> run, std::function<void()> cancel) {
  {
    absl::MutexLock l(&mu_);
    if (!stop_) {
      Strand& s = strands_[strand];
      s.tasks.push_back(Task{std::move(run), std::move(cancel)});
      if (!s.running && s.tasks.size() == 1) ready_.push_back(strand);
      return;
    }
  }
  cancel();
}

bool StrandPool::TryAcquire(uint64_t strand) {
  absl::MutexLock l(&mu_);
  if (stop_) return false;
  auto [it, created] = strands_.try_emplace(strand);
  if (!created && (it->second.running || !it->second.tasks.empty())) return false;
  it->second.running = true;
  return true;
}

void StrandPool::Release(uint64_t strand) {
  absl::MutexLock l(&mu_);
  auto it = strands_.find(strand);
  if (it == strands_.end()) return;
  it->second.running = false;
  if (it->second.tasks.empty()) {
    strands_.erase(it);
  } else {
    ready_.push_back(strand);
  }
}

void StrandPool::ReleaseWith(uint64_t strand, std::function<void()> run,
                             std::function<void()> cancel) {
  {
    absl::MutexLock l(&mu_);
    Strand& s = strands_[strand];
    s.running = false;
    if (!stop_) {
      s.tasks.push_front(Task{std::move(run), std::move(cancel)});
      ready_.push_back(strand);
      return;
    }
    if (s.tasks.empty()) strands_.erase(strand);
  }
  cancel();
}

void StrandPool::Drop(uint64_t strand) {
  std::deque<Task> dropped;
  {
    absl::MutexLock l(&mu_);
    auto it = strands_.find(strand);
    if (it == strands_.end()) return;
    dropped.swap(it->second.tasks);
    if (!it->second.running) strands_.erase(it);  // (its stale ready_ entry is skipped)
  }
  for (Task& t : dropped) t.cancel();
}

void StrandPool::Stop() {
  std::vector<Task> dropped;
  {
    absl::MutexLock l(&mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& [id, s] : strands_) {
      for (Task& t : s.tasks) dropped.push_back(std::move(t));
      s.tasks.clear();
    }
  }
  for (Task& t : dropped) t.cancel();
  for (std::thread& t : threads_) t.join();
}

void StrandPool::Loop() {
  while (true) {
    uint64_t id;
    Task task;
    {
      absl::MutexLock l(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !ready_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) return;
      id = ready_.front();
      ready_.pop_front();
      auto it = strands_.find(id);
      if (it == strands_.end() || it->second.running || it->second.tasks.empty()) continue;
      it->second.running = true;
      task = std::move(it->second.tasks.front());
      it->second.tasks.pop_front();
    }
    task.run();
    absl::MutexLock l(&mu_);
    auto it = strands_.find(id);
    it->second.running = false;
    if (it->second.tasks.empty()) {
      strands_.erase(it);
    } else {
      ready_.push_back(id);
    }
  }
}

}  // namespace ember::store
