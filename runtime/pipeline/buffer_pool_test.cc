// BufferPool driven through whole schedules as an executor drives it: no buffer live after a step,
// the just-in-time depth bound holds, just-in-time peak bytes are at most half the preallocated
// ones for m >= 2p, and a failed or unfinished send surfaces as a Status.
#include "runtime/pipeline/buffer_pool.h"

#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::pipeline {
namespace {

constexpr int64_t kFloats = 1000;

// The send that carries `compute`'s output on this rank, if any.
const Action* OutputSend(const std::vector<Action>& list, const Action& c) {
  for (const Action& a : list) {
    if (a.stage != c.stage || a.micro_batch != c.micro_batch) continue;
    if (c.type == ActionType::kForward && a.type == ActionType::kSendActivation) return &a;
    if ((c.type == ActionType::kBackward || c.type == ActionType::kBackwardInput) &&
        a.type == ActionType::kSendGrad)
      return &a;
  }
  return nullptr;
}

// Rank `rank`'s step: output buffers acquired before the compute that fills them, receive buffers
// at the receive, a send's Work completing `lag` actions after it was issued.
absl::Status Replay(const Schedule& s, int rank, BufferPool* pool, int lag) {
  RETURN_IF_ERROR(pool->BeginStep());
  std::deque<std::pair<size_t, std::shared_ptr<comm::Work>>> inflight;
  const std::vector<Action>& list = s.ranks[rank];
  for (size_t i = 0; i < list.size(); ++i) {
    while (!inflight.empty() && inflight.front().first + lag <= i) {
      inflight.front().second->Finish(absl::OkStatus());
      inflight.pop_front();
    }
    const Action& a = list[i];
    if (a.is_recv()) {
      ASSIGN_OR_RETURN(float* buf, pool->AcquireRecv(a));
      buf[kFloats - 1] = 1;  // the receive writes it
    } else if (a.is_send()) {
      auto work = std::make_shared<comm::Work>("send", static_cast<int64_t>(i));
      RETURN_IF_ERROR(pool->HoldUntilSent(a, work));
      inflight.push_back({i, work});
    } else if (a.is_compute()) {
      if (const Action* send = OutputSend(list, a)) {
        ASSIGN_OR_RETURN(float* out, pool->AcquireSend(*send));
        out[0] = 2;
      }
      RETURN_IF_ERROR(pool->AfterCompute(a));
    }
  }
  for (auto& w : inflight) w.second->Finish(absl::OkStatus());
  return pool->EndStep(absl::Seconds(5));
}

TEST_CASE("whole steps: nothing live afterwards; just in time is at most half of preallocated") {
  struct Layout {
    ScheduleKind kind;
    int stages, ranks;
  };
  for (Layout l : {Layout{ScheduleKind::kGPipe, 4, 4}, Layout{ScheduleKind::k1F1B, 4, 4},
                   Layout{ScheduleKind::k1F1B, 2, 2}, Layout{ScheduleKind::kZBH1, 4, 4},
                   Layout{ScheduleKind::kInterleaved1F1B, 8, 4}}) {
    for (int m : {4, 8, 16, 32}) {
      auto s = BuildSchedule({l.kind, l.stages, l.ranks, m});
      if (!s.ok()) continue;  // e.g. 1F1B needs m >= stages
      for (int lag : {0, 1, 3}) {
        for (int r = 0; r < l.ranks; ++r) {
          INFO(ScheduleKindName(l.kind) << " stages=" << l.stages << " m=" << m << " rank=" << r
                                        << " send lag=" << lag);
          auto jit = BufferPool::Create(*s, r, kFloats);
          BufferPoolOptions pre_opts;
          pre_opts.preallocate = true;
          auto pre = BufferPool::Create(*s, r, kFloats, pre_opts);
          REQUIRE(jit.ok());
          REQUIRE(pre.ok());
          for (int step = 0; step < 2; ++step) {
            absl::Status a = Replay(*s, r, jit->get(), lag);
            absl::Status b = Replay(*s, r, pre->get(), lag);
            CHECK(a.ToString() == "OK");
            CHECK(b.ToString() == "OK");
            CHECK((*jit)->live_buffers() == 0);
            CHECK((*jit)->live_bytes() == 0);
            CHECK((*pre)->live_buffers() == 0);
            CHECK((*pre)->live_bytes() == 0);
          }
          // Preallocated: one buffer per send and receive of the rank, all at once.
          int messages = 0;
          for (const Action& a : s->ranks[r]) messages += a.is_send() || a.is_recv();
          CHECK((*pre)->peak_bytes() == messages * kFloats * int64_t{sizeof(float)});
          if (m >= 2 * l.ranks && messages > 0) {
            CHECK((*jit)->peak_bytes() * 2 <= (*pre)->peak_bytes());
          }
        }
      }
    }
  }
}

// A pool for rank 0 of a 2-stage 1F1B schedule with 2 micro-batches (F0.0 SA0.0>1 F0.1 SA0.1>1
// RG0.0<1 B0.0 RG0.1<1 B0.1 RED0 OPT).
struct Rank0 {
  Schedule s = *BuildSchedule({ScheduleKind::k1F1B, 2, 2, 2});
  const std::vector<Action>& list = s.ranks[0];
  const Action& send0 = list[1];
  const Action& send1 = list[3];
  const Action& recv0 = list[4];
  const Action& b0 = list[5];
  const Action& recv1 = list[6];
};

TEST_CASE("a failed send surfaces with the action and frees its buffer") {
  Rank0 t;
  REQUIRE(ActionToString(t.send1) == "SA0.1>1");
  auto pool = *BufferPool::Create(t.s, 0, kFloats);
  REQUIRE(pool->BeginStep().ok());
  REQUIRE(pool->AcquireSend(t.send0).ok());
  auto w0 = std::make_shared<comm::Work>("send", 0);
  REQUIRE(pool->HoldUntilSent(t.send0, w0).ok());
  REQUIRE(pool->AcquireSend(t.send1).ok());
  auto w1 = std::make_shared<comm::Work>("send", 1);
  REQUIRE(pool->HoldUntilSent(t.send1, w1).ok());
  CHECK(pool->live_buffers() == 2);
  w0->Finish(absl::OkStatus());
  w1->Finish(absl::UnavailableError("peer rank 1 closed the connection"));
  absl::Status st = pool->ReapSends();
  CHECK(st.code() == absl::StatusCode::kUnavailable);
  CHECK(st.message() == "send SA0.1>1 (rank 0): peer rank 1 closed the connection");
  CHECK(pool->live_buffers() == 0);
  CHECK(pool->EndStep(absl::Seconds(1)).ok());
}

TEST_CASE("EndStep waits for sends; an unfinished one keeps its buffer and is named") {
  Rank0 t;
  auto pool = *BufferPool::Create(t.s, 0, kFloats);
  REQUIRE(pool->BeginStep().ok());
  REQUIRE(pool->AcquireSend(t.send0).ok());
  auto w = std::make_shared<comm::Work>("send", 7);
  REQUIRE(pool->HoldUntilSent(t.send0, w).ok());
  absl::Status st = pool->EndStep(absl::Milliseconds(20));
  CHECK(st.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(st.message().find("send SA0.0>1 (send seq 7) not completed") != std::string::npos);
  CHECK(pool->live_buffers() == 1);
  CHECK(pool->BeginStep().code() == absl::StatusCode::kFailedPrecondition);
  w->Finish(absl::OkStatus());
  CHECK(pool->EndStep(absl::Seconds(1)).ok());
  CHECK(pool->live_buffers() == 0);
  CHECK(pool->BeginStep().ok());
}

TEST_CASE("receive buffers: depth bound, release by the reading compute, leaks named") {
  Rank0 t;
  BufferPoolOptions one;
  one.max_live_recv = 1;
  auto pool = *BufferPool::Create(t.s, 0, kFloats, one);
  CHECK(pool->AcquireRecv(t.recv0).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(pool->BeginStep().ok());
  REQUIRE(pool->AcquireRecv(t.recv0).ok());
  CHECK(pool->AcquireRecv(t.recv0).status().code() == absl::StatusCode::kFailedPrecondition);
  auto over = pool->AcquireRecv(t.recv1);
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(over.status().message().find("over the schedule's depth 1") != std::string::npos);
  CHECK(pool->AcquireSend(t.recv1).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(pool->AfterCompute(t.b0).ok());  // B0.0 read RG0.0 last
  CHECK(pool->live_buffers() == 0);
  REQUIRE(pool->AcquireRecv(t.recv1).ok());
  absl::Status st = pool->EndStep(absl::Seconds(1));
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(st.message().find("never released during the step: RG0.1<1") != std::string::npos);
  CHECK(pool->live_buffers() == 0);
  CHECK(pool->live_bytes() == 0);
  CHECK(pool->peak_bytes() == kFloats * int64_t{sizeof(float)});
}

TEST_CASE("Create checks its arguments and takes the depth from the simulator") {
  Rank0 t;
  CHECK(BufferPool::Create(t.s, 2, kFloats).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(BufferPool::Create(t.s, 0, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*BufferPool::Create(t.s, 0, kFloats))->max_live_recv() == 1);
}

}  // namespace
}  // namespace ember::pipeline
