// Cross-host in-memory replicas (replicas.h) with real onesided agents over TCP on loopback
// (UCX_TLS=tcp, the transport between hosts: puts are the agent's token-checked messages). Two
// "hosts" are two replica directories; ranks 0 and 1 of a world of 2 with one rank per host, so
// each is the other's buddy and holds the other's copy in its own directory.
//   * Attempt 1: rank 0 runs in a child process that saves step 1 (committed in rank 1's
//     directory) and is killed with -9 halfway through putting step 2: the holder's file still
//     names step 1 as its only commit (the record is written after the data, never before), and
//     step 1's bytes verify.
//   * Attempt 2: rank 0 is placed on a new host (an empty directory: its own file is gone). The
//     agreement counts step 1 for it (held by rank 1), ResumeFromReplicas pulls the copy over the
//     network and restores shards, AdamW state, optimizer step and loader position bitwise equal to
//     what was saved, with the counters saying so; rank 1 restores its own. Saves go on into the
//     holder's file after the resume.
//   * Fencing: a put carrying attempt 1's region token into attempt 2's holder is refused by its
//     agent and writes nothing.
//   * Attempt 3 on two new hosts (both copies gone): no step in memory, the disk path.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "runtime/job/keys.h"
#include "runtime/onesided/agent.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"
#include "runtime/worker/replica_file.h"
#include "runtime/worker/replicas.h"

namespace ember::worker {
namespace {

namespace fs = std::filesystem;

// Two parameters of 2x3 and 1x5 floats, each with AdamW state; values a function of (seed, step, index).
class FakeState final : public TrainState {
 public:
  explicit FakeState(int seed) : seed_(seed) {
    for (auto& b : buf_) b.resize(11);
  }
  void Fill(int64_t step) {
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 11; ++i) buf_[k][i] = static_cast<float>(seed_ * 1e5 + step * 1000 + k * 100 + i) + 0.25f;
    opt_step_ = step;
  }
  absl::StatusOr<StepResult> Step(const kernels::ExecContext&, data::TokenLoader&, int64_t, float) override {
    return absl::UnimplementedError("not a real model");
  }
  std::vector<fsdp::ShardView> Shards() override {
    return {{"a", {2, 3}, 0, 2, 3, buf_[0].data(), buf_[1].data(), buf_[2].data(), true},
            {"b", {1, 5}, 0, 1, 5, buf_[0].data() + 6, buf_[1].data() + 6, buf_[2].data() + 6, true}};
  }
  int64_t optimizer_step() const override { return opt_step_; }
  void set_optimizer_step(int64_t s) override { opt_step_ = s; }
  int64_t state_bytes() const override { return 3 * 11 * 4; }
  std::pair<std::string, std::string> Layout() const override { return {"fsdp", "1"}; }
  absl::StatusOr<double> AllReduceMean(double v) override { return v; }
  const model::GptConfig& config() const override { return config_; }
  std::vector<float> buf_[3];

