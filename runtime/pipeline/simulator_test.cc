// The simulator sweep: every schedule kind is deadlock-free (eager and rendezvous sends) for
// stages 1-8 and micro-batches 1-32 (every valid layout), runs each forward and backward exactly
// once in dependency order (checked here from the trace, independently of the simulator's own
// checks), and matches the closed-form bubble under unit costs. Then hand-made broken schedules.
#include "runtime/pipeline/simulator.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ember::pipeline {
namespace {

struct Layout {
  ScheduleKind kind;
  int stages, ranks, m;
};

// Every valid layout of the sweep.
std::vector<Layout> AllLayouts() {
  std::vector<Layout> out;
  for (int s = 1; s <= 8; ++s) {
    for (int m = 1; m <= 32; ++m) {
      for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1}) {
        if (ValidateLayout({k, s, s, m}).ok()) out.push_back({k, s, s, m});
      }
      for (int r = 1; r < s; ++r) {
        if (ValidateLayout({ScheduleKind::kInterleaved1F1B, s, r, m}).ok())
          out.push_back({ScheduleKind::kInterleaved1F1B, s, r, m});
      }
    }
  }
  return out;
}

std::string Name(const Layout& l) {
  return absl::StrCat(ScheduleKindName(l.kind), " stages=", l.stages, " ranks=", l.ranks,
                      " m=", l.m);
}

// From the trace alone: each F(s,mb) and backward once, F(s,mb) after F(s-1,mb) ends, the
// backward (B or I) after F(s,mb) and after the backward of (s+1,mb), W after I.
std::string CheckTrace(const Schedule& s, const SimResult& r) {
  enum { kF, kB, kW };
  std::map<std::tuple<int, int, int>, ActionTiming> when;
  std::map<std::tuple<int, int, int>, int> count;
  for (size_t rank = 0; rank < s.ranks.size(); ++rank) {
    for (size_t i = 0; i < s.ranks[rank].size(); ++i) {
      const Action& a = s.ranks[rank][i];
      int kind = a.type == ActionType::kForward          ? kF
                 : a.type == ActionType::kBackwardWeight ? kW
                 : a.is_compute()                        ? kB
                                                         : -1;
      if (kind < 0) continue;
      auto key = std::make_tuple(kind, a.stage, a.micro_batch);
      when[key] = r.timing[rank][i];
      ++count[key];
    }
  }
  const int S = s.options.stages, M = s.options.micro_batches;
  for (int st = 0; st < S; ++st) {
    for (int mb = 0; mb < M; ++mb) {
      std::string at = absl::StrCat(" at stage ", st, " mb ", mb);
      if (count[{kF, st, mb}] != 1 || count[{kB, st, mb}] != 1) return "not exactly once" + at;
      const ActionTiming f = when[{kF, st, mb}], b = when[{kB, st, mb}];
      if (st > 0 && f.start < when[{kF, st - 1, mb}].end) return "F before its input" + at;
      if (b.start < f.end) return "backward before forward" + at;
      if (st < S - 1 && b.start < when[{kB, st + 1, mb}].end) return "B before its grad" + at;
      if (count.count({kW, st, mb}) && when[{kW, st, mb}].start < b.end) return "W before I" + at;
    }
  }
  return "";
}

TEST_CASE("every schedule is deadlock-free, complete and ordered; bubbles match theory") {
  const std::vector<Layout> layouts = AllLayouts();
  CHECK(layouts.size() == 1002);  // 256 GPipe, 228 1F1B, 228 ZB-H1, 290 interleaved
  std::map<std::pair<int, int>, double> one_f_one_b_bubble;
  for (const Layout& l : layouts) {
    INFO(Name(l));
    auto s = BuildSchedule({l.kind, l.stages, l.ranks, l.m});
    REQUIRE(s.ok());
    auto eager = Simulate(*s);
    REQUIRE(eager.ok());
    SimOptions rv;
    rv.send_mode = SendMode::kRendezvous;
    auto rendezvous = Simulate(*s, rv);
    REQUIRE(rendezvous.ok());
    CHECK(CheckTrace(*s, *eager) == "");
    CHECK(CheckTrace(*s, *rendezvous) == "");
    // Theory under F=1, B=2 (I=W=1), zero-cost messages, p ranks, v = stages/p, m micro-batches:
    //  GPipe, 1F1B:      makespan 3(m+p-1), every rank works 3m   -> bubble (p-1)/(m+p-1)
    //  interleaved 1F1B: makespan 3(vm+p-1), work 3vm             -> bubble (p-1)/(vm+p-1)
    //  ZB-H1:            makespan 3m+p-1 (W fills the drain)      -> bubble (p-1)/(3m+p-1)
    const int64_t p = l.ranks, m = l.m, v = l.stages / l.ranks;
    int64_t want = 0;
    switch (l.kind) {
      case ScheduleKind::kGPipe:
      case ScheduleKind::k1F1B: want = 3 * (m + p - 1); break;
      case ScheduleKind::kInterleaved1F1B: want = 3 * (v * m + p - 1); break;
      case ScheduleKind::kZBH1: want = 3 * m + p - 1; break;
    }
    CHECK(eager->makespan == want);
    const double work = 3.0 * v * m;
    CHECK(eager->bubble_fraction == Approx(1.0 - work / want).margin(1e-12));
    if (l.kind == ScheduleKind::k1F1B) one_f_one_b_bubble[{l.stages, l.m}] = eager->bubble_fraction;
    if (l.kind == ScheduleKind::kZBH1 && l.m >= l.stages && l.stages > 1) {
      CHECK(eager->bubble_fraction < one_f_one_b_bubble.at({l.stages, l.m}));
    }
    // Rendezvous sends can only add waiting.
    CHECK(rendezvous->makespan >= eager->makespan);
  }
}

