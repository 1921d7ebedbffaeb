#include "runtime/comm/work.h"

#include <immintrin.h>

#include "absl/strings/str_cat.h"

namespace ember::comm {

absl::Status Work::Wait(absl::Duration timeout) {
  for (int i = 0; i < 4000 && !IsCompleted(); ++i) _mm_pause();
  absl::MutexLock l(&mu_);
  bool (*is_done)(std::atomic<bool>*) = [](std::atomic<bool>* d) { return d->load(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(is_done, &done_), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(op_, " (seq ", seq_, ") not completed within ",
                                                    absl::FormatDuration(timeout)));
  }
  return status_;
}

absl::Status Work::status() const {
  absl::MutexLock l(&mu_);
  return status_;
}

bool Work::Finish(absl::Status s) {
  absl::MutexLock l(&mu_);
  if (done_.load(std::memory_order_relaxed)) return false;
  status_ = std::move(s);
  done_.store(true, std::memory_order_release);
  return true;
}

}  // namespace ember::comm
