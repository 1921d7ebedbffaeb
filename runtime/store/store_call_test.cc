// Backend::Call (the synchronous entry, backend.h) on the backend of the test binary: linked into
// store_test (in-memory) and store_etcd_suite_test (etcd), like store_test.cc.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/store/store_test_backend.h"

namespace ember::store {
namespace {

TEST_CASE("Backend::Call answers one request in the caller's order; blocking reads wait") {
  StoreServerOptions opts;
  testing::UseTestBackend(&opts);  // in-memory or etcd, per test binary (store_test_backend.h)
  auto server = StoreServer::Start(std::move(opts));
  REQUIRE(server.ok());
  auto client = Client::Connect(ClientOptions{.address = (*server)->address()});
  REQUIRE(client.ok());
  Backend* b = (*server)->backend();
  v1::Request set;
  set.mutable_set()->set_key("call/k");
  set.mutable_set()->set_value("v");
  v1::Response r = b->Call(set, 0);
  REQUIRE(r.code() == 0);
  REQUIRE(r.set().revision() > 0);
  v1::Request get;
  get.mutable_get()->set_key("call/k");
  r = b->Call(get, 0);
  REQUIRE(r.code() == 0);
  REQUIRE(r.get().found());
  REQUIRE(r.get().value() == "v");
  // Queued requests of the same owner are answered first, and the Call sees their writes.
  constexpr int kAdds = 20;
  std::vector<v1::Request> adds(kAdds);
  std::vector<const v1::Request*> batch;
  for (int i = 0; i < kAdds; ++i) {
    adds[i].set_id(i + 1);
    adds[i].mutable_add()->set_key("call/n");
    adds[i].mutable_add()->set_delta(1);
    batch.push_back(&adds[i]);
  }
  std::atomic<int> added{0};
  b->Execute(batch, [&](v1::Response a) { added += a.code() == 0; }, /*owner=*/7);
  v1::Request read;
  read.set_id(99);
  read.mutable_get()->set_key("call/n");
  r = b->Call(read, 7);
  REQUIRE(r.id() == 99);
  REQUIRE(added == kAdds);
  REQUIRE(r.get().value() == std::to_string(kAdds));
  // A blocking get waits for the key on the calling thread, then times out naming it.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    REQUIRE(client->Set("call/late", "w").ok());
  });
  v1::Request wait;
  wait.mutable_get()->set_key("call/late");
  wait.mutable_get()->set_wait(true);
  wait.mutable_get()->set_timeout_ms(10000);
  r = b->Call(wait, 8);
  setter.join();
  REQUIRE(r.code() == 0);
  REQUIRE(r.get().value() == "w");
  wait.mutable_get()->set_key("call/never");
  wait.mutable_get()->set_timeout_ms(200);
  r = b->Call(wait, 8);
  REQUIRE(r.code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  REQUIRE(r.message().find("call/never") != std::string::npos);
}

}  // namespace
}  // namespace ember::store
