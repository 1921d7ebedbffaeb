// One rank of a checkpoint save, as its own process (for the kill -9 tests): saves
// testing::MakeModel(step) sharded at --world through the real store. Exit 0 = committed.
#include <cstdio>

#include "absl/flags/flag.h"
#include "checkpoint/test_util.h"
#include "runtime/base/flags.h"
#include "runtime/store/client.h"

ABSL_FLAG(std::string, store, "", "store address");
ABSL_FLAG(std::string, prefix, "", "store key prefix (job/attempt scope)");
ABSL_FLAG(std::string, root, "", "checkpoint root");
ABSL_FLAG(int, rank, 0, "rank");
ABSL_FLAG(int, world, 1, "world size");
ABSL_FLAG(int64_t, step, 1, "step");
ABSL_FLAG(int, delay_ms, 0, "sleep before writing each tensor");
ABSL_FLAG(int, timeout_s, 30, "commit timeout");

int main(int argc, char** argv) {
  using namespace ember;
  base::ParseFlagsAndInitLogging(argc, argv, "ckpt_rank");
  auto client = store::Client::Connect({.address = absl::GetFlag(FLAGS_store),
                                        .default_timeout = absl::Seconds(60),
                                        .connect_timeout = absl::Seconds(10)});
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 3;
  }
  ckpt::StoreCommitProtocol protocol(client->WithPrefix(absl::GetFlag(FLAGS_prefix)));
  int64_t step = absl::GetFlag(FLAGS_step);
  auto model = ckpt::testing::MakeModel(step);
  ckpt::SaveOptions opts{.root = absl::GetFlag(FLAGS_root),
                         .rank = absl::GetFlag(FLAGS_rank),
                         .world_size = absl::GetFlag(FLAGS_world),
                         .keep_last = 3,
                         .commit_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s)),
                         .TEST_delay_per_tensor = absl::Milliseconds(absl::GetFlag(FLAGS_delay_ms))};
  absl::Status s = ckpt::SaveCheckpoint(
      opts, ckpt::testing::ShardState(model, step, opts.rank, opts.world_size), &protocol);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", opts.rank, s.ToString().c_str());
    return 1;
  }
  return 0;
}
