#include "runtime/comm/p2p_engine.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::comm::internal {

void P2PEngine::Post(bool send, char* data, size_t bytes, int peer, int tag,
                     std::function<void(absl::Status)> done) {
  auto op = std::make_shared<Op>();
  op->buf = data;
  op->bytes = bytes;
  op->tag = tag;
  op->cb = std::move(done);
  absl::Status fail;
  bool complete = false;
  {
    absl::MutexLock l(&mu_);
    if (!failed_.ok()) {
      fail = failed_;
    } else if (send) {
      op->hdr.tag = tag;
      op->hdr.bytes = bytes;
      sendq_[peer].push_back(op);
    } else {
      // An unexpected message already here?
      auto& uq = unexpected_[peer];
      auto it = std::find_if(uq.begin(), uq.end(),
                             [&](const Unexpected& u) { return u.complete && u.tag == tag; });
      if (it != uq.end()) {
        if (it->data.size() != bytes) {
          fail = absl::InvalidArgumentError(absl::StrCat(
              "recv from rank ", peer, " tag ", tag, " expects ", bytes, " bytes but the peer sent ",
              it->data.size()));
        } else {
          if (bytes) std::memcpy(data, it->data.data(), bytes);
          complete = true;
        }
        uq.erase(it);
      } else {
        posted_[peer].push_back(op);
      }
    }
  }
  if (!fail.ok()) {
    op->cb(fail);
  } else if (complete) {
    op->cb(absl::OkStatus());
  } else {
    Wake();
  }
}

void P2PEngine::Wake() {
  if (Doorbell* b = bell_.load(std::memory_order_acquire)) RingDoorbell(b);
}

void P2PEngine::FailAll(const absl::Status& s) {
  std::vector<std::function<void(absl::Status)>> cbs;
  {
    absl::MutexLock l(&mu_);
    if (failed_.ok()) failed_ = s;
    for (auto& q : sendq_) {
      for (auto& op : q) cbs.push_back(std::move(op->cb));
      q.clear();
    }
    for (auto& q : posted_) {
      for (auto& op : q) cbs.push_back(std::move(op->cb));
      q.clear();
    }
    for (auto& in : in_) in.op.reset();
  }
  for (auto& cb : cbs)
    if (cb) cb(s);
}

bool P2PEngine::AnyPendingLocked() const {
  for (const auto& q : sendq_)
    if (!q.empty()) return true;
  for (const auto& q : posted_)
    if (!q.empty()) return true;
  for (const auto& in : in_)
    if (in.active || in.hdr_got > 0) return true;
  return false;
}

