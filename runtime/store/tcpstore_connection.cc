#include "runtime/store/tcpstore_connection.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ember::store::tcpstore {

int64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

bool WarnLimiter::Warn(const std::string& kind, const std::string& message) {
  const int64_t now = MonoNs();
  Slot& s = slots_[kind];
  if (s.logged && now - s.last_ns < interval_ns_) {
    ++s.suppressed;
    ++suppressed_total_;
    return false;
  }
  if (s.suppressed > 0) {
    spdlog::warn("store: TCPStore {} ({} more like it in the last {} ms not logged)", message,
                 s.suppressed, (now - s.last_ns) / 1'000'000);
  } else {
    spdlog::warn("store: TCPStore {}", message);
  }
  s.logged = true;
  s.last_ns = now;
  s.suppressed = 0;
  return true;
}

void WarnLimiter::Flush(int64_t now_ns) {
  for (auto& [kind, s] : slots_) {
    if (s.suppressed == 0 || now_ns - s.last_ns < interval_ns_) continue;
    spdlog::warn("store: TCPStore: {} more warnings of kind '{}' in the last {} ms not logged",
                 s.suppressed, kind, (now_ns - s.last_ns) / 1'000'000);
    s.suppressed = 0;
    s.last_ns = now_ns;
  }
}

void Conn::WriteLocked(const char* p, size_t n) {
  if (fd < 0 || !broken.empty() || n == 0) return;
  if (!OutPendingLocked()) {
    while (n > 0) {
      const ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        n -= static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      broken = absl::StrCat("send failed: ", k < 0 ? strerror(errno) : "0 bytes");
      return;
    }
    if (n == 0) return;
    out.clear();
    out_off = 0;
    out_progress_ns = MonoNs();
  }
  if (out.size() - out_off + n > max_unsent) {
    broken = absl::StrCat(out.size() - out_off + n, " bytes of replies unsent, above "
                          "max_unsent_bytes=", max_unsent, " (the client does not read)");
    std::string().swap(out);
    out_off = 0;
    SyncOutLocked();
    return;
  }
  out.append(p, n);
  SyncOutLocked();
}

