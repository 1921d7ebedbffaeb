#include "runtime/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status_macros.h"
#include "runtime/pipeline/simulator.h"

namespace ember::pipeline {
namespace {

Action Compute(ActionType t, int stage, int mb) {
  Action a{t};
  a.stage = stage;
  a.micro_batch = mb;
  return a;
}

// GPipe: all forwards, then all backwards (in micro-batch order, as PyTorch's ScheduleGPipe).
std::vector<Action> GPipeOrder(int r, int m) {
  std::vector<Action> out;
  for (int i = 0; i < m; ++i) out.push_back(Compute(ActionType::kForward, r, i));
  for (int i = 0; i < m; ++i) out.push_back(Compute(ActionType::kBackward, r, i));
  return out;
}

// 1F1B: p-1-r warm-up forwards, then alternate one forward and one backward, then drain.
std::vector<Action> OneFOneBOrder(int p, int r, int m) {
  std::vector<Action> out;
  int warmup = std::min(p - 1 - r, m);
  for (int i = 0; i < warmup; ++i) out.push_back(Compute(ActionType::kForward, r, i));
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back(Compute(ActionType::kForward, r, warmup + i));
    out.push_back(Compute(ActionType::kBackward, r, i));
  }
  for (int i = m - warmup; i < m; ++i) out.push_back(Compute(ActionType::kBackward, r, i));
  return out;
}

// Interleaved 1F1B (Megatron-LM): the k-th forward of rank r runs chunk (k mod p*v) / p on
// micro-batch (k / (p*v)) * p + k mod p, i.e. micro-batches go through the rank's chunks in rounds
// of p; backwards visit the chunks in reverse. Warm-up: 2(p-1-r) + (v-1)p forwards.
std::vector<Action> InterleavedOrder(int p, int v, int r, int m) {
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto chunk_of = [&](int k) { return (k % (p * v)) / p; };
  auto fwd = [&](int k) { return Compute(ActionType::kForward, chunk_of(k) * p + r, mb_of(k)); };
  auto bwd = [&](int k) {
    return Compute(ActionType::kBackward, (v - 1 - chunk_of(k)) * p + r, mb_of(k));
  };
  const int total = m * v;
  const int warmup = std::min(2 * (p - 1 - r) + (v - 1) * p, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(fwd(warmup + i));
    out.push_back(bwd(i));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(bwd(k));
  return out;
}

// ZB-H1 (Zero Bubble Pipeline Parallelism, Qi et al. 2023, "handcrafted schedule" H1): the 1F1B
// warm-up, then rounds of F, I and, once rank r has done more than r input-grads, W. Rank r thus
// defers r weight-grads, which fill the drain bubble; at most p micro-batches are between F and W
// on any rank (1F1B's peak activation memory). Under F=I=W=1 the step takes 3m + p - 1.
std::vector<Action> ZBH1Order(int p, int r, int m) {
  std::vector<Action> out;
  int f = 0, i = 0, w = 0;
  for (; f < p - 1 - r; ++f) out.push_back(Compute(ActionType::kForward, r, f));
  while (i < m) {
    if (f < m) out.push_back(Compute(ActionType::kForward, r, f++));
    out.push_back(Compute(ActionType::kBackwardInput, r, i++));
    if (i > r) out.push_back(Compute(ActionType::kBackwardWeight, r, w++));
  }
  for (; w < m; ++w) out.push_back(Compute(ActionType::kBackwardWeight, r, w));
  return out;
}

// Compute actions with sends right after their producer and receives right before their
// consumer. Correct data flow; the order between ranks is fixed afterwards (SortByGlobalTime).
std::vector<std::vector<Action>> WithMessages(const Schedule& s,
                                              const std::vector<std::vector<Action>>& compute) {
  const int S = s.options.stages, M = s.options.micro_batches;
  std::vector<std::vector<Action>> out(compute.size());
  for (size_t r = 0; r < compute.size(); ++r) {
    for (const Action& c : compute[r]) {
      const int st = c.stage, mb = c.micro_batch;
      auto message = [&](ActionType t, int peer_stage, int boundary, bool grad) {
        Action a = Compute(t, st, mb);
        a.peer = s.RankOfStage(peer_stage);
        a.tag = MessageTag(boundary, mb, M, grad);
        out[r].push_back(a);
      };
      const bool prev_remote = st > 0 && s.RankOfStage(st - 1) != static_cast<int>(r);
      const bool next_remote = st < S - 1 && s.RankOfStage(st + 1) != static_cast<int>(r);
      if (c.type == ActionType::kForward) {
        if (prev_remote) message(ActionType::kRecvActivation, st - 1, st - 1, false);
        out[r].push_back(c);
        if (next_remote) message(ActionType::kSendActivation, st + 1, st, false);
      } else if (c.type == ActionType::kBackward || c.type == ActionType::kBackwardInput) {
        if (next_remote) message(ActionType::kRecvGrad, st + 1, st, true);
        out[r].push_back(c);
        if (prev_remote) message(ActionType::kSendGrad, st - 1, st - 1, true);
      } else {
        out[r].push_back(c);
      }
    }
  }
  return out;
}

// Reorders every rank's list by one global key: a compute action by its simulated start time, a
// send and its receive both by the time the send is issued (ties: messages before compute, then by
// tag, unique per message). Each rank's compute order is unchanged, a send stays after its
// producer and a receive before its consumer. Because matching sends and receives hold the same
// position in one total order, the smallest unfinished key can always run: no deadlock even with
// rendezvous sends.
absl::Status SortByGlobalTime(Schedule* s) {
  ASSIGN_OR_RETURN(SimResult sim, Simulate(*s));
  std::map<int, int64_t> send_time;  // tag -> issue time (tags are unique within a step)
  for (size_t r = 0; r < s->ranks.size(); ++r)
    for (size_t i = 0; i < s->ranks[r].size(); ++i)
      if (s->ranks[r][i].is_send()) send_time[s->ranks[r][i].tag] = sim.timing[r][i].start;
  for (size_t r = 0; r < s->ranks.size(); ++r) {
    std::vector<std::tuple<int64_t, int, int, size_t>> keys;  // time, compute?, tag, index
    for (size_t i = 0; i < s->ranks[r].size(); ++i) {
      const Action& a = s->ranks[r][i];
      if (a.is_compute()) keys.emplace_back(sim.timing[r][i].start, 1, 0, i);
      else keys.emplace_back(send_time.at(a.tag), 0, a.tag, i);
    }
    std::sort(keys.begin(), keys.end());
    std::vector<Action> sorted;
    for (const auto& k : keys) sorted.push_back(s->ranks[r][std::get<3>(k)]);
    s->ranks[r] = std::move(sorted);
  }
  return absl::OkStatus();
}

// ReduceGrad(stage) right after the stage's last backward (and the sends that follow it), so the
// reduction overlaps the rank's remaining work; Optimizer at the end.
void AddReduceAndOptimizer(Schedule* s) {
  for (auto& list : s->ranks) {
    std::map<int, size_t> last_backward;  // stage -> index
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].type == ActionType::kBackward || list[i].type == ActionType::kBackwardWeight)
        last_backward[list[i].stage] = i;
    std::vector<Action> out;
    for (size_t i = 0; i < list.size(); ++i) {
      out.push_back(list[i]);
      for (const auto& [stage, idx] : last_backward) {
        size_t after = idx;
        while (after + 1 < list.size() && list[after + 1].is_send()) ++after;
        if (after == i) out.push_back(Compute(ActionType::kReduceGrad, stage, -1));
      }
    }
    out.push_back(Compute(ActionType::kOptimizer, -1, -1));
    list = std::move(out);
  }
}

}  // namespace

