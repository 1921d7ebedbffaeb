// The store client's parts without a server: the request queue and its retry rules on a broken
// connection or a passed deadline, backoff, and fast-path framing over a socketpair.
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "proto/store.pb.h"
#include "runtime/store/client_framing.h"
#include "runtime/store/client_queue.h"
#include "runtime/store/client_retry.h"

namespace ember::store::client_internal {
namespace {

using v1::Request;
using v1::Response;

Request SetReq(const std::string& k) {
  Request r;
  r.mutable_set()->set_key(k);
  r.mutable_set()->set_value("v");
  return r;
}
Request AddReq(const std::string& k) {
  Request r;
  r.mutable_add()->set_key(k);
  r.mutable_add()->set_delta(1);
  return r;
}

// Queues requests, recording each one's final response by key.
struct Harness {
  void Push(Request r, absl::Time now = absl::UnixEpoch(),
            absl::Duration timeout = absl::InfiniteDuration()) {
    std::string key = r.has_set() ? r.set().key() : r.has_add() ? r.add().key() : r.wait().keys(0);
    q.Push(std::move(r), [this, key](Response resp) { got.emplace_back(key, resp); }, now,
           timeout, /*caller_reads=*/false);
  }
  std::vector<std::string> Send(absl::Time now = absl::UnixEpoch()) {  // keys in wire order
    std::vector<std::string> keys;
    q.TakeUnsent(now, [&](const Request& r) {
      keys.push_back(r.has_set() ? r.set().key() : r.has_add() ? r.add().key() : r.wait().keys(0));
    });
    return keys;
  }
  void Run(Fired* f) {
    for (auto& [d, r] : *f) d(std::move(r));
    f->clear();
  }
  RequestQueue q;
  std::vector<std::pair<std::string, Response>> got;
};

TEST_CASE("A broken connection re-sends unsent and idempotent requests, fails a sent Add") {
  Harness h;
  h.Push(SetReq("s1"));
  h.Push(AddReq("a1"));
  h.Push(SetReq("s2"));
  REQUIRE(h.Send() == std::vector<std::string>{"s1", "a1", "s2"});
  h.Push(SetReq("s3"));  // queued after the others were sent, never sent itself
  h.Push(AddReq("a2"));
  Fired fail;
  h.q.Broken(absl::StatusCode::kUnavailable, "reset", "host:1", &fail);
  h.Run(&fail);
  // Only the sent Add fails, and says the outcome is unknown.
  REQUIRE(h.got.size() == 1);
  CHECK(h.got[0].first == "a1");
  CHECK(h.got[0].second.code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(h.got[0].second.message() ==
        "connection to store at host:1 broke while Add('a1') was in flight; outcome unknown (not "
        "retried because it is not idempotent)");
  CHECK(h.q.size() == 4);
  // The re-sent ones go first, in their original order, then the never-sent ones.
  CHECK(h.Send() == std::vector<std::string>{"s1", "s2", "s3", "a2"});
}

TEST_CASE("A permanent error (bad token) fails every request with its code") {
  Harness h;
  h.Push(SetReq("s1"));
  h.Send();
  h.Push(AddReq("a1"));
  Fired fail;
  h.q.Broken(absl::StatusCode::kUnauthenticated, "bad token", "host:1", &fail);
  h.Run(&fail);
  REQUIRE(h.got.size() == 2);
  for (const auto& [k, r] : h.got) {
    CHECK(r.code() == static_cast<int>(absl::StatusCode::kUnauthenticated));
    CHECK(r.message() == "store at host:1: bad token");
  }
  CHECK(h.q.empty());
}

TEST_CASE("Answers match requests by id; unknown ids are dropped") {
  Harness h;
  h.Push(SetReq("s1"));
  h.Push(SetReq("s2"));
  std::vector<uint64_t> ids;
  h.q.TakeUnsent(absl::UnixEpoch(), [&](const Request& r) { ids.push_back(r.id()); });
  REQUIRE(ids.size() == 2);
  CHECK(ids[0] != ids[1]);
  v1::ResponseBatch batch;
  batch.add_responses()->set_id(ids[1]);
  batch.add_responses()->set_id(999);  // timed out here already
  Fired ready;
  h.q.Answer(&batch, &ready);
  h.Run(&ready);
  REQUIRE(h.got.size() == 1);
  CHECK(h.got[0].first == "s2");
  CHECK(h.q.size() == 1);
}

TEST_CASE("Deadlines: DEADLINE_EXCEEDED when connected, UNAVAILABLE with the last error if not") {
  Harness h;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  h.Push(SetReq("early"), t0 - absl::Seconds(2), absl::Seconds(2));
  h.Push(SetReq("late"), t0, absl::Seconds(10));
  CHECK(h.q.EarliestDeadline(absl::InfiniteFuture()) == t0);
  CHECK(h.q.EarliestDeadline(t0 - absl::Seconds(1)) == t0 - absl::Seconds(1));
  Fired expired;
  // Unsent: no sign of a silent connection.
  CHECK_FALSE(h.q.Expire(t0, /*connected=*/true, "host:1", "", absl::InfinitePast(), &expired));
  h.Run(&expired);
  REQUIRE(h.got.size() == 1);
  CHECK(h.got[0].second.code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  CHECK(h.got[0].second.message() ==
        "Set('early') got no answer from the store at host:1 within its 2s deadline");
  h.q.Expire(t0 + absl::Seconds(10), /*connected=*/false, "host:1", "connection refused",
             absl::InfinitePast(), &expired);
  h.Run(&expired);
  REQUIRE(h.got.size() == 2);
  CHECK(h.got[1].second.code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(h.got[1].second.message() ==
        "store at host:1 unreachable; Set('late') gave up at its 10s deadline (last error: "
        "connection refused); is ember-store running?");
  CHECK(h.q.empty());
  CHECK(h.Send().empty());  // expired requests are never sent
}

TEST_CASE("A request the server holds gets kServerSlack past its timeout; silence is reported") {
  Harness h;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Request wait;
  wait.mutable_wait()->add_keys("w");
  h.Push(wait, t0, absl::Seconds(1));
  h.Push(SetReq("s"), t0, absl::Seconds(1));
  CHECK(BlocksOnServer(wait));
  CHECK_FALSE(BlocksOnServer(SetReq("s")));
  CHECK(h.q.EarliestDeadline(absl::InfiniteFuture()) == t0 + absl::Seconds(1));
  REQUIRE(h.Send(t0) == std::vector<std::string>{"w", "s"});
  Fired expired;
  // The Set expires at 1 s; an answer came after it was sent: the connection is not silent.
  CHECK_FALSE(h.q.Expire(t0 + absl::Seconds(1), /*connected=*/true, "host:1", "",
                         /*last_rx=*/t0 + absl::Milliseconds(1), &expired));
  h.Run(&expired);
  REQUIRE(h.got.size() == 1);
  CHECK(h.got[0].first == "s");
  // The Wait expires kServerSlack later; nothing came back since it was sent: silent.
  CHECK_FALSE(h.q.Expire(t0 + absl::Seconds(1) + kServerSlack - absl::Milliseconds(1), true,
                         "host:1", "", t0, &expired));
  CHECK(h.q.Expire(t0 + absl::Seconds(1) + kServerSlack, true, "host:1", "", t0, &expired));
  h.Run(&expired);
  REQUIRE(h.got.size() == 2);
  CHECK(h.got[1].second.message() ==
        "Wait([w]) got no answer from the store at host:1 within its 1s deadline");
  // A short deadline alone is no sign of silence: under kMinSilence since the last answer.
  const absl::Time t1 = t0 + absl::Seconds(5);
  h.Push(SetReq("short"), t1, absl::Milliseconds(10));
  h.Send(t1);
  CHECK_FALSE(h.q.Expire(t1 + absl::Milliseconds(10), true, "host:1", "", t1, &expired));
  h.Run(&expired);
  CHECK(h.got.size() == 3);
}

TEST_CASE("owned() counts the requests whose caller reads the answer") {
  RequestQueue q;
  q.Push(SetReq("a"), [](Response) {}, absl::UnixEpoch(), absl::InfiniteDuration(),
         /*caller_reads=*/true);
  q.Push(SetReq("b"), [](Response) {}, absl::UnixEpoch(), absl::InfiniteDuration(),
         /*caller_reads=*/false);
  CHECK(q.owned() == 1);
  Fired f;
  q.CancelAll(&f);
  CHECK(q.owned() == 0);
  REQUIRE(f.size() == 2);
  CHECK(f[0].second.code() == static_cast<int>(absl::StatusCode::kCancelled));
}

TEST_CASE("Retry rules: idempotence, permanent codes, bounded doubling backoff") {
  CHECK(Idempotent(SetReq("k")));
  CHECK_FALSE(Idempotent(AddReq("k")));
  Request r;
  r.mutable_lease_refresh()->set_lease_id(1);
  CHECK(Idempotent(r));
  r.mutable_lease_grant()->set_ttl_ms(1);
  CHECK_FALSE(Idempotent(r));
  CHECK(IsPermanent(absl::StatusCode::kFailedPrecondition));
  CHECK_FALSE(IsPermanent(absl::StatusCode::kUnavailable));
  ClientOptions o;
  o.initial_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(100);
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    absl::Duration b1 = Backoff(o, 1, &rng), b3 = Backoff(o, 3, &rng), b9 = Backoff(o, 9, &rng);
    CHECK(b1 >= absl::Milliseconds(10));  // 20 ms * [0.5, 1)
    CHECK(b1 < absl::Milliseconds(20));
    CHECK(b3 >= absl::Milliseconds(40));  // 80 ms * [0.5, 1)
    CHECK(b3 < absl::Milliseconds(80));
    CHECK(b9 >= absl::Milliseconds(50));  // capped at 100 ms
    CHECK(b9 < absl::Milliseconds(100));
  }
}

TEST_CASE("A frame of requests parses as a RequestBatch; FrameReader keeps partial frames") {
  std::string frame;
  BeginFrame(&frame);
  AppendRequestField(SetReq("x"), &frame);
  AppendRequestField(AddReq(std::string(300, 'y')), &frame);  // a length over one varint byte
  EndFrame(&frame);
  v1::RequestBatch batch;
  REQUIRE(batch.ParseFromString(frame.substr(4)));
  REQUIRE(batch.requests_size() == 2);
  CHECK(batch.requests(0).set().key() == "x");
  CHECK(batch.requests(1).add().key() == std::string(300, 'y'));
  CHECK(frame.size() == 4 + batch.ByteSizeLong());
  CHECK(static_cast<uint8_t>(frame[0]) + 256 * static_cast<uint8_t>(frame[1]) ==
        batch.ByteSizeLong());

  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  timeval slice{0, 20 * 1000};
  setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
  v1::ResponseBatch rb;
  rb.add_responses()->set_id(42);
  std::string payload = rb.SerializeAsString();
  std::string wire(4, '\0');
  wire[0] = static_cast<char>(payload.size());
  wire += payload;
  FrameReader reader;
  v1::ResponseBatch out;
  REQUIRE(SendAll(sv[0], absl::string_view(wire).substr(0, 3)));  // not even a whole header
  CHECK(reader.ReadSome(sv[1], &out) == FrameReader::Result::kNone);
  REQUIRE(SendAll(sv[0], absl::string_view(wire).substr(3)));
  REQUIRE(reader.ReadSome(sv[1], &out) == FrameReader::Result::kFrame);
  CHECK(out.responses(0).id() == 42);
  close(sv[0]);
  CHECK(reader.ReadSome(sv[1], &out) == FrameReader::Result::kClosed);
  close(sv[1]);
}

}  // namespace
}  // namespace ember::store::client_internal
