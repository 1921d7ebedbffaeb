// EtcdWatcher: one etcd watch on a key range, kept open across member failures: after a broken
// stream it reconnects (next endpoint, backoff) and resumes from the revision after the last event
// it delivered, so events arrive once each, in revision order, with no gap. If etcd compacted that
// revision away, it logs the gap and resumes from the oldest revision etcd still has.
//
// Thread-safety: `on_events` runs on the watcher's own thread, one response at a time. Stop() (and
// the destructor) cancel the stream and join that thread: no callback runs after it returns.
#ifndef EMBER_RUNTIME_STORE_ETCD_WATCH_H_
#define EMBER_RUNTIME_STORE_ETCD_WATCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "proto/etcd/rpc.pb.h"
#include "runtime/store/etcd_client.h"

namespace ember::store {

class EtcdWatcher {
 public:
  using OnEvents = std::function<void(const etcdserverpb::WatchResponse& events)>;
  // Watches [key, range_end) from start_revision (inclusive). `client` must outlive the watcher.
  EtcdWatcher(EtcdClient* client, std::string key, std::string range_end, int64_t start_revision,
              OnEvents on_events);
  ~EtcdWatcher() { Stop(); }
  void Stop();

 private:
  void Loop();

  EtcdClient* const client_;
  const std::string key_, range_end_;
  const OnEvents on_events_;
  int64_t next_revision_;  // only the watcher thread touches it
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_ETCD_WATCH_H_
