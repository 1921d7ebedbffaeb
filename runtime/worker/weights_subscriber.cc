// Test binary: SubscribeWeights in its own process (publish_test kills it). Usage:
//   weights_subscriber STORE_ADDR JOB OUT_DIR [STEPS]
// Prints "step N PATH" per snapshot; exit 0 when done, 1 with the error on stderr.
#include <cstdio>

#include "absl/strings/numbers.h"
#include "runtime/worker/subscriber.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: weights_subscriber STORE_ADDR JOB OUT_DIR [STEPS]\n");
    return 2;
  }
  ember::worker::SubscribeOptions o;
  o.store_address = argv[1];
  o.job = argv[2];
  o.out_dir = argv[3];
  if (argc > 4 && !absl::SimpleAtoi(argv[4], &o.steps)) return 2;
  o.on_snapshot = [](int64_t step, const std::string& path) {
    std::printf("step %lld %s\n", static_cast<long long>(step), path.c_str());
    std::fflush(stdout);
  };
  absl::StatusOr<int64_t> n = ember::worker::SubscribeWeights(o);
  if (!n.ok()) {
    std::fprintf(stderr, "weights_subscriber: %s\n", n.status().ToString().c_str());
    return 1;
  }
  return 0;
}
