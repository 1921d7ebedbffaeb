#include "runtime/flight/analyze.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "runtime/flight/recorder.h"
#include "runtime/flight/verdict.h"

namespace ember::fr {
namespace {

// Rank r completes `done` all_reduces, then enqueues (and starts) `extra` more.
std::string Dump(int rank, int done, int extra, int64_t numel_at_3 = 1024) {
  flight::FlightRecorder fr;
  int g = fr.RegisterGroup({.name = "world", .rank = rank, .size = 4, .global_rank = rank,
                            .global_ranks = {0, 1, 2, 3}});
  for (int s = 1; s <= done + extra; ++s) {
    uint64_t id = fr.Record({.group_id = g, .collective_seq = s, .op = "all_reduce",
                             .in_numel = s == 3 ? numel_at_3 : 1024, .in_dtype = "f32",
                             .out_dtype = "f32", .tag = "step"});
    fr.Start(id);
    if (s <= done) fr.Complete(id);
  }
  return fr.DumpJson("test", rank);
}

}  // namespace

TEST_CASE("names the rank that never joined and the op") {
  std::map<std::string, std::string> files = {{"rank-0.json", Dump(0, 2, 1)},
                                              {"rank-1.json", Dump(1, 2, 0)},
                                              {"rank-2.json", Dump(2, 2, 1)},
                                              {"rank-3.json", Dump(3, 2, 1)}};
  auto r = AnalyzeTexts(files);
  REQUIRE(r.ok());
  REQUIRE(r->problem);
  REQUIRE(r->findings[0].kind == "never_joined");
  REQUIRE(r->findings[0].ranks == std::vector<int>{1});
  REQUIRE(r->findings[0].op == "all_reduce");
  REQUIRE(r->findings[0].seq == 3);
  REQUIRE(r->ToText().find("ranks [1] never joined all_reduce (seq 3") != std::string::npos);
  REQUIRE(r->groups[0].last_completed.at(1) == 2);
  REQUIRE(r->ToJson().find("\"kind\": \"never_joined\"") != std::string::npos);
}

TEST_CASE("finds the first disagreement and missing dumps; clean runs pass") {
  auto r = AnalyzeTexts({{"rank-0.json", Dump(0, 2, 2)}, {"rank-1.json", Dump(1, 2, 2, 7)},
                         {"rank-2.json", Dump(2, 2, 2)}});
  REQUIRE(r.ok());
  bool mismatch = false, missing = false;
  for (auto& f : r->findings) {
    if (f.kind == "mismatch") {
      mismatch = true;
      REQUIRE(f.seq == 3);
      REQUIRE(f.ranks == std::vector<int>{1});
    }
    if (f.kind == "missing_dump") missing = f.ranks == std::vector<int>{3};
  }
  REQUIRE(mismatch);
  REQUIRE(missing);
  auto ok = AnalyzeTexts({{"rank-0.json", Dump(0, 5, 0)}, {"rank-1.json", Dump(1, 5, 0)},
                          {"rank-2.json", Dump(2, 5, 0)}, {"rank-3.json", Dump(3, 5, 0)}});
  REQUIRE(ok.ok());
  REQUIRE(!ok->problem);
  REQUIRE(!AnalyzeTexts({{"rank-0.json", "{\"schema\": \"ember.flight_recorder\", \"version\": \"2.0\"}"}}).ok());
  REQUIRE(!AnalyzeTexts({{"rank-0.json", "{bad"}}).ok());
}

}  // namespace ember::fr

