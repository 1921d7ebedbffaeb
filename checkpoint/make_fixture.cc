// Writes the v1 fixture (MakeModel(42) saved at world size 2) into argv[1]. Run once; the result is
// committed under checkpoint/testdata/v1 and must never be regenerated (it pins format 1.0).
#include <cstdio>
#include <thread>

#include "checkpoint/test_util.h"

int main(int argc, char** argv) {
  using namespace ember::ckpt;
  if (argc != 2) return 2;
  auto model = testing::MakeModel(42);
  LocalCommitProtocol protocol;
  absl::Status st[2];
  std::thread ts[2];
  for (int r = 0; r < 2; ++r) {
    ts[r] = std::thread([&, r] {
      st[r] = SaveCheckpoint({.root = argv[1], .rank = r, .world_size = 2, .keep_last = 1},
                             testing::ShardState(model, 42, r, 2), &protocol);
    });
  }
  for (auto& t : ts) t.join();
  for (auto& s : st) {
    if (!s.ok()) { std::fprintf(stderr, "%s\n", s.ToString().c_str()); return 1; }
  }
  return 0;
}
