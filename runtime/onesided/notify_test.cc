// Notifications of every size up to kMaxNotificationBytes between two agents in one process (the
// agents use separate UCX workers, as in two processes), over UCX's own transport choice and over
// TCP: each arrives whole, byte for byte, and in send order, also when small and large ones are
// interleaved (a large one is several eager fragments; a small one sent after it must not pass it);
// a notification after puts and one right behind it, with nothing to flush; finished Works.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"

namespace ember::onesided {
namespace {

std::string Message(size_t n, int seed) {
  std::string m(n, '\0');
  for (size_t i = 0; i < n; ++i) m[i] = static_cast<char>(i * 31 + seed * 7 + (i >> 12));
  return m;
}

// Two connected agents with UCX_TLS set to `tls` (null: unset, UCX's choice).
std::unique_ptr<testing::AgentPair> PairOver(const char* tls) {
  if (tls == nullptr) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls, 1);
  }
  auto pair = testing::AgentPair::Create();
  REQUIRE(pair.ok());
  return std::move(*pair);
}

void RoundTrips(const char* tls) {
  auto pair = PairOver(tls);
  Agent* a = pair->a.get();
  Agent* b = pair->b.get();
  Connection* cb = pair->b_to_a;
  const std::vector<size_t> sizes = {0, 1, 8, 4096, 4097, 65536 + 3, 1 << 20, kMaxNotificationBytes};
  std::vector<Work> sent;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sent.push_back(b->Notify(cb, Message(sizes[i], static_cast<int>(i))));
    sent.push_back(b->Notify(cb, Message(3, 100 + static_cast<int>(i))));  // small, right after
  }
  for (const Work& w : sent) CHECK(w.Wait(absl::Seconds(20)).ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (const std::string& want : {Message(sizes[i], static_cast<int>(i)), Message(3, 100 + static_cast<int>(i))}) {
      auto n = a->WaitNotification(absl::Seconds(20));
      REQUIRE(n.ok());
      CHECK(n->peer == "b");
      INFO("size " << sizes[i]);
      CHECK(n->message.size() == want.size());
      CHECK(n->message == want);
    }
  }
  CHECK(b->Notify(cb, std::string(kMaxNotificationBytes + 1, 'x')).Wait(absl::Seconds(1)).code() ==
        absl::StatusCode::kInvalidArgument);
  unsetenv("UCX_TLS");
}

// b puts into a's region and notifies (the flushing path), then notifies again at once with nothing
// to flush (sent straight from Notify when UCX completes it at once): at the first notification
// the data is in place, and the second never passes the first; rounds alternate quickly, as a
// ping-pong does.
void PutThenNotify(const char* tls) {
  auto pair = PairOver(tls);
  Agent* a = pair->a.get();
  Agent* b = pair->b.get();
  constexpr uint64_t kBytes = 3 << 20;
  auto ra = a->AllocateMemory(kBytes);
  auto rb = b->AllocateMemory(kBytes);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  auto remote = pair->b_to_a->ImportRegion(ra->descriptor);
  REQUIRE(remote.ok());
  for (int round = 0; round < 20; ++round) {
    const uint64_t n = round % 2 == 0 ? kBytes : 4096 + round;
    const std::string data = Message(n, round);
    memcpy(rb->base, data.data(), n);
    Work put = b->Put(pair->b_to_a, {{rb->id, 0, n}}, {{*remote, 0, n}});
    Work first = b->Notify(pair->b_to_a, absl::StrCat("data ", round));
    Work second = b->Notify(pair->b_to_a, absl::StrCat("after ", round));
    for (const Work* w : {&put, &first, &second}) REQUIRE(w->Wait(absl::Seconds(20)).ok());
    auto n1 = a->WaitNotification(absl::Seconds(20));
    REQUIRE(n1.ok());
    CHECK(n1->message == absl::StrCat("data ", round));
    CHECK(memcmp(ra->base, data.data(), n) == 0);
    auto n2 = a->WaitNotification(absl::Seconds(20));
    REQUIRE(n2.ok());
    CHECK(n2->message == absl::StrCat("after ", round));
  }
  unsetenv("UCX_TLS");
}

TEST_CASE("a finished Work: OK without a state, an error with its status") {
  Work ok = Work::Finished(absl::OkStatus());
  CHECK(ok.Done());
  CHECK(ok.Wait(absl::ZeroDuration()).ok());
  Work copy = ok;
  CHECK(copy.Wait(absl::Seconds(1), WaitStyle::kBlock).ok());
  Work failed = Work::Finished(absl::UnavailableError("gone"));
  CHECK(failed.Done());
  CHECK(failed.Wait(absl::ZeroDuration()).code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("a notification after puts announces their data; one with nothing to flush follows it") {
  SECTION("UCX's transports") { PutThenNotify(nullptr); }
  SECTION("UCX_TLS=tcp") { PutThenNotify("tcp"); }
}

TEST_CASE("notifications up to the limit arrive whole and in order (UCX's transports)") { RoundTrips(nullptr); }
TEST_CASE("notifications up to the limit arrive whole and in order (UCX_TLS=tcp)") { RoundTrips("tcp"); }

}  // namespace
}  // namespace ember::onesided
