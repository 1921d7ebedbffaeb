#include "runtime/pipeline/simulator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ember::pipeline {
namespace {

// One message in flight (eager mode): when it was sent, what it carries, who sent it.
struct Message {
  int64_t time;
  Action send;
  int src;
  size_t send_interval;  // index into the sender's send-buffer intervals
};

class Machine {
 public:
  Machine(const Schedule& s, const SimOptions& o)
      : s_(s), o_(s.options), opt_(o), S_(o_.stages), M_(o_.micro_batches) {
    const int n = o_.ranks;
    pc_.assign(n, 0);
    clock_.assign(n, 0);
    have_.assign(n, std::vector<int64_t>(2 * S_ * M_, -1));
    live_recv_.assign(n, {});
    peak_recv_.assign(n, 0);
    send_intervals_.assign(n, {});
    forward_.assign(S_ * M_, 0);
    backward_.assign(S_ * M_, 0);
    weight_.assign(S_ * M_, 0);
    split_.assign(S_ * M_, false);
    result_.busy.assign(n, 0);
    result_.timing.resize(n);
    for (int r = 0; r < n; ++r) result_.timing[r].resize(s.ranks[r].size());
  }

  absl::StatusOr<SimResult> Run();

 private:
  enum class Step { kDone, kBlocked };
  int Y(int stage, int mb) const { return stage * M_ + mb; }            // stage's output
  int G(int stage, int mb) const { return S_ * M_ + stage * M_ + mb; }  // grad of stage's input
  absl::Status Error(int r, absl::string_view what) const {
    const Action& a = s_.ranks[r][pc_[r]];
    return absl::FailedPreconditionError(absl::StrCat(
        ScheduleKindName(o_.kind), " schedule: rank ", r, " action ", pc_[r], " (",
        ActionToString(a), "): ", what));
  }
  absl::StatusOr<Step> StepRank(int r);
  absl::Status RunCompute(int r, const Action& a);
  absl::Status CheckMessage(int r, const Action& a) const;
  // The item a send carries / a receive delivers.
  int SentItem(const Action& a) const {
    return a.type == ActionType::kSendActivation ? Y(a.stage, a.micro_batch)
                                                 : G(a.stage, a.micro_batch);
  }
  int RecvItem(const Action& a) const {
    return a.type == ActionType::kRecvActivation ? Y(a.stage - 1, a.micro_batch)
                                                 : G(a.stage + 1, a.micro_batch);
  }
  void Deliver(int r, const Action& recv, int64_t time);
  bool StageFinished(int stage) const {
    for (int mb = 0; mb < M_; ++mb) {
      int i = Y(stage, mb);
      if (backward_[i] == 0 || (split_[i] && weight_[i] == 0)) return false;
    }
    return true;
  }
  void Release(int r, int item) {
    auto it = std::find(live_recv_[r].begin(), live_recv_[r].end(), item);
    if (it != live_recv_[r].end()) live_recv_[r].erase(it);
  }
  void Finish(int r, int64_t start, int64_t end) {
    result_.timing[r][pc_[r]] = {start, end};
    clock_[r] = end;
    ++pc_[r];
  }

  const Schedule& s_;
  const ScheduleOptions o_;
  const SimOptions opt_;
  const int S_, M_;
  std::vector<size_t> pc_;
  std::vector<int64_t> clock_;
  std::vector<std::vector<int64_t>> have_;  // [rank][item]: when available, -1 = not here
  std::vector<std::vector<int>> live_recv_;  // [rank]: items held in receive buffers
  std::vector<int> peak_recv_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> send_intervals_;  // [rank]: issue, received
  std::vector<int> forward_, backward_, weight_;  // run counts per (stage, mb)
  std::vector<bool> split_;                       // backward ran as I (+ W)
  std::map<std::tuple<int, int, int>, std::deque<Message>> channels_;  // (src, dst, tag)
  SimResult result_;
};

absl::Status Machine::RunCompute(int r, const Action& a) {
  const int st = a.stage, mb = a.micro_batch;
  if (st < 0 || st >= S_ || mb < 0 || mb >= M_) return Error(r, "stage or micro-batch out of range");
  const int i = Y(st, mb);
  if (s_.RankOfStage(st) != r) {
    return Error(r, absl::StrCat("stage ", st, " belongs to rank ", s_.RankOfStage(st)));
  }
  int64_t ready = clock_[r], cost = 0;
  auto need = [&](int item, absl::string_view what) -> absl::Status {
    if (have_[r][item] < 0) {
      return Error(r, absl::StrCat("needs ", what, ", which this rank has neither computed nor "
                                   "received by now"));
    }
    ready = std::max(ready, have_[r][item]);
    return absl::OkStatus();
  };
  switch (a.type) {
    case ActionType::kForward:
      if (forward_[i]++ > 0) return Error(r, "forward runs twice");
      if (st > 0) {
        absl::Status s = need(Y(st - 1, mb), absl::StrCat("stage ", st - 1, "'s activation"));
        if (!s.ok()) return s;
      }
      cost = opt_.cost_forward;
      break;
    case ActionType::kBackward:
    case ActionType::kBackwardInput:
      if (backward_[i]++ > 0) return Error(r, "backward runs twice");
      if (forward_[i] == 0) return Error(r, "backward before its forward");
      if (st < S_ - 1) {
        absl::Status s = need(G(st + 1, mb), absl::StrCat("stage ", st + 1, "'s input gradient"));
        if (!s.ok()) return s;
      }
      split_[i] = a.type == ActionType::kBackwardInput;
      cost = split_[i] ? opt_.cost_backward_input : opt_.cost_backward;
      break;
    case ActionType::kBackwardWeight:
      if (weight_[i]++ > 0) return Error(r, "weight gradient runs twice");
      if (backward_[i] == 0 || !split_[i]) return Error(r, "weight gradient before its input grad");
      cost = opt_.cost_backward_weight;
      break;
    default:
      break;
  }
  const int64_t start = ready, end = start + cost;
  if (a.type == ActionType::kForward) have_[r][i] = end;
  if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput)
    have_[r][G(st, mb)] = end;
  Action recv{ActionType::kRecvActivation};
  if (ReceiveReleasedBy(a, &recv)) Release(r, RecvItem(recv));  // no-op when produced locally
  result_.busy[r] += cost;
  Finish(r, start, end);
  return absl::OkStatus();
}

