// The device backends' policy (runtime/comm/device_backend.h: nccl, nccl-lazy, nccl-legacy) run by
// real processes over the cpu backend's communicators (CpuCommDriver), bootstrapped through a real
// in-process store server: creation counts, legacy multi-device and its one warning, split (a
// non-member gets no group, a missing rank gives an error instead of a hang), abort of every
// communicator of a process together, async errors, and Shrink on cpu and nccl.
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/job/keys.h"
#include "runtime/store/server.h"
#include "testing/comm_launcher.h"

namespace ember::comm::testing {
namespace {

class Store {
 public:
  Store() {
    auto s = store::StoreServer::Start({.address = "127.0.0.1:0"});
    REQUIRE(s.ok());
    server_ = std::move(*s);
  }
  // Runs `n` ranks of the scenario under a fresh attempt prefix; all must exit 0.
  void Expect(const std::string& scenario, const std::string& backend, int n) {
    INFO(scenario << " / " << backend << " with " << n << " ranks");
    RunResult r = RunRanks(n, {"--scenario=" + scenario, "--backend=" + backend,
                               "--store=" + server_->address(),
                               "--store_prefix=" + job::keys::AttemptPrefix("policy", attempt_++)},
                           {}, 90, "device_policy_worker");
    REQUIRE(!r.timed_out);
    REQUIRE(AllExitZero(r));
  }

 private:
  std::unique_ptr<store::StoreServer> server_;
  int attempt_ = 0;
};

}  // namespace

TEST_CASE("creation: eager at group creation, lazy per peer pair on first use, legacy at first op") {
  Store s;
  for (const char* b : {"nccl", "nccl-lazy", "nccl-legacy"}) {
    s.Expect("creation", b, 2);
    s.Expect("creation", b, 3);
  }
}

TEST_CASE("nccl-legacy: several devices per process, one warning; nccl refuses several devices") {
  Store s;
  s.Expect("legacy", "nccl-legacy", 2);
}

TEST_CASE("split: members get a working group, a non-member none, a missing rank an error") {
  Store s;
  s.Expect("split", "nccl", 3);
  s.Expect("split", "nccl-lazy", 4);
}

TEST_CASE("a timed-out op aborts every communicator of the process together") {
  Store s;
  s.Expect("abort", "nccl-lazy", 2);
  s.Expect("abort", "nccl", 2);
}

TEST_CASE("an asynchronous communicator error aborts the group with its message") {
  Store s;
  s.Expect("async", "nccl", 2);
}

// The fake NCCL (CpuCommDriver, strict) fails a rank loudly on a misuse; these run the bugs it
// exposed (docs/comm.md lists bug, test, fix).
TEST_CASE("in progress: calls returning ncclInProgress are polled before the end event") {
  Store s;
  s.Expect("inprogress", "nccl", 2);
  s.Expect("inprogress", "nccl-lazy", 3);
}

TEST_CASE("legacy stream: device ops without a current stream are refused") {
  Store s;
  s.Expect("legacy_stream", "nccl", 2);
}

TEST_CASE("abort from another thread while the training thread is inside calls") {
  Store s;
  s.Expect("race", "nccl", 2);
}

TEST_CASE("shrink: the survivors of a dead rank all_reduce correctly (cpu and nccl policy)") {
  Store s;
  s.Expect("shrink", "cpu", 3);
  s.Expect("shrink", "cpu", 4);
  s.Expect("shrink", "nccl", 3);
}

}  // namespace ember::comm::testing