absl::string_view ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved-1f1b";
    case ScheduleKind::kZBH1: return "zbh1";
  }
  return "?";
}

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "gpipe") return ScheduleKind::kGPipe;
  if (n == "1f1b") return ScheduleKind::k1F1B;
  if (n == "interleaved-1f1b" || n == "interleaved") return ScheduleKind::kInterleaved1F1B;
  if (n == "zbh1" || n == "zb-h1") return ScheduleKind::kZBH1;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown pipeline schedule \"", name, "\"; use gpipe, 1f1b, interleaved-1f1b or zbh1"));
}

bool Action::is_compute() const {
  return type == ActionType::kForward || type == ActionType::kBackward ||
         type == ActionType::kBackwardInput || type == ActionType::kBackwardWeight;
}

bool ReceiveReleasedBy(const Action& compute, Action* recv) {
  switch (compute.type) {
    case ActionType::kForward: *recv = Compute(ActionType::kRecvActivation, compute.stage,
                                               compute.micro_batch); return true;
    case ActionType::kBackward:
    case ActionType::kBackwardWeight:
      *recv = Compute(ActionType::kRecvGrad, compute.stage, compute.micro_batch);
      return true;
    default: return false;
  }
}

std::string ActionToString(const Action& a) {
  const std::string sm = absl::StrCat(a.stage, ".", a.micro_batch);
  switch (a.type) {
    case ActionType::kForward: return "F" + sm;
    case ActionType::kBackward: return "B" + sm;
    case ActionType::kBackwardInput: return "I" + sm;
    case ActionType::kBackwardWeight: return "W" + sm;
    case ActionType::kSendActivation: return absl::StrCat("SA", sm, ">", a.peer);
    case ActionType::kRecvActivation: return absl::StrCat("RA", sm, "<", a.peer);
    case ActionType::kSendGrad: return absl::StrCat("SG", sm, ">", a.peer);
    case ActionType::kRecvGrad: return absl::StrCat("RG", sm, "<", a.peer);
    case ActionType::kReduceGrad: return absl::StrCat("RED", a.stage);
    case ActionType::kOptimizer: return "OPT";
  }
  return "?";
}

