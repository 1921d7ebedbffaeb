// Part of onesided_bench (not a library API): onesided put/get/notify against the comm layer's
// tagged send/recv (runtime/comm ProcessGroup, cpu backend) between the same two processes, over
// the same transport: TCP when UCX is forced to TCP (the group then has shared memory off), shared
// memory otherwise. Each sample moves the same bytes with the same round trips on both sides:
//   put: `iters` transfers of one size to the target + an 8-byte reply once the target has them
//        (ours: Puts, a Notify whose flush makes them visible, the target's Notify back; comm:
//        Sends, the target's Recvs complete, an 8-byte Send back);
//   get: an 8-byte request + `iters` transfers from the target (ours: Gets, which over TCP are a
//        request and a reply each, pipelined; comm: one 8-byte Send, the target's Sends);
//   latency: half the round trip of an 8-byte message answered by one (Notify/WaitNotification vs
//        Send/Recv).
// Thread-compatible: one thread per process drives it.
#ifndef EMBER_RUNTIME_ONESIDED_BENCH_VS_COMM_H_
#define EMBER_RUNTIME_ONESIDED_BENCH_VS_COMM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bench/report.h"
#include "runtime/comm/process_group.h"
#include "runtime/onesided/agent.h"

namespace ember::onesided::bench_comm {

struct Side {
  Agent* agent = nullptr;
  Connection* conn = nullptr;
  RemoteRegion remote;       // rank 0: the target's buffer
  Registration local;        // this process's buffer (at least the largest size)
  comm::ProcessGroup* pg = nullptr;  // 2 ranks: 0 measures, 1 is the target
};

// One-way latency: half of each round trip's time, over `iters` timed round trips.
struct Latency {
  double median_us = 0;  // the typical round trip (robust to a descheduled process)
  double mean_us = 0;    // total time / iters (counts every stall)
  double p99_us = 0;     // the 99th percentile round trip / 2
  double max_us = 0;     // the slowest round trip / 2
};
// Times `iters` calls of `round_trip` after iters/10+1 untimed ones.
absl::StatusOr<Latency> PingPong(const std::function<absl::Status()>& round_trip, int iters);
// One 8-byte Notify answered by the target's Notify (the target echoes notifications starting 'p').
absl::Status NotifyRoundTrip(Agent* agent, Connection* conn);

// Target side: handles a control notification starting with 'c' (sent by Measure); replies "k"
// once its receives are posted, then serves the comm-layer half of the sample.
absl::Status Serve(const Side& s, absl::string_view message);

struct Config {
  std::string tls_label;     // "tcp", "UCX default" ...
  std::string suffix;        // target-name suffix, e.g. "_tcp"
  std::vector<int64_t> sizes;
  int rounds = 1;
  int64_t bytes_per_sample = 16 << 20;
  int lat_iters = 200;
};

// Rank 0: interleaved rounds of ours and comm for every size; one table and targets
// (<op>_bw_<size><suffix>_vs_comm_send_recv from 1 MiB, notify_latency_8B<suffix>_vs_comm_send_recv).
absl::Status Measure(bench::Report& report, const Side& s, const Config& cfg);

}  // namespace ember::onesided::bench_comm

#endif  // EMBER_RUNTIME_ONESIDED_BENCH_VS_COMM_H_
