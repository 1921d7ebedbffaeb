// The lease keeper's decisions (lease_policy.h): which failed refreshes make a node lost, with
// which reason, and the pacing of its tries to register again.
#include "runtime/daemon/lease_policy.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace ember::daemon {
namespace {

const absl::Duration kTtl = absl::Seconds(3), kMargin = absl::Milliseconds(300);

std::string Why(const absl::Status& s, bool answered, absl::Duration since_ack) {
  return LeaseLostReason("node-a", s, answered, since_ack, kTtl, kMargin);
}

TEST_CASE("an expired lease (NOT_FOUND from the store) is a lost node") {
  CHECK(Why(absl::NotFoundError("lease 7 does not exist"), true, absl::Seconds(1)) ==
        "node lost: node-a");
  // A dial cannot find a lease gone: only the store's answer can.
  CHECK(Why(absl::NotFoundError("no such host"), false, absl::Seconds(1)).empty());
  CHECK(Why(absl::OkStatus(), true, absl::Seconds(60)).empty());
}

TEST_CASE("refused credentials are a lost node at once, naming the status and the token") {
  for (const absl::Status& s : {absl::UnauthenticatedError("missing or wrong auth token"),
                                absl::PermissionDeniedError("not allowed")}) {
    for (bool answered : {true, false}) {  // refused on the refresh or on a fresh dial
      const std::string why = Why(s, answered, absl::Milliseconds(100));
      INFO(why);
      CHECK(absl::StartsWith(why, "node lost: node-a: store refused the lease refresh: "));
      CHECK(absl::StrContains(why, s.ToString()));
      CHECK(absl::EndsWith(why, "; check the daemon's store token"));
    }
  }
  CHECK(RefusesCredentials(absl::UnauthenticatedError("x")));
  CHECK_FALSE(RefusesCredentials(absl::UnavailableError("x")));
  CHECK_FALSE(RefusesCredentials(absl::InvalidArgumentError("x")));
}

TEST_CASE("any other error is retried until lease_ttl + margin has passed since the last ack") {
  for (const absl::Status& s : {absl::UnavailableError("connection refused"),
                                absl::DeadlineExceededError("no answer"),
                                absl::InvalidArgumentError("bad lease id"),
                                absl::FailedPreconditionError("TLS mismatch")}) {
    for (bool answered : {true, false}) {
      INFO(s.ToString() << " answered " << answered);
      CHECK(Why(s, answered, absl::Seconds(2)).empty());           // a short drop rides through
      CHECK(Why(s, answered, kTtl).empty());                       // the store may still hold it
      CHECK(Why(s, answered, kTtl + kMargin).empty());             // the margin is not passed yet
      const std::string why = Why(s, answered, absl::Milliseconds(3350));
      CHECK(why == "node lost: node-a: no lease refresh acknowledged for 3.3s (lease_ttl 3s): "
                   "the store has expired the lease");
    }
  }
}

TEST_CASE("a lost node tries to register again at a bounded rate and logs boundedly") {
  CHECK(RegisterRetryDelay(1) == absl::Milliseconds(500));
  CHECK(RegisterRetryDelay(2) == absl::Seconds(1));
  CHECK(RegisterRetryDelay(4) == absl::Seconds(4));
  CHECK(RegisterRetryDelay(5) == absl::Seconds(5));
  CHECK(RegisterRetryDelay(1000) == absl::Seconds(5));
  // Over an hour of refusals: tries at most one per 5 s after the first few, log lines at most
  // one per 30 s after the first three.
  absl::Duration t, since_log = absl::InfiniteDuration();
  int tries = 0, logged = 0;
  while (t < absl::Hours(1)) {
    ++tries;
    since_log += RegisterRetryDelay(tries);
    if (LogRegisterFailure(tries, since_log)) {
      ++logged;
      since_log = absl::ZeroDuration();
    }
    t += RegisterRetryDelay(tries);
  }
  CHECK(tries <= 3600 / 5 + 5);
  CHECK(tries >= 3600 / 5);
  CHECK(logged <= 3600 / 30 + 3);
}

}  // namespace
}  // namespace ember::daemon