absl::Status Machine::CheckMessage(int r, const Action& a) const {
  const bool act = a.type == ActionType::kSendActivation || a.type == ActionType::kRecvActivation;
  const int other = a.is_send() ? (act ? a.stage + 1 : a.stage - 1)
                                : (act ? a.stage - 1 : a.stage + 1);
  if (a.stage < 0 || a.stage >= S_ || other < 0 || other >= S_ || a.micro_batch < 0 ||
      a.micro_batch >= M_) {
    return Error(r, "stage or micro-batch out of range");
  }
  if (s_.RankOfStage(a.stage) != r) return Error(r, "stage belongs to another rank");
  if (a.peer != s_.RankOfStage(other)) {
    return Error(r, absl::StrCat("peer should be rank ", s_.RankOfStage(other), " (stage ", other,
                                 ")"));
  }
  return absl::OkStatus();
}

void Machine::Deliver(int r, const Action& recv, int64_t time) {
  const int item = RecvItem(recv);
  have_[r][item] = time;
  live_recv_[r].push_back(item);
  peak_recv_[r] = std::max(peak_recv_[r], static_cast<int>(live_recv_[r].size()));
}

absl::StatusOr<Machine::Step> Machine::StepRank(int r) {
  const Action& a = s_.ranks[r][pc_[r]];
  if (a.is_compute()) {
    absl::Status st = RunCompute(r, a);
    if (!st.ok()) return st;
    return Step::kDone;
  }
  if (a.type == ActionType::kReduceGrad) {
    if (a.stage < 0 || a.stage >= S_ || s_.RankOfStage(a.stage) != r || !StageFinished(a.stage))
      return Error(r, "reduce-grad of a stage whose backwards are not all done on this rank");
    Finish(r, clock_[r], clock_[r]);
    return Step::kDone;
  }
  if (a.type == ActionType::kOptimizer) {
    for (int st = r; st < S_; st += o_.ranks)
      if (!StageFinished(st)) return Error(r, absl::StrCat("stage ", st, " is not finished"));
    Finish(r, clock_[r], clock_[r]);
    return Step::kDone;
  }
  absl::Status st = CheckMessage(r, a);
  if (!st.ok()) return st;
  if (a.is_send() && have_[r][SentItem(a)] < 0) return Error(r, "sends data it does not have");
  auto matches = [&](const Action& send, const Action& recv) {
    return recv.type == (send.type == ActionType::kSendActivation ? ActionType::kRecvActivation
                                                                  : ActionType::kRecvGrad) &&
           recv.micro_batch == send.micro_batch &&
           recv.stage == send.stage + (send.type == ActionType::kSendActivation ? 1 : -1);
  };
  if (opt_.send_mode == SendMode::kEager) {
    if (a.is_send()) {
      send_intervals_[r].push_back({clock_[r], -1});
      channels_[{r, a.peer, a.tag}].push_back(
          {clock_[r], a, r, send_intervals_[r].size() - 1});
      Finish(r, clock_[r], clock_[r]);
      return Step::kDone;
    }
    auto it = channels_.find({a.peer, r, a.tag});
    if (it == channels_.end() || it->second.empty()) return Step::kBlocked;
    Message m = it->second.front();
    it->second.pop_front();
    if (!matches(m.send, a)) {
      return Error(r, absl::StrCat("matched with ", ActionToString(m.send), " from rank ", m.src,
                                   " (same tag, different data)"));
    }
    const int64_t end = std::max(clock_[r], m.time);
    send_intervals_[m.src][m.send_interval].second = end;
    Deliver(r, a, end);
    Finish(r, clock_[r], end);
    return Step::kDone;
  }
  // Rendezvous: both sides must stand at the matching pair.
  const int peer = a.peer;
  if (pc_[peer] >= s_.ranks[peer].size()) return Step::kBlocked;
  const Action& b = s_.ranks[peer][pc_[peer]];
  if (b.peer != r || b.tag != a.tag || b.is_send() == a.is_send() || !(b.is_send() || b.is_recv()))
    return Step::kBlocked;
  const Action& send = a.is_send() ? a : b;
  const Action& recv = a.is_send() ? b : a;
  const int sr = a.is_send() ? r : peer, rr = a.is_send() ? peer : r;
  if (!matches(send, recv)) {
    return Error(r, absl::StrCat("matched with ", ActionToString(b), " on rank ", peer,
                                 " (same tag, different data)"));
  }
  if (have_[sr][SentItem(send)] < 0) return Step::kBlocked;  // reported when the sender steps
  const int64_t t = std::max(clock_[r], clock_[peer]);
  send_intervals_[sr].push_back({clock_[sr], t});
  Deliver(rr, recv, t);
  Finish(sr, clock_[sr], t);
  Finish(rr, clock_[rr], t);
  return Step::kDone;
}

