// EtcdWatcher: see etcd_watch.h.
#include "runtime/store/etcd_watch.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace ember::store {

EtcdWatcher::EtcdWatcher(EtcdClient* client, std::string key, std::string range_end,
                         int64_t start_revision, OnEvents on_events)
    : client_(client), key_(std::move(key)), range_end_(std::move(range_end)),
      on_events_(std::move(on_events)), next_revision_(start_revision) {
  thread_ = std::thread([this] { Loop(); });
}

void EtcdWatcher::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void EtcdWatcher::Loop() {
  for (int failures = 0;;) {
    grpc::ClientContext ctx;
    client_->PrepareContext(&ctx);
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      ctx_ = &ctx;
    }
    auto stream = client_->Current().watch->Watch(&ctx);
    etcdserverpb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(key_);
    create->set_range_end(range_end_);
    create->set_start_revision(next_revision_);
    create->set_progress_notify(true);
    bool healthy = stream->Write(req);
    bool broke = false;  // we end the stream (compaction, cancel), not the server
    etcdserverpb::WatchResponse resp;
    while (healthy && !broke && stream->Read(&resp)) {
      if (resp.compact_revision() > 0) {
        spdlog::error("store: etcd compacted revisions before {} that a watch on '{}' had not "
                      "seen yet (it resumes from there: changes in between are lost)",
                      resp.compact_revision(), key_);
        next_revision_ = resp.compact_revision();
        broke = true;
        continue;
      }
      if (resp.canceled()) {
        spdlog::warn("store: etcd cancelled a watch on '{}': {}", key_, resp.cancel_reason());
        broke = true;
        continue;
      }
      failures = 0;
      if (resp.events_size() == 0) continue;
      next_revision_ = resp.events(resp.events_size() - 1).kv().mod_revision() + 1;
      on_events_(resp);
    }
    if (broke || !healthy) ctx.TryCancel();
    grpc::Status s = stream->Finish();
    {
      absl::MutexLock l(&mu_);
      ctx_ = nullptr;
      if (stop_) return;
    }
    if (!s.ok() && failures == 0) {  // once per outage
      spdlog::warn("store: etcd watch on '{}' broke ({}); resuming from revision {}", key_,
                   s.error_message(), next_revision_);
    }
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) client_->InvalidateToken();
    if (!s.ok()) client_->Rotate();
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), EtcdClient::Backoff(++failures));
  }
}

}  // namespace ember::store