 private:
  const int seed_;
  int64_t opt_step_ = 0;
  model::GptConfig config_;
};

fs::path Base() {
  const char* tmp = getenv("TEST_TMPDIR");
  return fs::path(tmp != nullptr ? tmp : "/tmp") / absl::StrCat("xhost-", getpid());
}

std::shared_ptr<data::TokenFile> Tokens() {
  const std::string path = (Base() / "tokens.txt").string();
  fs::create_directories(Base());
  std::ofstream(path) << std::string(4096, 'x');
  return *data::TokenFile::Open(path, data::TokenDtype::kU8);
}

data::TokenLoader Loader(const std::shared_ptr<data::TokenFile>& f, int rank) {
  return data::TokenLoader(f, {.seq_len = 8, .batch = 2, .rank = rank, .world = 2, .seed = 3});
}

void Advance(data::TokenLoader& l) {
  int32_t tok[16], tgt[16];
  (void)l.Next(tok, tgt);
}

Replicas::Options Opts(const fs::path& dir, int rank, store::Client* attempt) {
  Replicas::Options o;
  o.dir = dir.string();
  o.rank = rank;
  o.world = 2;
  o.local_world = 1;  // one rank per host: two hosts
  o.attempt = attempt;
  o.timeout = absl::Seconds(20);
  return o;
}

Plan PlanFor(int rank) {
  Plan p;
  p.env.rank = rank;
  p.env.world_size = 2;
  p.env.local_world_size = 1;
  p.spec.set_collective_timeout_s(20);
  p.checkpoint_root = (Base() / "no-checkpoints").string();
  return p;
}

ssize_t WriteAll(int fd, const std::string& s) { return write(fd, s.data(), s.size()); }

std::string ReadLine(int fd) {
  std::string s;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') s.push_back(c);
  return s;
}

TEST_CASE("cross-host replicas: a torn put is never committed; a lost host's rank restores from its buddy's host") {
  setenv("UCX_TLS", "tcp", 1);
  const fs::path host_a = Base() / "host-a", host_b = Base() / "host-b", host_c = Base() / "host-c";
  std::shared_ptr<data::TokenFile> tokens = Tokens();
  // The child (rank 0, host A) is forked before this process starts any thread (store server,
  // agents); it gets the store's address through a pipe.
  int to_child[2], from_child[2];
  REQUIRE(pipe(to_child) == 0);
  REQUIRE(pipe(from_child) == 0);
  const pid_t child = fork();
  if (child == 0) {
    const std::string address = ReadLine(to_child[0]);
    auto client = store::Client::Connect({.address = address});
    if (!client.ok()) _exit(2);
    store::Client attempt = client->WithPrefix("attempt/1/");
    FakeState st(0);
    data::TokenLoader loader = Loader(tokens, 0);
    Replicas::Options o = Opts(host_a, 0, &attempt);
    o.test_hook = [&](const std::string& stage) {
      if (stage == "buddy" && st.optimizer_step() == 2) raise(SIGKILL);  // half of step 2's payload put
    };
    auto r = Replicas::Open(o, st);
    if (!r.ok()) _exit(3);
    Plan plan = PlanFor(0);
    auto at = ResumeFromReplicas(plan, attempt, **r, st, loader);
    if (!at.ok() || at->has_value()) _exit(4);  // nothing to resume from
    st.Fill(1);
    Advance(loader);
    if (!(*r)->Save(1, st, loader).ok() || !(*r)->Wait().ok()) _exit(5);
    (void)WriteAll(from_child[1], "saved\n");
    if (ReadLine(to_child[0]) != "go") _exit(6);
    st.Fill(2);
    Advance(loader);
    (void)(*r)->Save(2, st, loader);
    (void)(*r)->Wait();
    _exit(7);  // the hook did not fire
  }
  REQUIRE(child > 0);
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  REQUIRE(server.ok());
  REQUIRE(WriteAll(to_child[1], (*server)->address() + "\n") > 0);
  auto client = store::Client::Connect({.address = (*server)->address()});
  REQUIRE(client.ok());

  // What rank 0 saved at step 1, computed independently of the replica code.
  FakeState want(0);
  want.Fill(1);
  data::TokenLoader want_loader = Loader(tokens, 0);
  Advance(want_loader);

  std::string old_descriptor;
  {
    store::Client attempt = client->WithPrefix("attempt/1/");
    FakeState st(1);
    data::TokenLoader loader = Loader(tokens, 1);
    auto r = Replicas::Open(Opts(host_b, 1, &attempt), st);
    REQUIRE(r.ok());
    REQUIRE((*r)->cross_host());
    REQUIRE((*r)->held_for() == 0);
    Plan plan = PlanFor(1);
    auto at = ResumeFromReplicas(plan, attempt, **r, st, loader);
    REQUIRE(at.ok());
    REQUIRE(!at->has_value());
    st.Fill(1);
    Advance(loader);
    REQUIRE((*r)->Save(1, st, loader).ok());
    REQUIRE((*r)->Wait().ok());
    REQUIRE(ReadLine(from_child[0]) == "saved");
    REQUIRE(WriteAll(to_child[1], "go\n") > 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);

    // Host B's copy of rank 0: step 1 committed and intact; step 2's slot half written, not committed.
    auto dirfd = OpenReplicaDir(host_b.string());
    REQUIRE(dirfd.ok());
    auto held = ReplicaFile::OpenHeld(*dirfd, ReplicaFileName(0, 1));
    close(*dirfd);
    REQUIRE(held.ok());
    std::vector<ReplicaFile::Slot> raw = (*held)->RawCommitted();
    REQUIRE(raw.size() == 1);
    REQUIRE(raw[0].step == 1);
    REQUIRE((*held)->Committed().size() == 1);
    // The torn slot did receive part of step 2 (the kill was mid-put, not before it).
    const uint8_t* torn = (*held)->data(1 - raw[0].index);
    int64_t torn_step;
    std::memcpy(&torn_step, torn, 8);
    REQUIRE(torn_step == 2);
    auto desc = attempt.Get(job::keys::ReplicaHeldOf(0, 1));
    REQUIRE(desc.ok());
    old_descriptor = *desc;
  }

  // Attempt 2: rank 0 on host C (its host A lost: nothing of its own), rank 1 on host B.
  store::Client attempt = client->WithPrefix("attempt/2/");
  FakeState st0(0), st1(1);
  data::TokenLoader loader0 = Loader(tokens, 0), loader1 = Loader(tokens, 1);
  absl::StatusOr<std::unique_ptr<Replicas>> r0 = absl::UnknownError("not run"), r1 = absl::UnknownError("not run");
  absl::StatusOr<std::optional<int64_t>> at0 = absl::UnknownError("not run"), at1 = absl::UnknownError("not run");
  std::thread t0([&] {
    r0 = Replicas::Open(Opts(host_c, 0, &attempt), st0);
    if (r0.ok()) {
      Plan plan = PlanFor(0);
      at0 = ResumeFromReplicas(plan, attempt, **r0, st0, loader0);
    }
  });
  std::thread t1([&] {
    r1 = Replicas::Open(Opts(host_b, 1, &attempt), st1);
    if (r1.ok()) {
      Plan plan = PlanFor(1);
      at1 = ResumeFromReplicas(plan, attempt, **r1, st1, loader1);
    }
  });
  t0.join();
  t1.join();
  REQUIRE(r0.ok());
  REQUIRE(r1.ok());
  REQUIRE(at0.ok());
  REQUIRE(at1.ok());
  REQUIRE(*at0 == std::optional<int64_t>(1));
  REQUIRE(*at1 == std::optional<int64_t>(1));
  for (int k = 0; k < 3; ++k) {
    REQUIRE(std::memcmp(st0.buf_[k].data(), want.buf_[k].data(), 11 * sizeof(float)) == 0);
  }
  REQUIRE(st0.optimizer_step() == 1);
  REQUIRE(loader0.SaveState() == want_loader.SaveState());
  ReplicaCounts& c0 = (*r0)->counts();
  REQUIRE(c0.from_memory);
  REQUIRE(c0.from_network);
  REQUIRE(c0.network_bytes > 0);
  REQUIRE(c0.disk_checkpoint_reads == 0);
  REQUIRE(c0.resumed_step == 1);
  REQUIRE(!(*r1)->counts().from_network);  // rank 1 had its own
  // Rank 0's own file on host C now holds step 1 too (the pulled copy, committed there).
  REQUIRE((*r0)->Available() == std::vector<int64_t>{1});

  // Fencing: attempt 1's descriptor of the copy (its token) is refused by attempt 2's holder.
  {
    auto dirfd = OpenReplicaDir(host_b.string());
    REQUIRE(dirfd.ok());
    auto held = ReplicaFile::OpenHeld(*dirfd, ReplicaFileName(0, 1));
    close(*dirfd);
    REQUIRE(held.ok());
    const std::vector<uint8_t> before((*held)->base(), (*held)->base() + (*held)->file_bytes());
    absl::StatusOr<onesided::Connection*> c01 = absl::UnknownError("not run"), c10 = absl::UnknownError("not run");
    std::thread t([&] { c10 = (*r1)->agent()->Connect("replica0"); });
    c01 = (*r0)->agent()->Connect("replica1");
    t.join();
    REQUIRE(c01.ok());
    REQUIRE(c10.ok());
    auto stale = (*c01)->ImportRegion(old_descriptor);
    REQUIRE(stale.ok());
    std::vector<uint8_t> junk(4096, 0xAB);
    auto reg = (*r0)->agent()->RegisterMemory(junk.data(), junk.size());
    REQUIRE(reg.ok());
    const uint64_t refused = (*r1)->agent()->refused_puts();
    REQUIRE((*r0)->agent()->Put(*c01, {{reg->id, 0, 4096}}, {{*stale, 4096, 4096}}).Wait(absl::Seconds(10)).ok());
    REQUIRE((*r0)->agent()->Notify(*c01, "flush").Wait(absl::Seconds(10)).ok());
    for (int i = 0; i < 200 && (*r1)->agent()->refused_puts() == refused; ++i) absl::SleepFor(absl::Milliseconds(10));
    REQUIRE((*r1)->agent()->refused_puts() > refused);
    REQUIRE(std::memcmp(before.data(), (*held)->base(), before.size()) == 0);
    REQUIRE((*r0)->agent()->Deregister(reg->id).ok());
  }

  // Saves go on after the resume: step 2 reaches host B's copy, committed and intact.
  st0.Fill(2);
  Advance(loader0);
  st1.Fill(2);
  Advance(loader1);
  REQUIRE((*r0)->Save(2, st0, loader0).ok());
  REQUIRE((*r1)->Save(2, st1, loader1).ok());
  REQUIRE((*r0)->Wait().ok());
  REQUIRE((*r1)->Wait().ok());
  auto dirfd = OpenReplicaDir(host_b.string());
  REQUIRE(dirfd.ok());
  auto held = ReplicaFile::OpenHeld(*dirfd, ReplicaFileName(0, 1));
  close(*dirfd);
  REQUIRE(held.ok());
  std::vector<ReplicaFile::Slot> committed = (*held)->Committed();
  REQUIRE(committed.size() == 2);
  REQUIRE(committed[0].step == 2);
  REQUIRE(committed[1].step == 1);
  r0->reset();
  r1->reset();

  // Attempt 3: both hosts lost (two new, empty directories): rank 0's state is nowhere in memory;
  // both ranks fall back to disk checkpoints (nullopt) and restore nothing.
  {
    store::Client attempt3 = client->WithPrefix("attempt/3/");
    FakeState a(0), b(1);
    a.Fill(7);
    b.Fill(7);
    data::TokenLoader la = Loader(tokens, 0), lb = Loader(tokens, 1);
    absl::StatusOr<std::optional<int64_t>> x0 = absl::UnknownError("not run"), x1 = absl::UnknownError("not run");
    absl::StatusOr<std::unique_ptr<Replicas>> q0 = absl::UnknownError("not run"), q1 = absl::UnknownError("not run");
    std::thread u0([&] {
      q0 = Replicas::Open(Opts(Base() / "host-d", 0, &attempt3), a);
      if (q0.ok()) {
        Plan plan = PlanFor(0);
        x0 = ResumeFromReplicas(plan, attempt3, **q0, a, la);
      }
    });
    std::thread u1([&] {
      q1 = Replicas::Open(Opts(Base() / "host-e", 1, &attempt3), b);
      if (q1.ok()) {
        Plan plan = PlanFor(1);
        x1 = ResumeFromReplicas(plan, attempt3, **q1, b, lb);
      }
    });
    u0.join();
    u1.join();
    REQUIRE(x0.ok());
    REQUIRE(x1.ok());
    REQUIRE(!x0->has_value());
    REQUIRE(!x1->has_value());
    REQUIRE(a.optimizer_step() == 7);  // untouched
    REQUIRE(!(*q0)->counts().from_memory);
  }
  unsetenv("UCX_TLS");
}

}  // namespace
}  // namespace ember::worker
