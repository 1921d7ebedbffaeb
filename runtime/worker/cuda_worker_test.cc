// The real ember-worker with EMBER_DEVICE cuda:0 on a machine without a usable GPU (this test's
// machines): it must exit cleanly, not crash. A CUDA build gets through Prepare and fails in Train
// (exit 1) with the "cannot use the GPU" error in its exit record; a build without CUDA exits 2 at
// Prepare. On a machine with a GPU the job trains instead (tests/gpu; this test then checks that).
#include <catch2/catch.hpp>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/jobs.pb.h"
#include "runtime/job/env.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/base/devices.h"
#include "runtime/worker/worker_harness.h"

namespace ember::worker {
namespace {

TEST_CASE("ember-worker on cuda:0 without a usable GPU exits with a message saying so", "[worker][cuda]") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string dir = NewJobDir("cuda0");
  std::ofstream(dir + "/job.yaml") << "name: t\n"
                                      "model: {vocab_size: 256, context_length: 32, n_layers: 1, n_heads: 1, d_model: 32}\n"
                                      "data: {text_path: corpus.txt}\n"
                                      "steps: 3\nbatch_size: 2\nseed: 7\n";
  job::WorkerEnv e;
  e.store_addr = (*server)->address();
  e.job_id = "cuda0";
  e.job_dir = dir;
  e.device = "cuda:0";
  const auto vars = e.ToEnv();
  const std::vector<int> codes = WaitAll({Spawn({vars.begin(), vars.end()})}, absl::Seconds(60));
  if (!base::BuiltWithCuda()) {
    CHECK(codes == std::vector<int>{2});  // Prepare: "built without CUDA"
    return;
  }
  auto client = store::Client::Connect({.address = (*server)->address()});
  REQUIRE(client.ok());
  auto rec = client->Get(job::keys::WorkerExit("cuda0", 0, 0));
  REQUIRE(rec.ok());
  jobs::v1::WorkerExit exit;
  REQUIRE(exit.ParseFromString(*rec));
  if (codes == std::vector<int>{0}) {
    WARN("a usable GPU is present: ember-worker trained on cuda:0");
    return;
  }
  CHECK(codes == std::vector<int>{1});
  CHECK(exit.exit_code() == 1);
  INFO(exit.error());
  CHECK(absl::StrContains(exit.error(), absl::StrCat(job::kEnvDevice, "=cuda:0: cannot use the GPU (")));
  CHECK(absl::StrContains(exit.error(), "run the job with device cpu"));
}

}  // namespace
}  // namespace ember::worker
