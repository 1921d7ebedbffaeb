// Scheduling end to end (daemons of 2 CPU slots, the stand-in worker): what can never be placed is
// refused at submit naming the largest gang; a waiting job says why; a small job behind a blocked
// head runs when it cannot delay the head (conservative backfill, placement.h); finished jobs are
// forgotten by the retention policy, uploads included.
#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "runtime/daemon/process.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "testing/cluster.h"
#include "testing/harness.h"

namespace ember::e2e {
namespace {

namespace v1 = jobs::v1;

using recovery::WaitFor;

TEST_CASE("what no node set could ever hold is refused at submit, naming the largest") {
  auto cluster = TestCluster::Start();
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(1);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  auto huge = c->Submit(Spec("place-huge", 65536, 5));
  INFO(huge.status());
  REQUIRE(absl::IsFailedPrecondition(huge.status()));
  REQUIRE(absl::StrContains(huge.status().message(), "65536 cpu devices can never be placed"));
  REQUIRE(absl::StrContains(huge.status().message(), "4 cpu devices in all"));
  REQUIRE(absl::StrContains(huge.status().message(), "at most 4 ranks"));
  // (head size 32: a spec the GPU step supports, so placement is what refuses it)
  auto cuda = c->Submit("name: place-cuda\nmodel: {n_layers: 1, d_model: 64, n_heads: 2, context_length: 16}\n"
                        "parallelism: {strategy: fsdp, world_size: 1}\nsteps: 5\nresources: {device_type: cuda}\n");
  INFO(cuda.status());
  REQUIRE(absl::IsFailedPrecondition(cuda.status()));
  REQUIRE(absl::StrContains(cuda.status().message(), "no registered node has cuda devices"));
  // A model whose parameters, optimizer state and activations cannot fit any node's memory.
  auto mem = c->Submit("name: place-mem\nmodel: {n_layers: 256, d_model: 16384, n_heads: 64}\n"
                       "parallelism: {strategy: fsdp, world_size: 2}\nsteps: 5\n");
  INFO(mem.status());
  REQUIRE(absl::IsFailedPrecondition(mem.status()));
  REQUIRE(absl::StrContains(mem.status().message(), "GiB per rank"));
  REQUIRE(absl::StrContains(mem.status().message(), "the largest node has"));
  auto list = c->List();
  REQUIRE(list.ok());
  REQUIRE(list->empty());  // nothing was queued
}

TEST_CASE("a waiting job says why; a small job behind a blocked head backfills") {
  auto cluster = TestCluster::Start();
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 2; }, absl::Seconds(5)));
  // A holds one node (2 ranks, until cancelled).
  auto a = c->Submit(Spec("place-a-hang", 2, 10));
  REQUIRE(a.ok());
  REQUIRE(WaitFor([&] { auto j = c->Get(a->job().id()); return j.ok() && j->state() == v1::RUNNING; },
                  absl::Seconds(10)));
  // B (3 ranks) cannot start while A runs: it waits, saying why, and reserves A's two devices
  // and one of the two free ones.
  auto b = c->Submit(Spec("place-b", 3, 5));
  REQUIRE(b.ok());
  const std::string bid = b->job().id();
  std::string reason;
  REQUIRE(WaitFor([&] {
    auto j = c->Get(bid);
    reason = j.ok() ? j->reason() : "";
    return !reason.empty();
  }, absl::Seconds(5)));
  REQUIRE(reason == "waiting: needs 3 cpu devices, 2 free");
  // C (1 rank) fits the free device B does not need: it runs to the end while B waits.
  auto cj = c->Submit(Spec("place-c", 1, 5));
  REQUIRE(cj.ok());
  auto cdone = c->Wait(cj->job().id(), absl::Seconds(20));
  REQUIRE(cdone.ok());
  INFO(cdone->reason());
  REQUIRE(cdone->state() == v1::SUCCEEDED);
  auto bnow = c->Get(bid);
  REQUIRE(bnow.ok());
  REQUIRE(bnow->state() == v1::PENDING);
  // D (2 ranks) would need the device reserved for B: it waits behind B.
  auto d = c->Submit(Spec("place-d", 2, 5));
  REQUIRE(d.ok());
  REQUIRE(WaitFor([&] {
    auto j = c->Get(d->job().id());
    reason = j.ok() ? j->reason() : "";
    return !reason.empty();
  }, absl::Seconds(5)));
  REQUIRE(reason == absl::StrCat("waiting: needs 2 cpu devices, 2 free but 1 of them reserved for "
                                 "earlier job ", bid));
  // A ends: B starts first, then D.
  REQUIRE(c->Cancel(a->job().id()).ok());
  auto bdone = c->Wait(bid, absl::Seconds(30));
  auto ddone = c->Wait(d->job().id(), absl::Seconds(30));
  REQUIRE(bdone.ok());
  REQUIRE(ddone.ok());
  REQUIRE(bdone->state() == v1::SUCCEEDED);
  REQUIRE(ddone->state() == v1::SUCCEEDED);
  REQUIRE(bdone->reason().empty());
  REQUIRE(bdone->attempts(0).start_unix_ms() <= ddone->attempts(0).start_unix_ms());
  REQUIRE(cdone->attempts(0).end_unix_ms() < bdone->attempts(0).start_unix_ms());
}