bool P2PEngine::ProgressLocked(
    std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>>* done) {
  bool progressed = false;
  const int n = static_cast<int>(sendq_.size());
  for (int p = 0; p < n; ++p) {
    Channel* ch = channels_[p];
    if (!ch || dead_[p]) continue;
    absl::Status err;
    // Sends: header, then payload, one message at a time per peer.
    while (!sendq_[p].empty() && err.ok()) {
      Op& op = *sendq_[p].front();
      if (!op.hdr_sent) {
        // The header goes as one unit; TrySend may take part of it, so track via done.
        size_t off = op.done;
        absl::StatusOr<size_t> k =
            ch->TrySend(reinterpret_cast<char*>(&op.hdr) + off, sizeof(P2PHeader) - off);
        if (!k.ok()) { err = k.status(); break; }
        op.done += *k;
        progressed |= *k > 0;
        if (op.done < sizeof(P2PHeader)) break;
        op.hdr_sent = true;
        op.done = 0;
      }
      if (op.done < op.bytes) {
        absl::StatusOr<size_t> k = ch->TrySend(op.buf + op.done, std::min(op.bytes - op.done, kStepBytes));
        if (!k.ok()) { err = k.status(); break; }
        op.done += *k;
        progressed |= *k > 0;
      }
      if (op.done < op.bytes) break;
      done->emplace_back(std::move(op.cb), absl::OkStatus());
      sendq_[p].pop_front();
    }
    // Receives: read a header, route the payload.
    for (int guard = 0; guard < 64 && err.ok(); ++guard) {
      Incoming& in = in_[p];
      if (!in.active) {
        absl::StatusOr<size_t> k = ch->TryRecv(reinterpret_cast<char*>(&in.hdr) + in.hdr_got,
                                               sizeof(P2PHeader) - in.hdr_got);
        if (!k.ok()) { err = k.status(); break; }
        in.hdr_got += *k;
        progressed |= *k > 0;
        if (in.hdr_got < sizeof(P2PHeader)) break;
        in.hdr_got = 0;
        if (in.hdr.magic != kP2PMagic) {
          err = absl::InternalError(absl::StrCat("p2p stream from rank ", p, " is out of sync"));
          break;
        }
        in.active = true;
        in.remaining = in.hdr.bytes;
        in.op.reset();
        in.dst = nullptr;
        in.to_unexpected = false;
        auto& pq = posted_[p];
        auto it = std::find_if(pq.begin(), pq.end(),
                               [&](const std::shared_ptr<Op>& o) { return o->tag == in.hdr.tag; });
        if (it != pq.end()) {
          std::shared_ptr<Op> op = *it;
          pq.erase(it);
          if (op->bytes != in.hdr.bytes) {
            done->emplace_back(std::move(op->cb),
                               absl::InvalidArgumentError(absl::StrCat(
                                   "recv from rank ", p, " tag ", in.hdr.tag, " expects ",
                                   op->bytes, " bytes but the peer sent ", in.hdr.bytes)));
          } else {
            in.op = op;
            in.dst = op->buf;
          }
        } else {
          unexpected_[p].push_back(Unexpected{in.hdr.tag, std::vector<char>(in.hdr.bytes)});
          in.dst = unexpected_[p].back().data.data();
          in.to_unexpected = true;
        }
      }
      if (in.remaining > 0) {
        size_t k;
        if (in.dst) {
          absl::StatusOr<size_t> r =
              ch->TryRecv(in.dst + (in.hdr.bytes - in.remaining), std::min(in.remaining, kStepBytes));
          if (!r.ok()) { err = r.status(); break; }
          k = *r;
        } else {
          char sink[4096];
          absl::StatusOr<size_t> r = ch->TryRecv(sink, std::min(in.remaining, sizeof(sink)));
          if (!r.ok()) { err = r.status(); break; }
          k = *r;
        }
        in.remaining -= k;
        progressed |= k > 0;
        if (in.remaining > 0) break;
      }
      in.active = false;
      if (in.op) {
        done->emplace_back(std::move(in.op->cb), absl::OkStatus());
        in.op.reset();
      } else if (in.to_unexpected) {
        // An unexpected message is complete; a matching recv may have been posted meanwhile.
        Unexpected& u = unexpected_[p].back();
        u.complete = true;
        auto& pq = posted_[p];
        auto it = std::find_if(pq.begin(), pq.end(),
                               [&](const std::shared_ptr<Op>& o) { return o->tag == u.tag; });
        if (it != pq.end()) {
          std::shared_ptr<Op> op = *it;
          pq.erase(it);
          if (op->bytes != u.data.size()) {
            done->emplace_back(std::move(op->cb),
                               absl::InvalidArgumentError(absl::StrCat(
                                   "recv from rank ", p, " tag ", u.tag, " expects ", op->bytes,
                                   " bytes but the peer sent ", u.data.size())));
          } else {
            if (op->bytes) std::memcpy(op->buf, u.data.data(), op->bytes);
            done->emplace_back(std::move(op->cb), absl::OkStatus());
          }
          unexpected_[p].pop_back();
        }
      }
    }
    if (!err.ok()) {
      // The peer is gone: fail what involves it.
      absl::Status s = base::Annotate(err, absl::StrCat("p2p with rank ", p));
      for (auto& op : sendq_[p]) done->emplace_back(std::move(op->cb), s);
      sendq_[p].clear();
      for (auto& op : posted_[p]) done->emplace_back(std::move(op->cb), s);
      posted_[p].clear();
      if (in_[p].op) done->emplace_back(std::move(in_[p].op->cb), s);
      in_[p] = Incoming();
      dead_[p] = true;  // stop polling it
    }
  }
  return progressed;
}

void P2PEngine::Loop() {
  int idle = 0;
  Doorbell* bell = bell_.load(std::memory_order_acquire);
  ShmWaiter waiter(bell, spin_);
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> done;
  std::vector<pollfd> fds;
  while (true) {
    bool progressed;
    bool any_shm = false;
    {
      absl::MutexLock l(&mu_);
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || AnyPendingLocked();
      };
      bool (*cond)(decltype(wake)*) = [](decltype(wake)* w) { return (*w)(); };
      if (!wake()) {
        waiter.Busy();
        mu_.AwaitWithTimeout(absl::Condition(cond, &wake), absl::Milliseconds(50));
        idle = 0;
      }
      if (stop_) break;
      if (!failed_.ok()) {
        idle = 0;
        continue;
      }
      progressed = ProgressLocked(&done);
      fds.clear();
      for (size_t p = 0; p < sendq_.size(); ++p) {
        Channel* ch = channels_[p];
        if (!ch || dead_[p]) continue;
        if (ch->is_shm()) {
          any_shm = true;
        } else {
          fds.push_back({ch->fd(), static_cast<short>(POLLIN | (sendq_[p].empty() ? 0 : POLLOUT)), 0});
        }
      }
    }
    for (auto& d : done)
      if (d.first) d.first(d.second);
    done.clear();
    if (progressed) {
      idle = 0;
      waiter.Busy();
      continue;
    }
    if (any_shm && fds.empty() && bell) {
      waiter.Idle();  // Post() and Stop() ring the doorbell too
      continue;
    }
    waiter.Busy();
    ++idle;
    if (any_shm) fds.clear();
    Backoff(idle, fds);
  }
}

}  // namespace ember::comm::internal