absl::StatusOr<SimResult> Machine::Run() {
  const int n = o_.ranks;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < n; ++r) {
      while (pc_[r] < s_.ranks[r].size()) {
        absl::StatusOr<Step> st = StepRank(r);
        if (!st.ok()) return st.status();
        if (*st == Step::kBlocked) break;
        progress = true;
      }
    }
  }
  std::vector<std::string> blocked;
  for (int r = 0; r < n; ++r) {
    if (pc_[r] < s_.ranks[r].size()) {
      blocked.push_back(absl::StrCat("rank ", r, " at action ", pc_[r], " (",
                                     ActionToString(s_.ranks[r][pc_[r]]), ")"));
    }
  }
  if (!blocked.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(ScheduleKindName(o_.kind), " schedule deadlocks (",
                     opt_.send_mode == SendMode::kEager ? "eager" : "rendezvous",
                     " sends): ", absl::StrJoin(blocked, "; ")));
  }
  for (int st = 0; st < S_; ++st) {
    for (int mb = 0; mb < M_; ++mb) {
      const int i = Y(st, mb);
      if (forward_[i] != 1 || backward_[i] != 1 || (split_[i] && weight_[i] != 1)) {
        return absl::FailedPreconditionError(absl::StrCat(
            ScheduleKindName(o_.kind), " schedule: stage ", st, " micro-batch ", mb,
            " ran forward ", forward_[i], " times and backward ", backward_[i],
            " times (want exactly once each)"));
      }
    }
  }
  for (const auto& [key, q] : channels_) {
    if (!q.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          ScheduleKindName(o_.kind), " schedule: rank ", std::get<0>(key), " sends ",
          ActionToString(q.front().send), " to rank ", std::get<1>(key),
          ", which never receives it"));
    }
  }
  result_.peak_recv_buffers = peak_recv_;
  result_.peak_send_buffers.assign(n, 0);
  int64_t total_busy = 0;
  for (int r = 0; r < n; ++r) {
    result_.makespan = std::max(result_.makespan, clock_[r]);
    total_busy += result_.busy[r];
    // Sweep issue (+1) and receive (-1) events; at equal times issues count first.
    std::vector<std::pair<int64_t, int>> ev;
    for (const auto& [from, to] : send_intervals_[r]) {
      ev.push_back({from, 0});
      ev.push_back({to, 1});
    }
    std::sort(ev.begin(), ev.end());
    int live = 0;
    for (const auto& e : ev) {
      live += e.second == 0 ? 1 : -1;
      result_.peak_send_buffers[r] = std::max(result_.peak_send_buffers[r], live);
    }
  }
  result_.bubble_fraction =
      result_.makespan == 0 ? 0 : 1.0 - static_cast<double>(total_busy) / (n * result_.makespan);
  return result_;
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const Schedule& s, const SimOptions& o) {
  const ScheduleOptions& so = s.options;
  if (so.stages < 1 || so.ranks < 1 || so.micro_batches < 1 ||
      static_cast<int>(s.ranks.size()) != so.ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule has ", s.ranks.size(), " rank lists for ", so.ranks, " ranks, ", so.stages,
        " stages, ", so.micro_batches, " micro-batches"));
  }
  Machine m(s, o);
  return m.Run();
}

}  // namespace ember::pipeline