TEST_CASE("retention forgets all but the newest finished jobs, their uploads included") {
  ClusterOptions o;
  o.nodes = 1;
  o.keep_finished_jobs = 2;
  auto cluster = TestCluster::Start(o);
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  const std::string blob(1 << 20, 'x');  // 1 MiB uploaded with each job
  std::vector<v1::Job> done;
  for (int i = 0; i < 4; ++i) {
    auto r = c->Submit(Spec(absl::StrCat("keep-", i), 1, 2), "", {{"data/blob.bin", blob}});
    REQUIRE(r.ok());
    auto d = c->Wait(r->job().id(), absl::Seconds(20));
    REQUIRE(d.ok());
    REQUIRE(d->state() == v1::SUCCEEDED);
    done.push_back(*d);
  }
  REQUIRE(WaitFor([&] { auto l = c->List(); return l.ok() && l->size() == 2; }, absl::Seconds(10)));
  auto list = c->List();
  REQUIRE(list.ok());
  REQUIRE((*list)[0].id() == done[3].id());  // newest first
  REQUIRE((*list)[1].id() == done[2].id());
  store::ClientOptions so;
  so.address = (*cluster)->node(0)->store_address();
  so.auth_token = (*cluster)->token();
  auto store = store::Client::Connect(so);
  REQUIRE(store.ok());
  for (int i = 0; i < 4; ++i) {
    const std::string& id = done[i].id();
    auto keys = store->ListKeys(absl::StrCat("jobs/", id, "/"));
    REQUIRE(keys.ok());
    INFO(id);
    if (i < 2) {
      REQUIRE(keys->empty());  // record, spec, upload, attempt keys: all gone
      REQUIRE(absl::IsNotFound(c->Get(id).status()));
      REQUIRE(std::filesystem::exists(done[i].job_dir() + "/logs"));  // the disk is not touched
    } else {
      REQUIRE(store->Get(job::keys::File(id, "data/blob.bin")).ok());
    }
  }
}

TEST_CASE("the backend follows the devices: empty picks nccl on cuda, a mismatch is refused") {
  ClusterOptions o;
  o.nodes = 1;
  o.cuda = 2;  // counted devices; test_worker never touches them
  auto cluster = TestCluster::Start(o);
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  REQUIRE(WaitFor([&] { auto n = c->Nodes(); return n.ok() && n->size() == 1; }, absl::Seconds(5)));
  // What the GPU step cannot train (the support matrix, runtime/jobspec/resolve.cc), here gradient
  // accumulation on 2 cuda ranks, is refused at Submit, naming the field, instead of by both ranks
  // at start.
  const std::string gpu_model = "model: {n_layers: 1, d_model: 64, n_heads: 2, context_length: 16}\nsteps: 3\n"
                                "resources: {device_type: cuda}\n";
  auto two = c->Submit("name: backend-gpu2\n" + gpu_model + "parallelism: {strategy: fsdp, world_size: 2, micro_batches: 2}\n");
  CHECK(absl::IsInvalidArgument(two.status()));
  CHECK(absl::StartsWith(two.status().message(), "parallelism.micro_batches: 2 on cuda"));
  auto gpu = c->Submit("name: backend-gpu\n" + gpu_model + "parallelism: {strategy: fsdp, world_size: 1}\n");
  INFO(gpu.status());
  REQUIRE(gpu.ok());
  REQUIRE(gpu->job().spec().parallelism().backend() == "nccl");
  REQUIRE(gpu->job().device_type() == "cuda");
  auto cpu = c->Submit(Spec("backend-cpu", 1, 3));
  REQUIRE(cpu.ok());
  REQUIRE(cpu->job().spec().parallelism().backend() == "cpu");
  // One rank per GPU: the cuda job's rank holds one of the node's two cuda devices.
  REQUIRE(WaitFor([&] { auto j = c->Get(gpu->job().id()); return j.ok() && j->state() == v1::SUCCEEDED; },
                  absl::Seconds(20)));
  auto done = c->Get(gpu->job().id());
  REQUIRE(done.ok());
  std::vector<std::string> devs;
  for (const auto& n : done->attempts(0).assignment().nodes())
    for (const auto& d : n.devices()) devs.push_back(d);
  std::sort(devs.begin(), devs.end());
  REQUIRE(devs.size() == 1);
  REQUIRE((devs[0] == "cuda:0" || devs[0] == "cuda:1"));
  for (const char* bad : {"parallelism: {strategy: fsdp, world_size: 1, backend: cpu}\n"
                          "resources: {device_type: cuda}\n",
                          "parallelism: {strategy: fsdp, world_size: 1, backend: nccl-lazy}\n"
                          "resources: {device_type: cpu}\n"}) {
    auto r = c->Submit(absl::StrCat("name: backend-bad\nmodel: {n_layers: 1, d_model: 32, n_heads: 2, "
                                    "context_length: 16}\nsteps: 3\n", bad));
    INFO(r.status());
    REQUIRE(absl::IsInvalidArgument(r.status()));
    REQUIRE(absl::StrContains(r.status().message(), "parallelism.backend"));
    REQUIRE(absl::StrContains(r.status().message(), "resources.device_type"));
  }
}

}  // namespace
}  // namespace ember::e2e
