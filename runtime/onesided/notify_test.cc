// Notifications of every size up to kMaxNotificationBytes between two agents in one process (the
// agents use separate UCX workers, as in two processes), over UCX's own transport choice and over
// TCP: each arrives whole, byte for byte, and in send order, also when small and large ones are
// interleaved (a large one is several eager fragments; a small one sent after it must not pass it).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/onesided/agent.h"
#include "runtime/onesided/agent_pair.h"

namespace ember::onesided {
namespace {

std::string Message(size_t n, int seed) {
  std::string m(n, '\0');
  for (size_t i = 0; i < n; ++i) m[i] = static_cast<char>(i * 31 + seed * 7 + (i >> 12));
  return m;
}

void RoundTrips(const char* tls) {
  if (tls == nullptr) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls, 1);
  }
  auto pair = testing::AgentPair::Create();
  REQUIRE(pair.ok());
  Agent* a = (*pair)->a.get();
  Agent* b = (*pair)->b.get();
  Connection* cb = (*pair)->b_to_a;
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

TEST_CASE("notifications up to the limit arrive whole and in order (UCX's transports)") { RoundTrips(nullptr); }
TEST_CASE("notifications up to the limit arrive whole and in order (UCX_TLS=tcp)") { RoundTrips("tcp"); }

}  // namespace
}  // namespace ember::onesided
