// In-memory replicas (replicas.h, replica_file.h) against their contract, with a small hand-made
// TrainState (two shards of known values) and real files in a private directory:
//   * a process killed with -9 halfway through the buddy copy (or its own copy) leaves the commit
//     record of that copy at the previous step, whose bytes are intact: the commit is written
//     after the transfer, never before;
//   * Restore brings back exactly the values saved at a step (own copy, or the buddy's when the own
//     file is gone), the optimizer step and the loader position;
//   * a torn slot (bytes changed after the commit) is not offered; another layout is not restored;
//   * the directory checks refuse a symlink and a directory writable by others.
#include "runtime/worker/replicas.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

namespace ember::worker {
namespace {

namespace fs = std::filesystem;

// Two parameters of 2x3 and 1x5 floats, each with AdamW state; values a function of (step, index).
class FakeState final : public TrainState {
 public:
  FakeState() {
    for (auto& b : buf_) b.resize(11);
  }
  void Fill(int64_t step) {
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 11; ++i) buf_[k][i] = static_cast<float>(step * 1000 + k * 100 + i);
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
  int64_t opt_step_ = 0;
  model::GptConfig config_;
};

struct Fixture {
  Fixture() {
    const char* tmp = getenv("TEST_TMPDIR");
    dir = fs::path(tmp != nullptr ? tmp : "/tmp") / absl::StrCat("replicas-", getpid(), "-", counter++);
    fs::create_directories(dir.parent_path());
    const std::string text(4096, 'x');
    std::ofstream(dir.string() + ".txt") << text;
    file = *data::TokenFile::Open(dir.string() + ".txt", data::TokenDtype::kU8);
  }
  data::TokenLoader Loader() { return data::TokenLoader(file, {.seq_len = 8, .batch = 2, .rank = 0, .world = 2, .seed = 3}); }
  Replicas::Options Opts(int rank = 0) {
    Replicas::Options o;
    o.dir = dir.string();
    o.rank = rank;
    o.world = 2;
    o.local_world = 2;
    return o;
  }
  fs::path dir;
  std::shared_ptr<data::TokenFile> file;
  static inline int counter = 0;
};

// Runs `body` in a child process and returns how it ended (the signal, or 0 for a clean exit).
template <typename F>
int InChild(F body) {
  pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}

// Saves steps 1 and 2 in a child killed with -9 halfway through `stage`'s copy of step 2.
void SaveAndDieDuring(Fixture& f, const std::string& stage) {
  const int sig = InChild([&] {
    FakeState st;
    data::TokenLoader loader = f.Loader();
    Replicas::Options o = f.Opts();
    o.test_hook = [&](const std::string& s) {
      if (s == stage && st.optimizer_step() == 2) raise(SIGKILL);
    };
    auto r = Replicas::Open(o, st);
    if (!r.ok()) _exit(3);
    int32_t tok[16], tgt[16];
    st.Fill(1);
    (void)loader.Next(tok, tgt);
    if (!(*r)->Save(1, st, loader).ok() || !(*r)->Wait().ok()) _exit(4);
    st.Fill(2);
    (void)loader.Next(tok, tgt);
    (void)(*r)->Save(2, st, loader);
    (void)(*r)->Wait();
    _exit(5);  // the hook did not fire
  });
  REQUIRE(sig == SIGKILL);
}

uint64_t FingerprintOf(Fixture& f) {
  // The fingerprint is internal; read the header's field (offset 24) of the own file.
  std::ifstream in(f.dir / ReplicaFileName(0, -1), std::ios::binary);
  char h[32];
  in.read(h, 32);
  uint64_t fp;
  std::memcpy(&fp, h + 24, 8);
  return fp;
}

TEST_CASE("killed mid buddy copy: the buddy's commit record still names the previous step") {
  Fixture f;
  SaveAndDieDuring(f, "buddy");
  const int64_t payload = 4096 + 3 * 11 * 4;
  auto dirfd = OpenReplicaDir(f.dir.string());
  REQUIRE(dirfd.ok());
  const uint64_t fp = FingerprintOf(f);
  auto own = ReplicaFile::OpenExisting(*dirfd, ReplicaFileName(0, -1), payload, fp);
  auto buddy = ReplicaFile::OpenExisting(*dirfd, ReplicaFileName(0, 1), payload, fp);
  REQUIRE(own.ok());
  REQUIRE(buddy.ok());
  // Own copy of step 2 completed and committed before the transfer began.
  REQUIRE((*own)->RawCommitted().size() == 2);
  REQUIRE((*own)->RawCommitted()[0].step == 2);
  // The buddy's copy of step 2 was half done: its record must not claim it (commit after transfer).
  const auto raw = (*buddy)->RawCommitted();
  REQUIRE(!raw.empty());
  REQUIRE(raw[0].step == 1);
  REQUIRE((*buddy)->Committed().size() == 1);
  close(*dirfd);

  // The restarted rank, its own file lost: it restores step 1 from the buddy's copy, exactly.
  fs::remove(f.dir / ReplicaFileName(0, -1));
  FakeState st;
  data::TokenLoader loader = f.Loader();
  auto r = Replicas::Open(f.Opts(), st);
  REQUIRE(r.ok());
  REQUIRE((*r)->Available() == std::vector<int64_t>{1});
  auto from = (*r)->Restore(1, st, loader);
  REQUIRE(from.ok());
  REQUIRE(absl::StrContains(*from, "buddy rank 1"));
  FakeState want;
  want.Fill(1);
  for (int k = 0; k < 3; ++k) REQUIRE(st.buf_[k] == want.buf_[k]);
  REQUIRE(st.optimizer_step() == 1);
  REQUIRE(loader.position() == 4);  // one Next: batch 2 x world 2 sequences
  REQUIRE(!(*r)->Restore(2, st, loader).ok());
}

TEST_CASE("killed mid own copy: the own file's newest commit is the previous step") {
  Fixture f;
  SaveAndDieDuring(f, "own");
  FakeState st;
  data::TokenLoader loader = f.Loader();
  auto r = Replicas::Open(f.Opts(), st);
  REQUIRE(r.ok());
  // Step 1 in both copies; step 2 in neither (the own copy died half-written, nothing transferred).
  REQUIRE((*r)->Available() == std::vector<int64_t>{1});
  auto from = (*r)->Restore(1, st, loader);
  REQUIRE(from.ok());
  REQUIRE(*from == "own");
  FakeState want;
  want.Fill(1);
  for (int k = 0; k < 3; ++k) REQUIRE(st.buf_[k] == want.buf_[k]);
}

TEST_CASE("both steps kept (double buffering); a torn slot and another layout are not restored") {
  Fixture f;
  FakeState st;
  data::TokenLoader loader = f.Loader();
  {
    auto r = Replicas::Open(f.Opts(), st);
    REQUIRE(r.ok());
    for (int s = 1; s <= 3; ++s) {
      st.Fill(s);
      REQUIRE((*r)->Save(s, st, loader).ok());
    }
    REQUIRE((*r)->Wait().ok());
    REQUIRE((*r)->counts().committed_step == 3);
    REQUIRE((*r)->Available() == std::vector<int64_t>{3, 2});
    REQUIRE((*r)->counts().memory_bytes == 2 * (4096 + 2 * 8192));
  }
  // Flip one byte of the own file's step-3 slot: the own copy of 3 fails its checksum, the
  // buddy's still verifies.
  {
    std::fstream io(f.dir / ReplicaFileName(0, -1), std::ios::in | std::ios::out | std::ios::binary);
    // Step 3 went to slot 0 (1 -> 0, 2 -> 1, 3 -> 0); its shard bytes start at 4096 + 4096.
    io.seekp(4096 + 4096 + 5);
    io.put('\x7f');
  }
  FakeState back;
  auto r = Replicas::Open(f.Opts(), back);
  REQUIRE(r.ok());
  auto from = (*r)->Restore(3, back, loader);
  REQUIRE(from.ok());
  REQUIRE(absl::StrContains(*from, "buddy"));
  FakeState want;
  want.Fill(3);
  for (int k = 0; k < 3; ++k) REQUIRE(back.buf_[k] == want.buf_[k]);
  r->reset();
  // Rank 1's files are not rank 0's: opening as another world size re-creates the files empty.
  Replicas::Options other = f.Opts();
  other.world = 4;
  other.local_world = 4;
  auto r4 = Replicas::Open(other, back);
  REQUIRE(r4.ok());
  REQUIRE((*r4)->Available().empty());
}

TEST_CASE("a 3-slot file (own file across hosts) keeps the newest three steps; another slot count is re-created") {
  Fixture f;
  auto dirfd = OpenReplicaDir(f.dir.string());
  REQUIRE(dirfd.ok());
  const int64_t payload = 5000;
  {
    auto file = ReplicaFile::Open(*dirfd, "three", payload, 42, nullptr, 3);
    REQUIRE(file.ok());
    REQUIRE((*file)->slots() == 3);
    for (int64_t step = 1; step <= 5; ++step) {
      const int slot = (*file)->BeginWrite();
      std::memset((*file)->slot(slot), static_cast<int>(step), payload);
      (*file)->Commit(slot, step, ReplicaChecksum((*file)->slot(slot), payload));
    }
    std::vector<int64_t> steps;
    for (const auto& s : (*file)->Committed()) steps.push_back(s.step);
    REQUIRE(steps == std::vector<int64_t>{5, 4, 3});
    for (const auto& s : (*file)->Committed()) REQUIRE((*file)->slot(s.index)[payload - 1] == s.step);
  }
  // Reopened read-only: the slot count comes from the header.
  auto again = ReplicaFile::OpenExisting(*dirfd, "three", payload, 42);
  REQUIRE(again.ok());
  REQUIRE((*again)->Committed().size() == 3);
  again->reset();
  bool reset = false;
  auto two = ReplicaFile::Open(*dirfd, "three", payload, 42, &reset, 2);
  REQUIRE(two.ok());
  REQUIRE(reset);
  REQUIRE((*two)->Committed().empty());
  close(*dirfd);
}

TEST_CASE("the replica directory: no symlinks, not writable by others, 0700") {
  Fixture f;
  fs::create_directories(f.dir);
  chmod(f.dir.c_str(), 0700);
  auto ok = OpenReplicaDir((f.dir / "job").string());
  REQUIRE(ok.ok());
  close(*ok);
  struct stat st;
  REQUIRE(stat((f.dir / "job").c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0700);
  fs::create_directory_symlink(f.dir / "job", f.dir / "link");
  REQUIRE(!OpenReplicaDir((f.dir / "link").string()).ok());
  fs::create_directories(f.dir / "open");
  chmod((f.dir / "open").c_str(), 0777);
  auto bad = OpenReplicaDir((f.dir / "open" / "job").string());
  REQUIRE(!bad.ok());
  REQUIRE(absl::StrContains(bad.status().message(), "writable by group or others without the sticky bit"));
  chmod((f.dir / "job").c_str(), 0750);
  bad = OpenReplicaDir((f.dir / "job").string());
  REQUIRE(!bad.ok());
  REQUIRE(absl::StrContains(bad.status().message(), "must be mode 0700"));
  chmod((f.dir / "job").c_str(), 0700);
  REQUIRE(!OpenReplicaDir("relative/dir").ok());
  REQUIRE(!OpenReplicaDir((f.dir / ".." / "x").string()).ok());
  // A replica file that is a symlink is refused, not followed.
  auto dirfd = OpenReplicaDir((f.dir / "job").string());
  REQUIRE(dirfd.ok());
  fs::create_symlink("/etc/passwd", f.dir / "job" / "rank-0.own");
  REQUIRE(!ReplicaFile::Open(*dirfd, "rank-0.own", 100, 1).ok());
  REQUIRE(!ReplicaFile::Open(*dirfd, "../x", 100, 1).ok());
  close(*dirfd);
}

// Last in this file: it starts a store server (gRPC threads), and the tests above fork.
TEST_CASE("the agreement: the newest step every rank holds, and the newest disk step any rank sees") {
  auto server = store::StoreServer::Start({});
  REQUIRE(server.ok());
  auto client = store::Client::Connect({.address = (*server)->address()});
  REQUIRE(client.ok());
  // Three ranks, each in its own thread (AgreeReplicaStep waits for every rank's key).
  auto agree = [&](const std::string& prefix, std::vector<std::vector<int64_t>> steps, std::vector<int64_t> disk,
                   std::vector<std::map<int, std::vector<int64_t>>> held = {{}, {}, {}}) {
    std::vector<absl::StatusOr<ReplicaAgreement>> out(3, absl::UnknownError("not run"));
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) {
      ts.emplace_back([&, r] {
        store::Client attempt = client->WithPrefix(prefix);
        out[r] = AgreeReplicaStep(attempt, r, 3, steps[r], disk[r], absl::Seconds(10), held[r]);
      });
    }
    for (auto& t : ts) t.join();
    for (int r = 1; r < 3; ++r) {
      REQUIRE(out[r].ok());
      REQUIRE(out[r]->step == out[0]->step);
      REQUIRE(out[r]->disk_step == out[0]->disk_step);
      REQUIRE(out[r]->pull_from == out[0]->pull_from);
    }
    REQUIRE(out[0].ok());
    return *out[0];
  };
  // Rank 2 was killed before committing step 5: everyone resumes at 4.
  ReplicaAgreement a = agree("a/", {{5, 4}, {5, 4}, {4, 3}}, {0, 0, 0});
  REQUIRE(a.step == 4);
  REQUIRE(a.disk_step == 0);
  // Only rank 1 sees the disk checkpoint of step 6: every rank learns it (and takes the disk path).
  a = agree("b/", {{5, 4}, {5, 4}, {5, 4}}, {0, 6, 0});
  REQUIRE(a.step == 5);
  REQUIRE(a.disk_step == 6);
  // A rank with no replica (its files lost): no common step.
  a = agree("c/", {{5, 4}, {}, {5, 4}}, {2, 2, 2});
  REQUIRE(a.step == -1);
  REQUIRE(a.pull_from.empty());
  // Cross-host: rank 1's own file is gone (its host was lost), ranks 2 and 0 hold copies of it;
  // step 5 counts for rank 1, pulled from the lowest holder that has it (rank 2: rank 0's copy
  // stopped at 4). Ranks 0 and 2 restore their own.
  a = agree("d/", {{5, 4}, {}, {5, 4}}, {0, 0, 0}, {{{1, {4, 3}}}, {}, {{1, {5, 4}}, {0, {5}}}});
  REQUIRE(a.step == 5);
  REQUIRE(a.pull_from == std::map<int, int>{{1, 2}});
  // Rank 0 committed step 6 only in the copy rank 1 holds (its own file lost it): 6, pulled from
  // rank 1. Then the same with rank 2 stopped at 5 (nobody holds its 6): 5, nothing to pull.
  a = agree("e/", {{5}, {6, 5}, {6, 5}}, {0, 0, 0}, {{}, {{0, {6}}}, {}});
  REQUIRE(a.step == 6);
  REQUIRE(a.pull_from == std::map<int, int>{{0, 1}});
  a = agree("f/", {{5}, {6, 5}, {5}}, {0, 0, 0}, {{}, {{0, {6}}}, {}});
  REQUIRE(a.step == 5);
  REQUIRE(a.pull_from.empty());
}

}  // namespace
}  // namespace ember::worker
