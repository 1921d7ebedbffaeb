// One rank of the multi-process onesided tests (onesided_test.cc starts them with a hard deadline).
// Exits 0 when every check of its scenario passed, 1 with the failure on stderr otherwise.
//
//   onesided_worker --rank=R --size=N --store=HOST:PORT --prefix=P --scenario=S [--sizes=0,1,4099]
//                   [--no_detect]   (AgentOptions.detect_peer_failure = false)
//
// Scenarios: transfer (ring put/get/notify of every size, then descriptor lists), refuse (argument
// errors refused before UCX, the peer's memory untouched), kill / kill_wait (rank 1 SIGKILLs itself;
// rank 0 must see an error, not a hang, while getting / while waiting for a notification).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/flight/recorder.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/test_pattern.h"
#include "runtime/store/client.h"

namespace ember::onesided {
namespace {

struct Args {
  int rank = 0, size = 1;
  std::string store, prefix, scenario;
  std::vector<uint64_t> sizes;
  bool no_detect = false;  // AgentOptions.detect_peer_failure = false
};

constexpr absl::Duration kTimeout = absl::Seconds(20);

#define CHECK_OK(expr)                                                             \
  do {                                                                             \
    absl::Status _st = (expr);                                                     \
    if (!_st.ok()) return absl::Status(_st.code(), absl::StrCat(#expr, ": ", _st.message())); \
  } while (0)
#define EXPECT(cond, ...)                                                                   \
  do {                                                                                      \
    if (!(cond)) return absl::InternalError(absl::StrCat("check failed: " #cond " ", __VA_ARGS__)); \
  } while (0)

std::string Name(int r) { return absl::StrCat("rank", r); }

// Registers `buf` and publishes its descriptor under desc/<rank>/<tag>.
absl::StatusOr<Registration> Publish(Agent* a, store::Client& s, int rank, const std::string& tag,
                                     std::vector<uint8_t>* buf) {
  auto reg = a->RegisterMemory(buf->data(), buf->size());
  if (!reg.ok()) return reg.status();
  CHECK_OK(s.Set(absl::StrCat("desc/", rank, "/", tag), reg->descriptor));
  return reg;
}

absl::StatusOr<RemoteRegion> Import(Connection* c, store::Client& s, int rank, const std::string& tag) {
  auto d = s.Get(absl::StrCat("desc/", rank, "/", tag), {.wait = true, .timeout = kTimeout});
  if (!d.ok()) return d.status();
  return c->ImportRegion(*d);
}

// Connects to every other rank in ascending order (deadlock-free: each publishes before waiting).
absl::StatusOr<std::vector<Connection*>> ConnectAll(Agent* a, const Args& args) {
  std::vector<Connection*> conns(args.size, nullptr);
  for (int p = 0; p < args.size; ++p) {
    if (p == args.rank) continue;
    auto c = a->Connect(Name(p));
    if (!c.ok()) return c.status();
    conns[p] = *c;
  }
  return conns;
}

absl::Status Transfer(const Args& args, Agent* a, store::Client& s) {
  auto conns_or = ConnectAll(a, args);
  CHECK_OK(conns_or.status());
  const std::vector<Connection*>& conns = *conns_or;
  const int next = (args.rank + 1) % args.size, prev = (args.rank + args.size - 1) % args.size;
  // Unaligned offsets: data at 3 in the source, at 5 in the destination, at 1 in the get buffer.
  constexpr uint64_t kSrcOff = 3, kDstOff = 5, kGetOff = 1, kPad = 8;
  for (size_t k = 0; k < args.sizes.size(); ++k) {
    const uint64_t n = args.sizes[k];
    const int tag = static_cast<int>(k);
    std::vector<uint8_t> src(n + kPad, 0xEE), dst(n + kPad, 0xEE), got(n + kPad, 0xEE);
    FillPattern(src.data() + kSrcOff, n, args.rank, tag);
    auto rs = Publish(a, s, args.rank, absl::StrCat(k, "/src"), &src);
    auto rd = Publish(a, s, args.rank, absl::StrCat(k, "/dst"), &dst);
    auto rg = a->RegisterMemory(got.data(), got.size());
    CHECK_OK(rs.status());
    CHECK_OK(rd.status());
    CHECK_OK(rg.status());
    auto next_dst = Import(conns[next], s, next, absl::StrCat(k, "/dst"));
    auto prev_src = Import(conns[prev], s, prev, absl::StrCat(k, "/src"));
    CHECK_OK(next_dst.status());
    CHECK_OK(prev_src.status());
    CHECK_OK(a->Put(conns[next], {{rs->id, kSrcOff, n}}, {{*next_dst, kDstOff, n}}).Wait(kTimeout));
    CHECK_OK(a->Notify(conns[next], absl::StrCat("put ", k)).Wait(kTimeout));
    CHECK_OK(a->Get(conns[prev], {{rg->id, kGetOff, n}}, {{*prev_src, kSrcOff, n}}).Wait(kTimeout));
    std::string why = CheckPattern(got.data(), got.size(), kGetOff, n, prev, tag);
    EXPECT(why.empty(), "get of ", n, " bytes from rank ", prev, ": ", why);
    auto note = a->WaitNotification(kTimeout);
    CHECK_OK(note.status());
    EXPECT(note->peer == Name(prev) && note->message == absl::StrCat("put ", k), "got '",
           note->message, "' from ", note->peer);
    why = CheckPattern(dst.data(), dst.size(), kDstOff, n, prev, tag);
    EXPECT(why.empty(), "put of ", n, " bytes from rank ", prev, ": ", why);
    // Everyone has read this round's buffers before they go.
    CHECK_OK(s.Barrier(absl::StrCat("round/", k), args.size, kTimeout));
  }
  // Descriptor lists: three pieces from two registrations into two remote ones, order permuted.
  // d2 and g2 are UCX-allocated (AllocateMemory), the others heap memory.
  std::vector<uint8_t> a1(4000), b1(5012), d1(5016, 0xEE), g1(5016, 0xEE);
  FillPattern(a1.data(), a1.size(), args.rank, 100);
  FillPattern(b1.data(), b1.size(), args.rank, 101);
  auto ra = Publish(a, s, args.rank, "list/a", &a1);
  auto rb = Publish(a, s, args.rank, "list/b", &b1);
  auto rd1 = Publish(a, s, args.rank, "list/d1", &d1);
  auto rd2 = a->AllocateMemory(5000);
  auto rg1 = a->RegisterMemory(g1.data(), g1.size());
  auto rg2 = a->AllocateMemory(5000);
  for (const auto* r : {&ra, &rb, &rd1, &rd2, &rg1, &rg2}) CHECK_OK(r->status());
  CHECK_OK(s.Set(absl::StrCat("desc/", args.rank, "/list/d2"), rd2->descriptor));
  uint8_t* d2 = static_cast<uint8_t*>(rd2->base);
  uint8_t* g2 = static_cast<uint8_t*>(rg2->base);
  memset(d2, 0xEE, 5000);
  memset(g2, 0xEE, 5000);
  CHECK_OK(s.Barrier("list/ready", args.size, kTimeout));  // d2 is filled before anyone writes
  auto nd1 = Import(conns[next], s, next, "list/d1");
  auto nd2 = Import(conns[next], s, next, "list/d2");
  auto pa = Import(conns[prev], s, prev, "list/a");
  auto pb = Import(conns[prev], s, prev, "list/b");
  for (const auto* r : {&nd1, &nd2, &pa, &pb}) CHECK_OK(r->status());
  CHECK_OK(a->Put(conns[next], {{ra->id, 0, 1000}, {rb->id, 7, 5000}, {ra->id, 1000, 3000}},
                  {{*nd2, 4000, 1000}, {*nd1, 11, 5000}, {*nd2, 0, 3000}})
               .Wait(kTimeout));
  CHECK_OK(a->Notify(conns[next], "list").Wait(kTimeout));
  CHECK_OK(a->Get(conns[prev], {{rg2->id, 4000, 1000}, {rg1->id, 11, 5000}, {rg2->id, 0, 3000}},
                  {{*pa, 0, 1000}, {*pb, 7, 5000}, {*pa, 1000, 3000}})
               .Wait(kTimeout));
  auto note = a->WaitNotification(kTimeout);
  CHECK_OK(note.status());
  EXPECT(note->message == "list", note->message);
  // Expected: piece contents of prev's a1/b1, at the permuted places.
  std::vector<uint8_t> pa_exp(4000), pb_exp(5012);
  FillPattern(pa_exp.data(), pa_exp.size(), prev, 100);
  FillPattern(pb_exp.data(), pb_exp.size(), prev, 101);
  for (auto* pair : {&d1, &g1}) {
    EXPECT(memcmp(pair->data() + 11, pb_exp.data() + 7, 5000) == 0, "list piece 2");
    EXPECT((*pair)[10] == 0xEE && (*pair)[5011] == 0xEE, "list piece 2 overran");
  }
  for (const uint8_t* p : {d2, g2}) {
    EXPECT(memcmp(p + 4000, pa_exp.data(), 1000) == 0, "list piece 1");
    EXPECT(memcmp(p, pa_exp.data() + 1000, 3000) == 0, "list piece 3");
    EXPECT(p[3000] == 0xEE && p[3999] == 0xEE, "list pieces overran");
  }
  return s.Barrier("done", args.size, kTimeout);
}

absl::Status Refuse(const Args& args, Agent* a, store::Client& s) {
  auto conns = ConnectAll(a, args);
  CHECK_OK(conns.status());
  const int peer = 1 - args.rank;
  Connection* c = (*conns)[peer];
  std::vector<uint8_t> mine(64, 0x11), local(64);
  FillPattern(local.data(), local.size(), args.rank, 7);
  auto rm = Publish(a, s, args.rank, "r", &mine);
  auto rl = a->RegisterMemory(local.data(), local.size());
  CHECK_OK(rm.status());
  CHECK_OK(rl.status());
  auto theirs = Import(c, s, peer, "r");
  CHECK_OK(theirs.status());
  auto code = [&](Work w) { return w.Wait(kTimeout).code(); };
  using C = absl::StatusCode;
  const uint64_t kHuge = ~uint64_t{0};
  EXPECT(code(a->Put(c, {{rl->id, 0, 8}}, {{*theirs, 60, 8}})) == C::kInvalidArgument, "remote tail");
  EXPECT(code(a->Put(c, {{rl->id, 0, 64}}, {{*theirs, 1, 64}})) == C::kInvalidArgument, "remote +1");
  EXPECT(code(a->Get(c, {{rl->id, 0, 8}}, {{*theirs, kHuge, 8}})) == C::kInvalidArgument, "overflow");
  EXPECT(code(a->Get(c, {{rl->id, 64, 1}}, {{*theirs, 0, 1}})) == C::kInvalidArgument, "local tail");
  EXPECT(code(a->Put(c, {{rl->id, 0, 8}}, {{*theirs, 0, 9}})) == C::kInvalidArgument, "lengths");
  EXPECT(code(a->Put(c, {{rl->id, 0, 8}}, {})) == C::kInvalidArgument, "list sizes");
  EXPECT(code(a->Put(c, {{rl->id, 0, 8}}, {{RemoteRegion{9999}, 0, 8}})) == C::kInvalidArgument,
         "unknown remote handle");
  // A valid piece followed by an invalid one: nothing of the list is sent.
  EXPECT(code(a->Put(c, {{rl->id, 0, 8}, {rl->id, 0, 8}}, {{*theirs, 0, 8}, {*theirs, 57, 8}})) ==
             C::kInvalidArgument, "list with a bad piece");
  std::vector<uint8_t> gone(32);
  auto rgone = a->RegisterMemory(gone.data(), gone.size());
  CHECK_OK(rgone.status());
  CHECK_OK(a->Deregister(rgone->id));
  EXPECT(code(a->Put(c, {{rgone->id, 0, 8}}, {{*theirs, 0, 8}})) == C::kFailedPrecondition, "deregistered");
  EXPECT(code(a->Get(c, {{rgone->id, 0, 8}}, {{*theirs, 0, 8}})) == C::kFailedPrecondition, "deregistered get");
  EXPECT(a->Deregister(rgone->id).code() == C::kNotFound, "double deregister");
  EXPECT(c->ImportRegion(rm->descriptor).status().code() == C::kInvalidArgument, "own descriptor");
  EXPECT(c->ImportRegion("garbage").status().code() == C::kInvalidArgument, "garbage descriptor");
  EXPECT(code(a->Notify(c, std::string(kMaxNotificationBytes + 1, 'x'))) == C::kInvalidArgument, "big note");
  // Host memory registered as kCuda: refused whether or not a GPU exists (no GPU or driver:
  // FAILED_PRECONDITION; a build without CUDA: UNIMPLEMENTED; a GPU: not device memory).
  const C cuda_code = a->RegisterMemory(gone.data(), 8, MemoryKind::kCuda).status().code();
  EXPECT(cuda_code == C::kFailedPrecondition || cuda_code == C::kUnimplemented ||
             cuda_code == C::kInvalidArgument, "cuda");
  CHECK_OK(s.Barrier("refused", 2, kTimeout));
  for (uint8_t b : mine) EXPECT(b == 0x11, "a refused transfer changed this rank's memory");
  CHECK_OK(s.Barrier("checked", 2, kTimeout));
  // The connection still works: the refusals were not transport failures.
  CHECK_OK(a->Put(c, {{rl->id, 0, 0}}, {{*theirs, 64, 0}}).Wait(kTimeout));
  CHECK_OK(a->Put(c, {{rl->id, 0, 64}}, {{*theirs, 0, 64}}).Wait(kTimeout));
  CHECK_OK(a->Notify(c, "valid").Wait(kTimeout));
  auto note = a->WaitNotification(kTimeout);
  CHECK_OK(note.status());
  std::string why = CheckPattern(mine.data(), mine.size(), 0, 64, peer, 7);
  EXPECT(why.empty(), why);
  return s.Barrier("done", 2, kTimeout);
}

// Rank 1 dies (SIGKILL) once rank 0 is busy; rank 0 must get an error within its timeout.
absl::Status Kill(const Args& args, Agent* a, store::Client& s, bool wait_for_note) {
  auto conns = ConnectAll(a, args);
  CHECK_OK(conns.status());
  Connection* c = (*conns)[1 - args.rank];
  std::vector<uint8_t> buf(32 << 20, 0x5A);
  auto reg = Publish(a, s, args.rank, "big", &buf);
  CHECK_OK(reg.status());
  auto theirs = Import(c, s, 1 - args.rank, "big");
  CHECK_OK(theirs.status());
  CHECK_OK(s.Barrier("ready", 2, kTimeout));
  if (args.rank == 1) {
    absl::SleepFor(absl::Milliseconds(300));
    raise(SIGKILL);
  }
  constexpr absl::Duration kWait = absl::Seconds(3);
  const absl::Time t0 = absl::Now();
  absl::Status st;
  if (wait_for_note) {
    st = a->WaitNotification(kWait).status();
  } else {
    // Gets until one fails; each Wait is bounded, so this ends.
    for (int i = 0; st.ok() && absl::Now() - t0 < absl::Seconds(30); ++i) {
      st = a->Get(c, {{reg->id, 0, buf.size()}}, {{*theirs, 0, buf.size()}}).Wait(kWait);
    }
  }
  const absl::Duration took = absl::Now() - t0;
  fprintf(stderr, "rank 0: after the peer died: %s (after %s)\n", st.ToString().c_str(),
          absl::FormatDuration(took).c_str());
  EXPECT(!st.ok(), "the transfer/wait succeeded after the peer died");
  EXPECT(st.code() == absl::StatusCode::kUnavailable || st.code() == absl::StatusCode::kDeadlineExceeded,
         st.ToString());
  EXPECT(took < kWait + absl::Seconds(3), "took ", absl::FormatDuration(took));
  return absl::OkStatus();
}

// The flight recorder holds one completed entry per transfer, with its bytes and peer.
absl::Status CheckRecorder(const Args& args, const flight::FlightRecorder& fr) {
  const int next = (args.rank + 1) % args.size, prev = (args.rank + args.size - 1) % args.size;
  size_t puts = 0, gets = 0, notes = 0;
  for (const flight::Entry& e : fr.Entries()) {
    const std::string op = e.op;
    EXPECT(e.state == flight::State::kCompleted, op, " entry ", e.record_id, " not completed");
    EXPECT(e.time_completed_ns >= e.time_started_ns && e.time_started_ns > 0, "times of ", op);
    if (op == "onesided_put" || op == "onesided_notify") {
      EXPECT(e.peer == next, op, " peer ", e.peer);
    } else {
      EXPECT(op == "onesided_get" && e.peer == prev, op, " peer ", e.peer);
    }
    if (op == "onesided_put" && puts < args.sizes.size()) {
      EXPECT(e.in_numel == static_cast<int64_t>(args.sizes[puts]), "put bytes ", e.in_numel);
    }
    if (op == "onesided_get" && gets < args.sizes.size()) {
      EXPECT(e.in_numel == static_cast<int64_t>(args.sizes[gets]), "get bytes ", e.in_numel);
    }
    puts += op == "onesided_put";
    gets += op == "onesided_get";
    notes += op == "onesided_notify";
  }
  // One of each per size, plus the descriptor-list put, get and notify.
  EXPECT(puts == args.sizes.size() + 1 && gets == puts && notes == puts, puts, " puts ", gets,
         " gets ", notes, " notifications recorded");
  return absl::OkStatus();
}

absl::Status Run(const Args& args) {
  auto client = store::Client::Connect({.address = args.store});
  CHECK_OK(client.status());
  store::Client s = client->WithPrefix(args.prefix);
  flight::FlightRecorder fr;
  auto agent = Agent::Create({.store = &s, .key_prefix = "onesided/", .rank = args.rank,
                              .recorder = &fr, .detect_peer_failure = !args.no_detect});
  CHECK_OK(agent.status());
  if (args.scenario == "transfer") {
    CHECK_OK(Transfer(args, agent->get(), s));
    return CheckRecorder(args, fr);
  }
  if (args.scenario == "refuse") return Refuse(args, agent->get(), s);
  if (args.scenario == "kill") return Kill(args, agent->get(), s, false);
  if (args.scenario == "kill_wait") return Kill(args, agent->get(), s, true);
  return absl::InvalidArgumentError(absl::StrCat("unknown --scenario=", args.scenario));
}

}  // namespace
}  // namespace ember::onesided

int main(int argc, char** argv) {
  ember::onesided::Args args;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    const std::string& v = kv.second;
    bool ok = true;
    if (kv.first == "--rank") ok = absl::SimpleAtoi(v, &args.rank);
    else if (kv.first == "--size") ok = absl::SimpleAtoi(v, &args.size);
    else if (kv.first == "--store") args.store = v;
    else if (kv.first == "--prefix") args.prefix = v;
    else if (kv.first == "--scenario") args.scenario = v;
    else if (kv.first == "--no_detect") args.no_detect = true;
    else if (kv.first == "--sizes") {
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        uint64_t n = 0;
        ok = ok && absl::SimpleAtoi(s, &n);
        args.sizes.push_back(n);
      }
    } else ok = false;
    if (!ok) {
      fprintf(stderr, "onesided_worker: bad argument %s\n", argv[i]);
      return 2;
    }
  }
  absl::Status st = ember::onesided::Run(args);
  if (!st.ok()) {
    fprintf(stderr, "onesided_worker rank %d (%s): %s\n", args.rank, args.scenario.c_str(),
            st.ToString().c_str());
    return 1;
  }
  return 0;
}