void Conn::FlushLocked() {
  while (fd >= 0 && OutPendingLocked() && broken.empty()) {
    const ssize_t k = send(fd, out.data() + out_off, out.size() - out_off,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      out_off += static_cast<size_t>(k);
      out_progress_ns = MonoNs();
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    broken = absl::StrCat("send failed: ", k < 0 ? strerror(errno) : "0 bytes");
  }
  if (!OutPendingLocked()) {
    if (out.capacity() > kSmallReplyBytes) std::string().swap(out);  // (charged to the budget)
    out.clear();
    out_off = 0;
    SyncOutLocked();
  }
}

void Conn::Answer(const ReplyPlan& plan, bool turn, const v1::Response& r) {
  std::string reply;
  if (r.code() == 0) reply = FormatReply(plan, r);
  absl::MutexLock l(&mu);
  done = true;
  done_code = r.code();
  done_message = r.message();
  if (r.code() != 0 || (plan.op == Op::kWait && cancel_requested)) return;
  int64_t reserved = 0;
  if (reply.size() > kSmallReplyBytes && MayRunAgain(plan.op, &r) && !(turn && reply_turn)) {
    reserved = static_cast<int64_t>(reply.size());
    if (!budget->TryReserve(reserved)) {
      refused = true;
      return;
    }
  }
  WriteLocked(reply.data(), reply.size());
  budget->Add(-reserved);
}

std::string StoreKey(const std::string& key_prefix, const std::string& k) {
  return absl::StrCat(key_prefix, absl::string_view(k).substr(!k.empty() && k[0] == '/' ? 1 : 0));
}

bool BuildRequest(Query& q, const std::string& key_prefix, v1::Request* req, ReplyPlan* plan) {
  req->set_id(1);
  plan->op = q.op;
  auto& s = q.strs;
  auto key = [&key_prefix](const std::string& k) { return StoreKey(key_prefix, k); };
  switch (q.op) {
    case Op::kSet:
      req->mutable_set()->set_key(key(s[0]));
      req->mutable_set()->set_value(std::move(s[1]));
      return true;
    case Op::kAppend:
      req->mutable_append()->set_key(key(s[0]));
      req->mutable_append()->set_value(std::move(s[1]));
      return true;
    case Op::kMultiSet:
      for (size_t i = 0; i + 1 < s.size(); i += 2) {
        auto* kv = req->mutable_multi_set()->add_kvs();
        kv->set_key(key(s[i]));
        kv->set_value(std::move(s[i + 1]));
      }
      return true;
    case Op::kMultiGet:
      for (const std::string& k : s) req->mutable_multi_get()->add_keys(key(k));
      req->mutable_multi_get()->set_wait(true);  // the client waited already
      return true;
    case Op::kCompareSet: {
      auto* cs = req->mutable_compare_set();
      cs->set_key(key(s[0]));
      cs->set_expect_absent(s[1].empty());
      cs->set_expected(s[1]);
      cs->set_desired(std::move(s[2]));
      plan->expected = std::move(s[1]);
      return true;
    }
    case Op::kGet:
      req->mutable_get()->set_key(key(s[0]));
      req->mutable_get()->set_wait(true);  // the client waited already; a wait costs nothing then
      return true;
    case Op::kAdd:
      req->mutable_add()->set_key(key(s[0]));
      req->mutable_add()->set_delta(static_cast<int64_t>(q.num));
      return true;
    case Op::kCheck:
      for (const std::string& k : s) req->mutable_check()->add_keys(key(k));
      return true;
    case Op::kWait:
      for (const std::string& k : s) req->mutable_wait()->add_keys(key(k));
      return true;
    case Op::kNumKeys: req->mutable_num_keys()->set_prefix(key_prefix); return true;
    case Op::kDelete: req->mutable_delete_()->set_key(key(s[0])); return true;
    default: return false;
  }
}

namespace {
void AppendString(const std::string& s, std::string* out) {
  const uint64_t n = s.size();
  out->append(reinterpret_cast<const char*>(&n), 8);
  out->append(s);
}
void AppendI64(int64_t v, std::string* out) { out->append(reinterpret_cast<const char*>(&v), 8); }
}  // namespace

std::string FormatReply(const ReplyPlan& plan, const v1::Response& r) {
  std::string out;
  switch (plan.op) {
    case Op::kGet: AppendString(r.get().value(), &out); break;
    case Op::kMultiGet:
      for (const std::string& v : r.multi_get().values()) AppendString(v, &out);
      break;
    case Op::kCompareSet: {
      // torch: a missing key with a non-empty expectation answers the expectation.
      const auto& a = r.compare_set();
      AppendString(!a.exists() && !a.swapped() ? plan.expected : a.current(), &out);
      break;
    }
    case Op::kAdd: AppendI64(r.add().value(), &out); break;
    case Op::kNumKeys: AppendI64(r.num_keys().count(), &out); break;
    case Op::kDelete: AppendI64(r.delete_().deleted() ? 1 : 0, &out); break;
    case Op::kCheck:
      out.push_back(static_cast<char>(r.check().all_exist() ? kCheckReady : kCheckNotReady));
      break;
    case Op::kWait: out.push_back(static_cast<char>(kStopWaiting)); break;
    default: break;  // SET, APPEND, MULTI_SET: no reply
  }
  return out;
}

bool MayRunAgain(Op op, const v1::Response* r) {
  switch (op) {
    case Op::kGet:
    case Op::kMultiGet: return true;
    case Op::kCompareSet: return r == nullptr || !r->compare_set().swapped();
    default: return false;
  }
}

thread_local const ReadyQueue* ReadyQueue::on_loop_thread_ = nullptr;

ReadyQueue::ReadyQueue() : wake_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
ReadyQueue::~ReadyQueue() {
  if (wake_fd >= 0) close(wake_fd);
}

void ReadyQueue::Push(std::shared_ptr<Conn> c) {
  if (on_loop_thread_ == this) {  // no wake-up needed: the loop drains local_ before waiting
    if (c.get() != running) local_.push_back(std::move(c));  // (the loop is on that one now)
    return;
  }
  {
    absl::MutexLock l(&mu_);
    if (stopped_) return;
    foreign_.push_back(std::move(c));
    if (signalled_) return;
    signalled_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd, &one, sizeof(one));
}

std::vector<std::shared_ptr<Conn>> ReadyQueue::Take() {
  std::vector<std::shared_ptr<Conn>> all;
  all.swap(local_);
  absl::MutexLock l(&mu_);
  for (auto& c : foreign_) all.push_back(std::move(c));
  foreign_.clear();
  signalled_ = false;
  return all;
}

void ReadyQueue::Stop() {
  absl::MutexLock l(&mu_);
  stopped_ = true;
  foreign_.clear();
}

}  // namespace ember::store::tcpstore