TEST_CASE("GPipe and 1F1B hit (p-1)/(m+p-1) with F = B too") {
  SimOptions o;
  o.cost_forward = 1;
  o.cost_backward = 1;
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 32; ++m) {
        INFO(ScheduleKindName(k) << " p=" << p << " m=" << m);
        auto s = BuildSchedule({k, p, p, m});
        REQUIRE(s.ok());
        auto r = Simulate(*s, o);
        REQUIRE(r.ok());
        CHECK(r->makespan == 2 * (m + p - 1));
        CHECK(r->bubble_fraction == Approx(double(p - 1) / (m + p - 1)).margin(1e-12));
      }
    }
  }
}

TEST_CASE("receive-buffer depth does not grow with the number of micro-batches") {
  // Receives sit where their message is sent, so a buffer waits only for its consumer: in 1F1B an
  // interior rank holds the next activation while it runs a backward (2); ZB-H1 keeps a gradient
  // until the deferred W (up to the rank's deferral + 1); interleaved holds one per local stage.
  const std::vector<std::pair<ScheduleOptions, std::vector<int>>> cases = {
      {{ScheduleKind::kGPipe, 4, 4, 0}, {1, 1, 1, 1}},
      {{ScheduleKind::k1F1B, 4, 4, 0}, {1, 2, 2, 1}},
      {{ScheduleKind::kZBH1, 4, 4, 0}, {1, 3, 4, 1}},
      {{ScheduleKind::kInterleaved1F1B, 8, 4, 0}, {2, 3, 3, 4}},
  };
  for (const auto& [opts, want] : cases) {
    for (int m : {8, 16, 32}) {
      ScheduleOptions o = opts;
      o.micro_batches = m;
      INFO(ScheduleKindName(o.kind) << " m=" << m);
      auto s = BuildSchedule(o);
      REQUIRE(s.ok());
      auto r = Simulate(*s);
      REQUIRE(r.ok());
      CHECK(r->peak_recv_buffers == want);
    }
  }
}

// A hand-built two-rank schedule with one micro-batch.
Schedule Tiny(std::vector<Action> r0, std::vector<Action> r1) {
  Schedule s;
  s.options = {ScheduleKind::kGPipe, 2, 2, 1};
  s.ranks = {std::move(r0), std::move(r1)};
  return s;
}
Action A(ActionType t, int stage, int mb, int peer = -1, int tag = -1) {
  Action a{t};
  a.stage = stage;
  a.micro_batch = mb;
  a.peer = peer;
  a.tag = tag;
  return a;
}

TEST_CASE("broken schedules are reported naming the rank and action") {
  using T = ActionType;
  const int act = MessageTag(0, 0, 1, false), grad = MessageTag(0, 0, 1, true);
  const std::vector<Action> good0 = {A(T::kForward, 0, 0), A(T::kSendActivation, 0, 0, 1, act),
                                     A(T::kRecvGrad, 0, 0, 1, grad), A(T::kBackward, 0, 0)};
  const std::vector<Action> good1 = {A(T::kRecvActivation, 1, 0, 0, act), A(T::kForward, 1, 0),
                                     A(T::kBackward, 1, 0), A(T::kSendGrad, 1, 0, 0, grad)};
  REQUIRE(Simulate(Tiny(good0, good1)).ok());

  SECTION("rendezvous deadlock: both ranks receive first") {
    std::vector<Action> r0 = {A(T::kForward, 0, 0), A(T::kRecvGrad, 0, 0, 1, grad),
                              A(T::kSendActivation, 0, 0, 1, act), A(T::kBackward, 0, 0)};
    auto r = Simulate(Tiny(r0, good1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("deadlocks (eager sends): rank 0 at action 1 (RG0.0<1); "
                                    "rank 1 at action 0 (RA1.0<0)") != std::string::npos);
  }
  SECTION("forward without its input") {
    std::vector<Action> r1 = good1;
    r1.erase(r1.begin());
    auto r = Simulate(Tiny(good0, r1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("rank 1 action 0 (F1.0): needs stage 0's activation") !=
          std::string::npos);
  }
  SECTION("forward twice") {
    std::vector<Action> r0 = good0;
    r0.insert(r0.begin() + 1, A(T::kForward, 0, 0));
    auto r = Simulate(Tiny(r0, good1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("(F0.0): forward runs twice") != std::string::npos);
  }
  SECTION("a backward never runs") {
    std::vector<Action> r0 = good0;
    r0.pop_back();
    auto r = Simulate(Tiny(r0, good1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("stage 0 micro-batch 0 ran forward 1 times and backward 0") !=
          std::string::npos);
  }
  SECTION("send to the wrong peer") {
    std::vector<Action> r0 = good0;
    r0[1].peer = 0;
    auto r = Simulate(Tiny(r0, good1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("peer should be rank 1") != std::string::npos);
  }
  SECTION("out-of-range stage, wrong rank count") {
    std::vector<Action> r0 = good0;
    r0[0].stage = 7;
    auto r = Simulate(Tiny(r0, good1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("(F7.0): stage or micro-batch out of range") !=
          std::string::npos);
    Schedule one = Tiny(good0, good1);
    one.ranks.pop_back();
    CHECK(Simulate(one).status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("reduce-grad before the last backward") {
    std::vector<Action> r0 = good0;
    r0.insert(r0.begin() + 3, A(T::kReduceGrad, 0, -1));
    auto r = Simulate(Tiny(r0, good1));
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("(RED0): reduce-grad") != std::string::npos);
  }
}

}  // namespace
}  // namespace ember::pipeline
