// Measures the flight recorder's hot path: Record + Start + Complete per op (one thread, and two
// threads sharing one recorder). Prints ns/op; the budget is 200 ns/op.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "runtime/flight/recorder.h"

using ember::flight::FlightRecorder;

static double RunOps(FlightRecorder* fr, int g, int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= n; ++i) {
    uint64_t id = fr->Record({.group_id = g, .collective_seq = i, .op = "all_reduce",
                              .in_numel = 1024, .out_numel = 1024, .in_dtype = "f32",
                              .out_dtype = "f32", .timeout_ms = 600000, .tag = "bench"});
    fr->Start(id);
    fr->Complete(id);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}

int main() {
  FlightRecorder fr({.capacity = 2000});
  int g = fr.RegisterGroup({.name = "world"});
  RunOps(&fr, g, 100000);  // warm up
  std::vector<double> v;
  for (int rep = 0; rep < 7; ++rep) v.push_back(RunOps(&fr, g, 1000000));
  std::sort(v.begin(), v.end());
  std::printf("flight recorder: %.1f ns/op (median of 7 x 1e6 ops, record+start+complete)\n", v[3]);
  double two[2];
  std::thread a([&] { two[0] = RunOps(&fr, g, 1000000); });
  std::thread b([&] { two[1] = RunOps(&fr, g, 1000000); });
  a.join();
  b.join();
  std::printf("flight recorder, 2 threads contending: %.1f / %.1f ns/op\n", two[0], two[1]);
  return v[3] < 200 ? 0 : 1;
}