namespace ember::fr {

// Issue 12: a FIFO named like a dump made `fr analyze` block forever in open(2); the alarm turns
// such a hang into a failure.
TEST_CASE("a FIFO among the dumps is refused at once") {
  std::string dir = std::string(getenv("TEST_TMPDIR")) + "/fr_fifo";
  mkdir(dir.c_str(), 0700);
  { std::ofstream(dir + "/rank-0.json") << Dump(0, 2, 0); }
  REQUIRE(mkfifo((dir + "/rank-1.json").c_str(), 0600) == 0);
  alarm(20);
  auto r = AnalyzeDir(dir);
  alarm(0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("rank-1.json is a FIFO") != std::string::npos);
}

// Issue 31: the directory is the script's; a root daemon analysing it must not read a root file
// through a dump-named symlink (its text could surface in the verdict).
TEST_CASE("a symlink among the dumps is refused, not followed") {
  std::string dir = std::string(getenv("TEST_TMPDIR")) + "/fr_link";
  mkdir(dir.c_str(), 0700);
  { std::ofstream(dir + "/rank-0.json") << Dump(0, 2, 0); }
  { std::ofstream(dir + "/elsewhere") << Dump(1, 2, 0); }
  REQUIRE(symlink((dir + "/elsewhere").c_str(), (dir + "/rank-1.json").c_str()) == 0);
  auto r = AnalyzeDir(dir);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("rank-1.json is a symlink") != std::string::npos);
}

// Script jobs point PyTorch's flight recorder at the attempt's directory (torch-rank-<r>); those
// pickles are not read, and a directory holding only them says so instead of "no dumps".
TEST_CASE("a directory of PyTorch's dumps only is named as such") {
  std::string dir = std::string(getenv("TEST_TMPDIR")) + "/fr_torch";
  mkdir(dir.c_str(), 0700);
  { std::ofstream(dir + "/torch-rank-0") << "\x80\x02}q\x00."; }
  auto r = AnalyzeDir(dir);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsUnimplemented(r.status()));
  CHECK(r.status().message().find("PyTorch flight-recorder dumps") != std::string::npos);
  { std::ofstream(dir + "/rank-0.json") << Dump(0, 2, 0); }
  CHECK(AnalyzeDir(dir).ok());  // Ember's dumps beside them are analysed as usual
}

}  // namespace ember::fr

