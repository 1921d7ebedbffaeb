// The store client's request queue (see client_queue.h).
#include "runtime/store/client_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/store/client_retry.h"

namespace ember::store::client_internal {

void RequestQueue::Push(v1::Request req, Done done, absl::Time now, absl::Duration timeout,
                        bool caller_reads) {
  const uint64_t id = ++next_id_;
  req.set_id(id);
  Pending& p = pending_[id];
  p.deadline = now + timeout + (BlocksOnServer(req) ? kServerSlack : absl::ZeroDuration());
  p.timeout = timeout;
  p.req = std::move(req);
  p.done = std::move(done);
  p.caller_reads = caller_reads;
  if (caller_reads) ++owned_;
  unsent_.push_back(id);
}

RequestQueue::Map::iterator RequestQueue::Erase(Map::iterator it) {
  if (it->second.caller_reads) --owned_;
  return pending_.erase(it);
}

void RequestQueue::Answer(v1::ResponseBatch* batch, Fired* ready) {
  for (v1::Response& r : *batch->mutable_responses()) {
    auto it = pending_.find(r.id());
    if (it == pending_.end()) continue;  // already timed out locally
    ready->emplace_back(std::move(it->second.done), std::move(r));
    Erase(it);
  }
}

void RequestQueue::Fail(Map::iterator it, absl::StatusCode code, std::string message,
                        Fired* out) {
  v1::Response r;
  r.set_id(it->first);
  r.set_code(static_cast<int>(code));
  r.set_message(std::move(message));
  out->emplace_back(std::move(it->second.done), std::move(r));
}

void RequestQueue::Broken(absl::StatusCode code, const std::string& message,
                          const std::string& address, Fired* fail) {
  const bool permanent = IsPermanent(code);
  std::deque<uint64_t> resend;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    if (!permanent && (!p.sent || Idempotent(p.req))) {
      if (p.sent) resend.push_back(it->first);
      p.sent = false;
      ++it;
      continue;
    }
    if (permanent) {
      Fail(it, code, absl::StrCat("store at ", address, ": ", message), fail);
    } else {
      Fail(it, absl::StatusCode::kUnavailable,
           absl::StrCat("connection to store at ", address, " broke while ", Describe(p.req),
                        " was in flight; outcome unknown (not retried because it is not "
                        "idempotent)"),
           fail);
    }
    it = Erase(it);
  }
  // Re-sent requests go first, in their original order.
  for (auto it = resend.rbegin(); it != resend.rend(); ++it) unsent_.push_front(*it);
}

bool RequestQueue::Expire(absl::Time now, bool connected, const std::string& address,
                          const std::string& last_error, absl::Time last_rx, Fired* expired) {
  bool silent = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const Pending& p = it->second;
    if (p.deadline > now) {
      ++it;
      continue;
    }
    const std::string what = Describe(p.req);
    const std::string deadline = absl::FormatDuration(p.timeout);
    if (connected) {
      if (p.sent && p.sent_at >= last_rx && now - last_rx >= kMinSilence) silent = true;
      Fail(it, absl::StatusCode::kDeadlineExceeded,
           absl::StrCat(what, " got no answer from the store at ", address, " within its ",
                        deadline, " deadline"),
           expired);
    } else {
      Fail(it, absl::StatusCode::kUnavailable,
           absl::StrCat("store at ", address, " unreachable; ", what, " gave up at its ",
                        deadline, " deadline (last error: ", last_error,
                        "); is ember-store running?"),
           expired);
    }
    it = Erase(it);
  }
  return silent;
}

void RequestQueue::CancelAll(Fired* fail) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    Fail(it, absl::StatusCode::kCancelled, "store client closed", fail);
  }
  pending_.clear();
  unsent_.clear();
  owned_ = 0;
}

absl::Time RequestQueue::EarliestDeadline(absl::Time cap) const {
  for (const auto& [id, p] : pending_) cap = std::min(cap, p.deadline);
  return cap;
}

}  // namespace ember::store::client_internal
