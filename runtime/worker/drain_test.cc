// Checkpoint-and-stop with real ember-worker processes and an in-process store: the attempt's
// drain key (what emberd's Cancel with checkpoint writes) makes both ranks agree on one step, save
// its checkpoint and exit 76; the next attempt resumes at the following step, and the losses of
// the two attempts together equal an uninterrupted run's, step for step (none lost, none redone).
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/worker/worker_harness.h"

namespace ember::worker {
namespace {

constexpr int kSteps = 200;
// Periodic checkpoints far apart: the drained step is not one of them.
const char* const kCheckpoints = "checkpoint: {every_steps: 1000, keep_last: 3}\n";

// The step checkpoints/latest names ("step-N"), or -1.
int64_t LatestCheckpoint(const std::string& dir) {
  std::ifstream f(dir + "/checkpoints/latest");
  std::string name;
  f >> name;
  int64_t n = -1;
  if (name.rfind("step-", 0) == 0 && absl::SimpleAtoi(name.substr(5), &n)) return n;
  return -1;
}

// (attempt, step) of every metrics line of rank 0.
std::vector<std::pair<int, int64_t>> Lines(const std::string& dir) {
  std::vector<std::pair<int, int64_t>> out;
  std::ifstream f(dir + "/metrics/rank-0.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto num = [&](const std::string& k) -> int64_t {
      const size_t at = line.find("\"" + k + "\":");
      if (at == std::string::npos) return 0;
      size_t p = at + k.size() + 3;
      if (line[p] == '"') ++p;
      int64_t v = 0;
      (void)absl::SimpleAtoi(line.substr(p, line.find_first_of("\",}", p) - p), &v);
      return v;
    };
    out.push_back({static_cast<int>(num("attempt")), num("step")});
  }
  return out;
}

TEST_CASE("a drain request checkpoints the agreed step, exits 76, and the next attempt loses no step") {
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  const std::string addr = (*server)->address();
  const std::string base = NewJobDir("base");
  WriteSpec(base, kSteps, 2, "", kCheckpoints);
  REQUIRE(RunJob(addr, "base", base, 2, 0) == std::vector<int>{0, 0});
  const std::map<int64_t, double> want = Losses(base);
  REQUIRE(want.size() == kSteps);

  const std::string dir = NewJobDir("drain");
  WriteSpec(dir, kSteps, 2, "", kCheckpoints);
  auto client = store::Client::Connect({.address = addr});
  REQUIRE(client.ok());
  std::thread requester([&] {  // once rank 0 has logged step 30
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline && Lines(dir).size() < 30) absl::SleepFor(absl::Milliseconds(2));
    REQUIRE(client->Set(job::keys::Drain("drain", 0), "test: checkpoint and stop").ok());
  });
  const std::vector<int> codes = RunJob(addr, "drain", dir, 2, 0);
  requester.join();
  REQUIRE(codes == std::vector<int>{76, 76});
  const int64_t at = LatestCheckpoint(dir);
  INFO("drained at step " << at);
  REQUIRE(at >= 30);
  REQUIRE(at < kSteps);
  const auto first = Lines(dir);
  REQUIRE(!first.empty());
  CHECK(first.back().second == at);  // the last step trained is the one checkpointed

  // The next attempt (what the daemon or a requeued Slurm job starts) resumes at step at + 1.
  REQUIRE(RunJob(addr, "drain", dir, 2, 1) == std::vector<int>{0, 0});
  const auto lines = Lines(dir);
  std::map<int64_t, int> seen;
  for (const auto& [attempt, step] : lines) {
    ++seen[step];
    CHECK(attempt == (step <= at ? 0 : 1));
  }
  for (int64_t s = 1; s <= kSteps; ++s) {
    INFO("step " << s);
    CHECK(seen[s] == 1);  // trained once: none lost, none redone
  }
  CHECK(Losses(dir) == want);  // bitwise: deterministic training across the checkpoint
}

}  // namespace
}  // namespace ember::worker