namespace ember::fr {
namespace {

// One rank's dump for point-to-point tests. `groups`: name -> world ranks of the members. `ops`:
// {group, op, peer (group rank; -1 for collectives), tag, completed}; collectives get seq 1, 2, ...
// per group, send/recv get p2p seqs.
struct TestOp {
  std::string group, op;
  int peer = -1;
  int tag = 0;
  bool completed = false;
};

std::string P2PDump(int rank, const std::map<std::string, std::vector<int>>& groups,
                    const std::vector<TestOp>& ops) {
  flight::FlightRecorder fr;
  std::map<std::string, int> gid;
  std::map<std::string, int64_t> cseq, pseq;
  for (const auto& [name, world] : groups) {
    int me = static_cast<int>(std::find(world.begin(), world.end(), rank) - world.begin());
    gid[name] = fr.RegisterGroup({.name = name, .rank = me, .size = static_cast<int>(world.size()),
                                  .global_rank = rank, .global_ranks = world});
  }
  for (const TestOp& o : ops) {
    bool p2p = o.op == "send" || o.op == "recv";
    std::string tag = p2p ? "tag=" + std::to_string(o.tag) : "step";
    uint64_t id = fr.Record({.group_id = gid.at(o.group),
                             .collective_seq = p2p ? -1 : ++cseq[o.group],
                             .p2p_seq = p2p ? ++pseq[o.group] : -1, .op = o.op, .in_numel = 64,
                             .out_numel = 64, .in_dtype = "f32", .out_dtype = "f32",
                             .peer = o.peer, .tag = tag});
    fr.Start(id);
    if (o.completed) fr.Complete(id);
  }
  return fr.DumpJson("test", rank);
}

}  // namespace

TEST_CASE("p2p: a dead stage rank behind a recv chain is named first") {
  // PP=2 x FSDP=2: pipes {0,1} and {2,3}, stage groups {0,2} and {1,3}. Rank 1 died (no dump).
  // Rank 0 waits in a recv from rank 1; rank 2 waits in stage0's reduce_scatter that rank 0 never
  // joined; rank 3 waits in stage1's reduce_scatter for rank 1.
  std::map<std::string, std::vector<int>> g0 = {{"pp0", {0, 1}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g2 = {{"pp1", {2, 3}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g3 = {{"pp1", {2, 3}}, {"stage1", {1, 3}}};
  auto r = AnalyzeTexts(
      {{"rank-0.json", P2PDump(0, g0, {{"pp0", "send", 1, 7, true}, {"pp0", "recv", 1, 8}})},
       {"rank-2.json", P2PDump(2, g2, {{"pp1", "send", 1, 7, true}, {"pp1", "recv", 1, 8, true},
                                       {"stage0", "reduce_scatter"}})},
       {"rank-3.json", P2PDump(3, g3, {{"pp1", "recv", 0, 7, true}, {"pp1", "send", 0, 8, true},
                                       {"stage1", "reduce_scatter"}})}});
  REQUIRE(r.ok());
  INFO(r->ToText());
  REQUIRE(r->findings[0].kind == "waits_for");
  REQUIRE(r->findings[0].ranks == std::vector<int>{1});
  // The longest chain: 2 -> 0 (collective) -> 1 (recv).
  CHECK(r->findings[0].text ==
        "rank 1 left no dump (dead, or hung before its watchdog dumped): rank 2 is waiting for "
        "rank 0 (reduce_scatter seq 1 of group 'stage0'), rank 0 is waiting for rank 1 (recv tag 8 "
        "of group 'pp0')");
  // The per-group findings are still there, after it.
  bool never = false;
  for (const Finding& f : r->findings) never |= f.kind == "never_joined" && f.ranks == std::vector<int>{0};
  REQUIRE(never);
}

TEST_CASE("a chain of collectives across groups to a dead rank is followed too") {
  // As seen in PP=2 x FSDP=2 when rank 1 died: rank 2 waits in pipeline1's broadcast for rank 3,
  // which waits in stage1's all_gather for rank 1; rank 0 waits in pipeline0's broadcast for 1.
  std::map<std::string, std::vector<int>> g0 = {{"pipeline0", {0, 1}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g2 = {{"pipeline1", {2, 3}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g3 = {{"pipeline1", {2, 3}}, {"stage1", {1, 3}}};
  auto r = AnalyzeTexts(
      {{"rank-0.json", P2PDump(0, g0, {{"stage0", "all_gather", -1, 0, true}, {"pipeline0", "broadcast"}})},
       {"rank-2.json", P2PDump(2, g2, {{"stage0", "all_gather", -1, 0, true},
                                       {"pipeline1", "broadcast", -1, 0, true},
                                       {"pipeline1", "broadcast"}})},
       {"rank-3.json", P2PDump(3, g3, {{"pipeline1", "broadcast", -1, 0, true}, {"stage1", "all_gather"}})}});
  REQUIRE(r.ok());
  INFO(r->ToText());
  REQUIRE(r->findings[0].kind == "waits_for");
  CHECK(r->findings[0].text ==
        "rank 1 left no dump (dead, or hung before its watchdog dumped): rank 2 is waiting for "
        "rank 3 (broadcast seq 2 of group 'pipeline1'), rank 3 is waiting for rank 1 (all_gather "
        "seq 1 of group 'stage1')");
}

TEST_CASE("p2p: a recv/recv deadlock is named as a cycle") {
  std::map<std::string, std::vector<int>> g = {{"pp", {0, 1, 2}}};
  auto r = AnalyzeTexts({{"rank-0.json", P2PDump(0, g, {{"pp", "recv", 1, 3}})},
                         {"rank-1.json", P2PDump(1, g, {{"pp", "recv", 2, 4}})},
                         {"rank-2.json", P2PDump(2, g, {{"pp", "recv", 1, 5}})}});
  REQUIRE(r.ok());
  INFO(r->ToText());
  REQUIRE(r->problem);
  REQUIRE(r->findings[0].kind == "waits_for");
  REQUIRE(r->findings[0].ranks == std::vector<int>{1, 2});
  CHECK(r->findings[0].text ==
        "ranks 1, 2 wait for each other in a cycle (deadlock): rank 0 is waiting for rank 1 (recv "
        "tag 3 of group 'pp'), rank 1 is waiting for rank 2 (recv tag 4 of group 'pp'), rank 2 is "
        "waiting for rank 1 (recv tag 5 of group 'pp')");
}

TEST_CASE("p2p: a live rank with nothing pending is the root; collective-only hangs unchanged") {
  std::map<std::string, std::vector<int>> g = {{"pp", {0, 1}}};
  auto r = AnalyzeTexts({{"rank-0.json", P2PDump(0, g, {{"pp", "recv", 1, 9}})},
                         {"rank-1.json", P2PDump(1, g, {{"pp", "send", 0, 8, true}})}});
  REQUIRE(r.ok());
  REQUIRE(r->findings.size() == 1);
  CHECK(r->findings[0].ranks == std::vector<int>{1});
  CHECK(r->findings[0].text ==
        "rank 1 never joined: it has no op pending (hung outside communication?): rank 0 is "
        "waiting for rank 1 (recv tag 9 of group 'pp')");
  // Only collectives (rank 1 never joined all_reduce 3, rank 3 gone): no wait chain finding.
  auto c = AnalyzeTexts({{"rank-0.json", Dump(0, 2, 1)}, {"rank-1.json", Dump(1, 2, 0)},
                         {"rank-2.json", Dump(2, 2, 1)}});
  REQUIRE(c.ok());
  for (const Finding& f : c->findings) CHECK(f.kind != "waits_for");
  REQUIRE(c->findings[0].kind == "missing_dump");
}

}  // namespace ember::fr

namespace ember::fr {

// recovery_test's flake: after a kill -9 of rank 1, where the survivors happen to be when they stop
// decided the verdict. A survivor stuck in a collective that every dumped member entered and only
// the dead rank is missing from waits for the dead rank, so the dead rank is named first too.
TEST_CASE("a collective that only a rank with no dump is missing from names that rank") {
  // PP=2 x FSDP=2, rank 1 killed: rank 0 waits in pipeline0's broadcast (members 0, 1); ranks 2
  // and 3 stopped with nothing pending.
  std::map<std::string, std::vector<int>> g0 = {{"pipeline0", {0, 1}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g2 = {{"pipeline1", {2, 3}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g3 = {{"pipeline1", {2, 3}}, {"stage1", {1, 3}}};
  auto r = AnalyzeTexts(
      {{"rank-0.json", P2PDump(0, g0, {{"stage0", "all_gather", -1, 0, true},
                                       {"pipeline0", "broadcast", -1, 0, true},
                                       {"pipeline0", "broadcast"}})},
       {"rank-2.json", P2PDump(2, g2, {{"stage0", "all_gather", -1, 0, true},
                                       {"pipeline1", "broadcast", -1, 0, true}})},
       {"rank-3.json", P2PDump(3, g3, {{"pipeline1", "broadcast", -1, 0, true}})}});
  REQUIRE(r.ok());
  INFO(r->ToText());
  REQUIRE(r->findings[0].kind == "waits_for");
  REQUIRE(r->findings[0].ranks == std::vector<int>{1});
  CHECK(r->findings[0].text ==
        "rank 1 left no dump (dead, or hung before its watchdog dumped): rank 0 is waiting for "
        "rank 1 (broadcast seq 2 of group 'pipeline0')");
  // The per-group "stuck" finding is still there, after it.
  bool stuck = false;
  for (const Finding& f : r->findings) stuck |= f.kind == "stuck" && f.ranks == std::vector<int>{0};
  REQUIRE(stuck);

  // One group: ranks 0, 2, 3 all entered all_reduce 3, rank 1 left no dump.
  auto w = AnalyzeTexts({{"rank-0.json", Dump(0, 2, 1)}, {"rank-2.json", Dump(2, 2, 1)},
                         {"rank-3.json", Dump(3, 2, 1)}});
  REQUIRE(w.ok());
  INFO(w->ToText());
  REQUIRE(w->findings[0].kind == "waits_for");
  REQUIRE(w->findings[0].ranks == std::vector<int>{1});
  CHECK(w->findings[0].text ==
        "rank 1 left no dump (dead, or hung before its watchdog dumped): rank 0 is waiting for "
        "rank 1 (all_reduce seq 3 of group 'world')");
}

}  // namespace ember::fr

namespace ember::fr {
namespace {

std::string WriteDumps(const std::string& name, const std::map<std::string, std::string>& files) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  mkdir(dir.c_str(), 0700);
  for (const auto& [file, text] : files) std::ofstream(dir + "/" + file) << text;
  return dir;
}

}  // namespace

// FlightVerdict (the daemon's one line): after a kill -9 the dead rank leads wherever the
// survivors stopped; without a dead rank the order is unchanged.
TEST_CASE("verdict: a rank that left no dump leads, whatever the survivors were doing") {
  // PP=2, one replica: rank 0 stopped with nothing pending (seen in recovery_test).
  std::map<std::string, std::vector<int>> p = {{"pipeline0", {0, 1}}};
  const std::string idle = P2PDump(0, p, {{"pipeline0", "send", 1, 1, true}});
  CHECK(FlightVerdict(WriteDumps("v_idle", {{"rank-0.json", idle}})) ==
        "rank 1 left no dump (dead, or hung before its watchdog dumped)");
  // PP=2 x FSDP=2: rank 0 stopped with nothing pending, rank 2 waits for it in stage0 and rank 3
  // for rank 2 (recv); that chain's live root (rank 0, which the daemon would have put in the
  // lead as hung) and its never-joined come after the dead rank 1.
  std::map<std::string, std::vector<int>> g0 = {{"pipeline0", {0, 1}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g2 = {{"pipeline1", {2, 3}}, {"stage0", {0, 2}}};
  std::map<std::string, std::vector<int>> g3 = {{"pipeline1", {2, 3}}, {"stage1", {1, 3}}};
  const std::string v = FlightVerdict(WriteDumps(
      "v_pp4", {{"rank-0.json", P2PDump(0, g0, {{"stage0", "all_gather", -1, 0, true}})},
                {"rank-2.json", P2PDump(2, g2, {{"stage0", "all_gather", -1, 0, true},
                                                {"stage0", "reduce_scatter"}})},
                {"rank-3.json", P2PDump(3, g3, {{"pipeline1", "recv", 0, 5}})}}));
  INFO(v);
  CHECK(absl::StartsWith(v, "rank 1 left no dump (dead, or hung before its watchdog dumped); "));
  CHECK(absl::StrContains(v, "; rank 0 never joined: it has no op pending"));
  // A chain to the dead rank names it once.
  const std::string dp = FlightVerdict(WriteDumps(
      "v_dp", {{"rank-0.json", Dump(0, 2, 1)}, {"rank-2.json", Dump(2, 2, 1)},
               {"rank-3.json", Dump(3, 2, 1)}}));
  CHECK(dp ==
        "rank 1 left no dump (dead, or hung before its watchdog dumped): rank 0 is waiting for "
        "rank 1 (all_reduce seq 3 of group 'world'); ranks 0, 2, 3 stuck in all_reduce seq 3 of "
        "group 'world'");
  // Every rank dumped: the hung rank leads as before.
  CHECK(FlightVerdict(WriteDumps("v_hang", {{"rank-0.json", Dump(0, 2, 1)},
                                            {"rank-1.json", Dump(1, 2, 0)},
                                            {"rank-2.json", Dump(2, 2, 1)},
                                            {"rank-3.json", Dump(3, 2, 1)}})) ==
        "rank 1 never joined all_reduce seq 3 of group 'world'");
}

}  // namespace ember::fr