absl::Status ValidateLayout(const ScheduleOptions& o) {
  const std::string kind(ScheduleKindName(o.kind));
  if (o.stages < 1 || o.ranks < 1 || o.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, ": stages (", o.stages, "), ranks (", o.ranks, ") and micro-batches (",
        o.micro_batches, ") must all be at least 1"));
  }
  if (o.kind == ScheduleKind::kInterleaved1F1B) {
    if (o.stages % o.ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kind, ": ", o.stages, " stages do not divide evenly over ", o.ranks,
          " ranks; use a multiple of ", o.ranks, " stages (v stages per rank)"));
    }
    if (o.micro_batches % o.ranks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kind, ": ", o.micro_batches, " micro-batches is not a multiple of ", o.ranks,
          " ranks (micro-batches go through each rank's stages in rounds of ", o.ranks, ")"));
    }
    return absl::OkStatus();
  }
  if (o.stages != o.ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, " runs one stage per rank, but stages = ", o.stages, " and ranks = ", o.ranks,
        "; use interleaved-1f1b for several stages per rank"));
  }
  if ((o.kind == ScheduleKind::k1F1B || o.kind == ScheduleKind::kZBH1) &&
      o.micro_batches < o.stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, ": ", o.micro_batches, " micro-batches is fewer than the ", o.stages,
        " stages; use at least ", o.stages, " micro-batches (or gpipe)"));
  }
  return absl::OkStatus();
}

int MessageTag(int boundary, int mb, int micro_batches, bool grad) {
  return 2 * (boundary * micro_batches + mb) + (grad ? 1 : 0);
}

absl::StatusOr<Schedule> BuildSchedule(const ScheduleOptions& o) {
  RETURN_IF_ERROR(ValidateLayout(o));
  Schedule s;
  s.options = o;
  const int p = o.ranks, m = o.micro_batches;
  std::vector<std::vector<Action>> compute(p);
  for (int r = 0; r < p; ++r) {
    switch (o.kind) {
      case ScheduleKind::kGPipe: compute[r] = GPipeOrder(r, m); break;
      case ScheduleKind::k1F1B: compute[r] = OneFOneBOrder(p, r, m); break;
      case ScheduleKind::kInterleaved1F1B:
        compute[r] = InterleavedOrder(p, o.stages / p, r, m);
        break;
      case ScheduleKind::kZBH1: compute[r] = ZBH1Order(p, r, m); break;
    }
  }
  s.ranks = WithMessages(s, compute);
  absl::Status st = SortByGlobalTime(&s);
  if (!st.ok()) {
    return absl::InternalError(absl::StrCat("pipeline schedule ", ScheduleKindName(o.kind),
                                            " is inconsistent (a bug): ", st.message()));
  }
  AddReduceAndOptimizer(&s);
  return s;
}

std::string FormatSchedule(const Schedule& s) {
  const ScheduleOptions& o = s.options;
  std::string out = absl::StrFormat(
      "%s: %d stages on %d ranks (stage s runs on rank s %% %d), %d micro-batches\n",
      ScheduleKindName(o.kind), o.stages, o.ranks, o.ranks, o.micro_batches);
  out +=
      "F/B/I/W<stage>.<mb>: forward, backward, input-grad, weight-grad of a micro-batch\n"
      "SA/SG<stage>.<mb>>r: send activation/grad to rank r; RA/RG<stage>.<mb><r: receive from "
      "rank r\nRED<stage>: reduce the stage's grads; OPT: optimizer step\n";
  size_t rows = 0, width = 7;
  for (const auto& list : s.ranks) {
    rows = std::max(rows, list.size());
    for (const Action& a : list) width = std::max(width, ActionToString(a).size());
  }
  auto row = [&](std::string line, auto cell) {
    for (size_t r = 0; r < s.ranks.size(); ++r) line += absl::StrFormat(" | %-*s", width, cell(r));
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  row("step ", [](size_t r) { return absl::StrCat("rank ", r); });
  for (size_t i = 0; i < rows; ++i) {
    row(absl::StrFormat("%4d ", i), [&](size_t r) {
      return i < s.ranks[r].size() ? ActionToString(s.ranks[r][i]) : std::string();
    });
  }
  return out;
}

}  // namespace ember::pipeline
