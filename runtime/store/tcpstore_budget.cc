#include "runtime/store/tcpstore_budget.h"

#include <algorithm>

#include "absl/synchronization/mutex.h"

namespace ember::store::tcpstore {
namespace {
constexpr int64_t kParkedNs = 1'000'000'000;  // a rerun unanswered this long gives the turn up
}  // namespace

bool Turns::MayRead(const std::shared_ptr<Conn>& c) {
  if (!budget_->Over() || !c->Growing()) return true;
  if (c == read_holder_ && c->request_seq == read_seq_) return true;
  if (!c->read_queued) {
    c->read_queued = true;
    read_queue_.push_back(c);
  }
  return false;
}

bool Turns::MayRerun(const std::shared_ptr<Conn>& c) {
  if (c == reply_holder_ && !reply_used_) {
    reply_used_ = true;
    reply_seq_ = c->request_seq + 1;  // the rerun's
    return true;
  }
  if (!c->reply_queued) {
    c->reply_queued = true;
    reply_queue_.push_back(c);
  }
  return false;
}

void Turns::Rebalance(int64_t now_ns, std::vector<std::shared_ptr<Conn>>* resume) {
  // Read turn: held until the query it was granted for ran (or the connection closed).
  if (read_holder_ && (!read_holder_->open || read_holder_->request_seq != read_seq_ ||
                       !read_holder_->Growing())) {
    read_holder_.reset();
  }
  if (!budget_->Over()) {
    for (auto& c : read_queue_) {
      c->read_queued = false;
      if (c->open) resume->push_back(std::move(c));
    }
    read_queue_.clear();
  } else if (read_holder_ == nullptr) {
    while (!read_queue_.empty()) {
      std::shared_ptr<Conn> c = std::move(read_queue_.front());
      read_queue_.pop_front();
      c->read_queued = false;
      if (!c->open || !c->Growing()) continue;
      read_holder_ = c;
      read_seq_ = c->request_seq;
      read_since_ns_ = now_ns;
      resume->push_back(std::move(c));
      break;
    }
  }

  // Reply turn: held until the rerun's answer left (or it parked, or the connection closed).
  if (reply_holder_) {
    Conn* c = reply_holder_.get();
    bool release = !c->open || (reply_used_ && c->request_seq != reply_seq_);
    if (!release && reply_used_) {
      absl::MutexLock l(&c->mu);
      release = c->rerun || (!c->awaiting && !c->OutPendingLocked()) ||
                (c->awaiting && !c->done && now_ns - c->run_ns > kParkedNs);
    }
    if (release) {
      absl::MutexLock l(&c->mu);
      c->reply_turn = false;
      reply_holder_.reset();
    }
  }
  while (reply_holder_ == nullptr && !reply_queue_.empty()) {
    std::shared_ptr<Conn> c = std::move(reply_queue_.front());
    reply_queue_.pop_front();
    c->reply_queued = false;
    if (!c->open || !c->rerun) continue;
    {
      absl::MutexLock l(&c->mu);
      c->reply_turn = true;
    }
    reply_holder_ = c;
    reply_used_ = false;
    resume->push_back(std::move(c));
  }
}

std::shared_ptr<Conn> Turns::StalledReader(int64_t now_ns, int64_t limit_ns) const {
  if (read_holder_ == nullptr || !budget_->Over() || read_holder_->request_seq != read_seq_) {
    return nullptr;
  }
  const int64_t since = std::max(read_since_ns_, read_holder_->last_input_ns);
  return now_ns - since > limit_ns ? read_holder_ : nullptr;
}

}  // namespace ember::store::tcpstore
