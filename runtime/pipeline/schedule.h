// Pipeline schedules as data: an explicit, ordered action list per rank.
//
// A pipeline cuts the model into `stages` contiguous pieces; stage s runs on rank s % ranks. GPipe,
// 1F1B and ZB-H1 put one stage on each rank (stages == ranks); interleaved 1F1B puts
// v = stages / ranks stages on each rank (rank r holds r, r + ranks, ..., looping). A step pushes
// `micro_batches` micro-batches through the pipeline; each rank executes its list in order.
//
//   F  Forward(stage, mb)            B  Backward (fused: input grad + weight grad)
//   I  BackwardInput(stage, mb)      W  BackwardWeight(stage, mb)      (ZB-H1 splits B = I + W)
//   Send/Recv of an activation (stage s -> s+1) or a gradient (s+1 -> s) with a peer rank and a
//   tag unique within the step; ReduceGrad(stage) after the stage's last backward; Optimizer last.
//
// BuildSchedule is a pure function of its options. It orders the compute actions by the kind's
// rule, times them with the simulator (unit costs, F=1, B=2, I=W=1) and sorts every rank's list by
// one global key in which a send and its receive share a position. That makes every schedule
// deadlock-free even when each send blocks until its receive is posted (rendezvous), and hence
// under any amount of buffering; simulator_test checks it for stages 1-8, micro-batches 1-32.
//
//   ASSIGN_OR_RETURN(Schedule s, BuildSchedule({ScheduleKind::k1F1B, /*stages=*/4, /*ranks=*/4,
//                                               /*micro_batches=*/8}));
//   std::cout << FormatSchedule(s);
//
// Thread-safety: everything here is a pure function or an immutable value.
#ifndef EMBER_RUNTIME_PIPELINE_SCHEDULE_H_
#define EMBER_RUNTIME_PIPELINE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::pipeline {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZBH1 };

// "gpipe", "1f1b", "interleaved-1f1b", "zbh1".
absl::string_view ScheduleKindName(ScheduleKind kind);
// Accepts the names above (case-insensitive; "interleaved" and "zb-h1" too). InvalidArgument
// listing the accepted names otherwise.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);

enum class ActionType {
  kForward,
  kBackward,        // fused input + weight gradient
  kBackwardInput,   // gradient w.r.t. the stage's input (ZB-H1)
  kBackwardWeight,  // gradient w.r.t. the stage's weights (ZB-H1)
  kSendActivation,  // output of `stage` to the rank of stage + 1
  kRecvActivation,  // input of `stage` from the rank of stage - 1
  kSendGrad,        // gradient of `stage`'s input to the rank of stage - 1
  kRecvGrad,        // gradient of `stage`'s output from the rank of stage + 1
  kReduceGrad,      // the stage's gradients are final: reduce them (DP/FSDP), micro_batch = -1
  kOptimizer,       // one optimizer step over the rank's stages, stage = micro_batch = -1
};

struct Action {
  ActionType type;
  int stage = -1;        // the stage on this rank that computes, produces or consumes
  int micro_batch = -1;
  int peer = -1;         // Send/Recv: the other rank
  int tag = -1;          // Send/Recv: same on both sides, unique per message within a step

  bool is_compute() const;
  bool is_send() const { return type == ActionType::kSendActivation || type == ActionType::kSendGrad; }
  bool is_recv() const { return type == ActionType::kRecvActivation || type == ActionType::kRecvGrad; }
  bool operator==(const Action& o) const {
    return type == o.type && stage == o.stage && micro_batch == o.micro_batch && peer == o.peer &&
           tag == o.tag;
  }
};

// Short form used by FormatSchedule: F2.5 (forward, stage 2, micro-batch 5), B, I, W likewise;
// SA2.5>1 (send stage 2's activation for mb 5 to rank 1), RA3.5<2, SG2.5>1, RG2.5<3; RED2; OPT.
std::string ActionToString(const Action& a);

// The receive whose buffer `compute` is the last to read: F(s,mb) -> RecvActivation(s,mb) (the
// stage keeps its own copy of what backward needs), B(s,mb) and W(s,mb) -> RecvGrad(s,mb) (W
// reads the output gradient again), I(s,mb) -> none. Returns false for none; fills type, stage and
// micro_batch of *recv (not peer and tag). Whether such a receive exists depends on the layout.
bool ReceiveReleasedBy(const Action& compute, Action* recv);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;
  int ranks = 1;
  int micro_batches = 1;
};

// Rejects impossible layouts with InvalidArgument naming the numbers: non-positive counts; stages
// != ranks for GPipe, 1F1B and ZB-H1; stages not a multiple of ranks for interleaved 1F1B;
// micro-batches < stages for 1F1B and ZB-H1; micro-batches not a positive multiple of ranks for
// interleaved 1F1B (the Megatron ordering groups micro-batches in rounds of `ranks`).
absl::Status ValidateLayout(const ScheduleOptions& o);

// Tag of the activation (grad = false) or gradient crossing the boundary between stages
// `boundary` and `boundary + 1` for micro-batch `mb`.
int MessageTag(int boundary, int mb, int micro_batches, bool grad);

struct Schedule {
  ScheduleOptions options;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in execution order

  int RankOfStage(int stage) const { return stage % options.ranks; }
  int stages_per_rank() const { return options.stages / options.ranks; }
};

absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& o);

// The per-rank action table as text: a header line naming the layout, a legend, then one row per
// step ("step 07 | F1.3  | RG0.2<1 | ..."), one column per rank (a rank whose list is shorter
// leaves its cell empty).
std::string FormatSchedule(const Schedule& s);

}  // namespace ember::pipeline

#endif  // EMBER_RUNTIME_PIPELINE_SCHEDULE_H_
