// Shared parts of the store benchmarks (store_bench, store_compat_bench).
//
// A benchmark binary re-executes itself (/proc/self/exe) for its client processes: main() calls
// RunChildRole() first, which runs the child role named by --role ("ops": one op in a loop for
// --seconds; "barrier": --conns connections pass Client::Barrier) and returns its exit status, or
// -1 when --role names none of these. The parent side forks N children, waits until every one is
// connected and ready, releases them at once and collects their figures.
//
// Thread-compatible: the parent functions run on the benchmark's main thread.
#ifndef EMBER_RUNTIME_STORE_STORE_BENCH_UTIL_H_
#define EMBER_RUNTIME_STORE_STORE_BENCH_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/base/json.h"

ABSL_DECLARE_FLAG(double, seconds);
ABSL_DECLARE_FLAG(int, rounds);
ABSL_DECLARE_FLAG(int, window);
ABSL_DECLARE_FLAG(int, add_window);
ABSL_DECLARE_FLAG(bool, no_peer);
ABSL_DECLARE_FLAG(std::string, role);

namespace ember::store::bench_util {

int64_t NowNs();  // CLOCK_MONOTONIC

// For a benchmark's own child roles. A child first connects, then calls TimedLoop, which says
// "ready", waits for the release, runs op(0), op(1), ... for --seconds and writes --out (ops, start,
// end, latencies); an op that fails ends the process with exit status 1. Returns 0.
int TimedLoop(const std::function<absl::Status(int64_t i)>& op);
void WriteOpsOutput(int64_t n, int64_t start, int64_t end, const std::vector<int64_t>& lats);
[[noreturn]] void Die(const absl::Status& s);  // prints s, _exit(1)

// The child role's exit status, or -1 when --role is not one of the shared roles.
int RunChildRole();

struct OpsResult {
  double ops_per_s = 0, p50_us = 0, p99_us = 0;
};
struct BarrierResult {
  double connect_s = 0, barrier_s = 0;
  double total() const { return connect_s + barrier_s; }
};

// Forks `n` children of this binary with `args` (plus --rank, --ready_fd, --go_fd, --out), waits
// until all are ready, releases them at once and waits for them. Returns the release time and the
// children's output files; any child failing fails the call.
absl::StatusOr<std::pair<int64_t, std::vector<std::string>>> SpawnAndRun(
    int n, const std::vector<std::string>& args, const std::string& tmpdir);
// Reads the children's "ops latencies..." files (deleting them): total ops/s over the span from
// the first start to the last end, and latency percentiles.
absl::StatusOr<OpsResult> CollectOps(const std::vector<std::string>& outs);

// `clients` Ember client processes running `op` (add, add_pipelined, get, set, set_pipelined)
// against the store at `addr` over `transport` (tcp | unix).
absl::StatusOr<OpsResult> RunEmberOps(const std::string& addr, const std::string& transport,
                                      const std::string& op, int clients,
                                      const std::string& tmpdir);
// `procs` processes x `conns` connections connect to `addr` and pass one Client::Barrier.
absl::StatusOr<BarrierResult> RunEmberBarrier(const std::string& addr, int procs, int conns,
                                              const std::string& tmpdir);

// The interpreter of the PyTorch peers: $EMBER_PEER_PYTHON, else the torch 2.15 venv of
// deploy/peers-venv.sh when it is complete, else Debian's /usr/bin/python3 (torch 1.13). The one
// place the benchmarks choose it (deploy::PeerPython; the shell side: deploy/peers-venv.sh --python).
std::string PeerPython();
// "torch 2.15.0 (/opt/ember-peers/torch-2.15/bin/python)": what a peer row names (asked of
// PeerPython() once per interpreter; "torch ?" when it has no torch). Thread-safe.
std::string PeerTorchLabel();

// Runs `PeerPython() <script name found in runfiles> <args>` (300 s limit); its stdout parsed
// as JSON, or why there is none (--no_peer: UNAVAILABLE).
absl::StatusOr<json::Value> RunPeer(const std::string& args, const std::string& tmpdir,
                                    const std::string& name = "tcpstore_peer.py");
double Num(const json::Value& v, const char* key);  // NaN when absent or not a number

}  // namespace ember::store::bench_util

#endif  // EMBER_RUNTIME_STORE_STORE_BENCH_UTIL_H_
