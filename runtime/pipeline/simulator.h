// Executes a Schedule on an abstract machine and checks it.
//
// Every rank has a program counter and a clock. Compute actions take their cost (defaults: F=1,
// B=2, I=W=1; ReduceGrad and Optimizer are free); a Recv completes when its send (same source,
// destination and tag, in issue order) has been issued. Sends are either eager (unbounded
// buffering: issuing never blocks) or rendezvous (a send completes only together with its receive,
// like a blocking send without buffering, the conservative model). A schedule that runs under
// rendezvous runs under any buffering.
//
// Simulate fails with FailedPrecondition, naming the rank, the action index and the action, when
// the schedule is wrong: a deadlock (no rank can progress; every blocked rank and what it waits
// for is listed), a compute action whose input is neither computed locally nor received, a compute
// on the wrong rank, a (stage, micro-batch) forward or backward that runs twice or never, a send
// never received, a ReduceGrad before the stage's last backward, an Optimizer before them.
//
// Receive buffers: a RecvActivation's buffer is live from the receive until its Forward ends, a
// RecvGrad's until the Backward (or, split, the BackwardWeight, which reads the same gradient)
// ends. Counted in program order per rank, that gives the depth a just-in-time pool needs.
//
// Thread-safety: pure function.
#ifndef EMBER_RUNTIME_PIPELINE_SIMULATOR_H_
#define EMBER_RUNTIME_PIPELINE_SIMULATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/pipeline/schedule.h"

namespace ember::pipeline {

enum class SendMode { kEager, kRendezvous };

struct SimOptions {
  SendMode send_mode = SendMode::kEager;
  int64_t cost_forward = 1;
  int64_t cost_backward = 2;          // fused B
  int64_t cost_backward_input = 1;    // I
  int64_t cost_backward_weight = 1;   // W
};

struct ActionTiming {
  int64_t start = 0;  // when the rank began the action (a blocked Recv: when it started waiting)
  int64_t end = 0;    // when it completed
};

struct SimResult {
  int64_t makespan = 0;             // the latest end over all ranks
  double bubble_fraction = 0;       // 1 - sum(busy) / (ranks * makespan)
  std::vector<int64_t> busy;        // per rank: total compute cost
  std::vector<int> peak_recv_buffers;  // per rank: most receive buffers live at once
  std::vector<int> peak_send_buffers;  // per rank: most sent outputs not yet received at once
  std::vector<std::vector<ActionTiming>> timing;  // [rank][action index]
};

absl::StatusOr<SimResult> Simulate(const Schedule& s, const SimOptions& o = {});

}  // namespace ember::pipeline

#endif  // EMBER_RUNTIME_PIPELINE_SIMULATOR_H_
