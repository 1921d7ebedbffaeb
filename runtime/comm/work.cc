#include "runtime/comm/work.h"

#include <immintrin.h>

#include "absl/strings/str_cat.h"

namespace ember::comm {

absl::Status Work::Wait(absl::Duration timeout, bool block_host) {
  for (int i = 0; i < 4000 && !IsCompleted(); ++i) _mm_pause();
  const absl::Time start = absl::Now();
  std::shared_ptr<DeviceEvents> events;
  {
    absl::MutexLock l(&mu_);
    bool (*is_done)(std::atomic<bool>*) = [](std::atomic<bool>* d) { return d->load(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(is_done, &done_), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          op_, " (seq ", seq_, ") not completed within ", absl::FormatDuration(timeout)));
    }
    if (!status_.ok() || events_ == nullptr) return status_;
    events = events_;
  }
  if (!block_host) return events->StreamWait();
  return events->Synchronize(timeout - (absl::Now() - start));
}

void Work::SetDeviceEvents(std::shared_ptr<DeviceEvents> e) {
  absl::MutexLock l(&mu_);
  events_ = std::move(e);
}

std::shared_ptr<DeviceEvents> Work::device_events() const {
  absl::MutexLock l(&mu_);
  return events_;
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
