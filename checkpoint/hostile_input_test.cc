// Damaged and hostile checkpoint inputs (issue 12): a garbage `latest`, metadata.json claiming
// chunks far larger than the files (checked in a child process under a small address-space limit,
// so an allocation sized by the claim fails the test instead of swapping the machine), FIFOs and
// devices given as inputs (an alarm turns a hang into a failure).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/test_util.h"
#include "checkpoint/tools.h"

namespace ember::ckpt {
namespace {

using testing::MakeModel;
using testing::ShardState;
using testing::TmpDir;

void Save(const std::string& root, int64_t step, int keep_last = 3) {
  LocalCommitProtocol protocol;
  auto model = MakeModel(step);
  absl::Status s = SaveCheckpoint({.root = root, .keep_last = keep_last}, ShardState(model, step, 0, 1),
                                  &protocol);
  INFO(s.ToString());
  REQUIRE(s.ok());
}

void FlipByte(const std::string& path, size_t from_end) {
  std::string bytes = *ReadFile(path, 1 << 20);
  bytes[bytes.size() - from_end] ^= 0x01;
  REQUIRE(base::WriteFileAtomic(path, bytes).ok());
}

// Runs `body` in a forked child with RLIMIT_AS = `as_bytes` and a 60 s alarm; returns its exit
// code, or -signal. The child's Catch2 state is not used: it reports through the exit code only.
int InChild(rlim_t as_bytes, const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit rl = {as_bytes, as_bytes};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(100);
    alarm(60);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::vector<std::string> Superseded(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    std::string n = e.path().filename();
    if (absl::StartsWith(n, ".superseded-step-")) out.push_back(n);
  }
  return out;
}

TEST_CASE("a damaged latest falls back to the newest checkpoint that verifies", "[checkpoint][resume]") {
  const std::string root = TmpDir("resume_latest");
  for (int64_t step : {10, 20, 30}) Save(root, step);
  REQUIRE(*FindResumeCheckpoint(root) == root + "/step-30");
  for (const char* bad : {"", "\n", "garbage\n", "step-\n", "step-99\n", "../../etc\n"}) {
    INFO("latest = \"" << bad << "\"");
    REQUIRE(base::WriteFileAtomic(root + "/latest", bad).ok());
    auto r = FindResumeCheckpoint(root);
    REQUIRE(r.ok());
    CHECK(*r == root + "/step-30");
  }
  // The newest step is damaged too: the next one down that verifies.
  FlipByte(root + "/step-30/rank-00000.safetensors", 40);
  auto r = FindResumeCheckpoint(root);
  REQUIRE(r.ok());
  CHECK(*r == root + "/step-20");
  ::unlink((root + "/latest").c_str());  // no latest at all (lost in a crash): the same
  CHECK(*FindResumeCheckpoint(root) == root + "/step-20");
}

TEST_CASE("a resumed run never deletes checkpoints newer than the one it resumed from",
          "[checkpoint][resume]") {
  const std::string root = TmpDir("resume_keep");
  for (int64_t step : {10, 20, 30}) Save(root, step);
  FlipByte(root + "/step-30/rank-00000.safetensors", 40);
  const std::string damaged = *ReadFile(root + "/step-30/rank-00000.safetensors", 1 << 20);
  REQUIRE(base::WriteFileAtomic(root + "/latest", "garbage").ok());
  REQUIRE(*FindResumeCheckpoint(root) == root + "/step-20");
  // The run goes on from 20 with keep_last 1: step 30 (newer, not written by this run) stays.
  Save(root, 25, /*keep_last=*/1);
  CHECK(ListSteps(root) == std::vector<int64_t>{25, 30});
  // Saving step 30 again moves the old directory aside instead of deleting it.
  Save(root, 30, /*keep_last=*/1);
  CHECK(ListSteps(root) == std::vector<int64_t>{30});
  auto aside = Superseded(root);
  REQUIRE(aside.size() == 1);
  CHECK(*ReadFile(root + "/" + aside[0] + "/rank-00000.safetensors", 1 << 20) == damaged);
  auto reader = CheckpointReader::Open(root);
  REQUIRE(reader.ok());
  CHECK((*reader)->VerifyAll().ok());
}

TEST_CASE("when no checkpoint verifies, resume fails and deletes nothing", "[checkpoint][resume]") {
  const std::string root = TmpDir("resume_none");
  Save(root, 5);
  FlipByte(root + "/step-5/rank-00000.safetensors", 40);
  REQUIRE(base::WriteFileAtomic(root + "/latest", "junk").ok());
  auto r = FindResumeCheckpoint(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(r.status().message(), "checksum mismatch"));
  CHECK(absl::StrContains(r.status().message(), "Nothing was deleted"));
  CHECK(ListSteps(root) == std::vector<int64_t>{5});
  // A root with no step at all is a fresh start, whatever `latest` says.
  const std::string empty = TmpDir("resume_empty");
  REQUIRE(base::WriteFileAtomic(empty + "/latest", "junk").ok());
  CHECK(absl::IsNotFound(FindResumeCheckpoint(empty).status()));
}

// metadata.json is rewritten to claim one 16 GiB chunk in a file of a few KB. Before the fix,
// export allocated the whole claimed size (22.8 GB RSS); under a 1 GiB address-space limit that
// allocation aborts the child.
TEST_CASE("a crafted metadata.json claiming 16 GiB fails fast in bounded memory", "[checkpoint][limits]") {
  const std::string root = TmpDir("huge_claim");
  Save(root, 1);
  const std::string dir = root + "/step-1";
  auto meta = ParseMetadata(*ReadFile(dir + "/metadata.json", 1 << 20));
  REQUIRE(meta.ok());
  constexpr int64_t k16G = int64_t{16} << 30;
  meta->files = {{"rank-00000.safetensors", static_cast<uint64_t>(k16G) + 4096}};
  meta->tensors = {{"big", DType::kU8, {k16G}, {}}};
  meta->tensors[0].chunks.push_back(
      {"rank-00000.safetensors", 0, static_cast<uint64_t>(k16G), 0, k16G, 0x0123456789abcdefull});
  meta->ranks.clear();
  const std::string text = SerializeMetadata(*meta);
  REQUIRE(text.size() < 4096);
  REQUIRE(base::WriteFileAtomic(dir + "/metadata.json", text).ok());

  int code = InChild(rlim_t{1} << 30, [&] {
    auto exported = ExportSafetensors(dir, root + "/out.safetensors");
    fprintf(stderr, "export: %s\n", exported.status().ToString().c_str());
    if (exported.ok() || exported.status().code() != absl::StatusCode::kDataLoss) return 1;
    if (!absl::StrContains(exported.status().message(), "rank-00000.safetensors is truncated")) return 2;
    if (PathExists(root + "/out.safetensors") || PathExists(root + "/out.safetensors.tmp")) return 3;
    auto report = InspectCheckpoint(dir, {.verify = true});
    if (!report.ok() || report->checks.code() != absl::StatusCode::kDataLoss) return 4;
    auto reader = CheckpointReader::Open(dir);
    if (!reader.ok()) return 5;
    auto rows = (*reader)->ReadFull("big");
    if (rows.ok() || !absl::StrContains(rows.status().message(), "truncated")) return 6;
    return 0;
  });
  CHECK(code == 0);
}

// Many chunks naming the same bytes would let a small file back a huge tensor (and a huge
// allocation in ReadFull): chunks must not overlap.
TEST_CASE("metadata whose chunks overlap is refused", "[checkpoint][limits]") {
  const std::string root = TmpDir("overlap");
  Save(root, 1);
  auto meta = ParseMetadata(*ReadFile(root + "/step-1/metadata.json", 1 << 20));
  REQUIRE(meta.ok());
  TensorMeta* t = nullptr;
  for (TensorMeta& x : meta->tensors) {
    if (x.name == "embed.weight") t = &x;
  }
  REQUIRE(t != nullptr);
  REQUIRE(t->chunks.size() == 1);
  // 1000 copies of the same 10-row chunk claim a 10,000-row tensor.
  const ChunkRef c = t->chunks[0];
  t->shape[0] = 1000 * c.rows;
  t->chunks.clear();
  for (int64_t i = 0; i < 1000; ++i) {
    ChunkRef d = c;
    d.row_begin = i * c.rows;
    t->chunks.push_back(d);
  }
  auto parsed = ParseMetadata(SerializeMetadata(*meta));
  REQUIRE_FALSE(parsed.ok());
  CHECK(absl::StrContains(parsed.status().message(), "overlap"));
}

// A 768 MiB (sparse) data file whose metadata is honest: verification streams it in bounded
// pieces, so it passes under a 512 MiB address-space limit (mapping the whole file could not).
TEST_CASE("verify streams large chunks in bounded memory", "[checkpoint][limits]") {
  const std::string root = TmpDir("big_sparse");
  Save(root, 1);
  const std::string dir = root + "/step-1";
  constexpr int64_t kBig = int64_t{768} << 20;
  {
    int fd = ::open((dir + "/big.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, kBig) == 0);
    ::close(fd);
  }
  Xxh3Stream zeros;
  const std::string block(4 << 20, '\0');
  for (int64_t done = 0; done < kBig; done += block.size()) zeros.Update(block);
  auto meta = ParseMetadata(*ReadFile(dir + "/metadata.json", 1 << 20));
  REQUIRE(meta.ok());
  meta->files.push_back({"big.bin", static_cast<uint64_t>(kBig)});
  TensorMeta big{"big", DType::kU8, {kBig}, {}};
  big.chunks.push_back({"big.bin", 0, static_cast<uint64_t>(kBig), 0, kBig, zeros.Digest()});
  meta->tensors.push_back(big);
  std::sort(meta->tensors.begin(), meta->tensors.end(),
            [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  REQUIRE(base::WriteFileAtomic(dir + "/metadata.json", SerializeMetadata(*meta)).ok());

  int code = InChild(rlim_t{512} << 20, [&] {
    auto reader = CheckpointReader::Open(dir);
    if (!reader.ok()) return 1;
    absl::Status v = (*reader)->VerifyAll();
    if (!v.ok()) {
      fprintf(stderr, "%s\n", v.ToString().c_str());
      return 2;
    }
    return 0;
  });
  CHECK(code == 0);
}

// open(2) of a FIFO without a writer blocks forever; reading a device never ends.
TEST_CASE("a FIFO or a device as input is refused at once", "[checkpoint][limits]") {
  const std::string root = TmpDir("fifo");
  Save(root, 1);
  alarm(30);
  const std::string fifo = root + "/in.safetensors";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  auto st = InspectCheckpoint(fifo);
  REQUIRE_FALSE(st.ok());
  CHECK(absl::StrContains(st.status().message(), "is a FIFO"));
  // metadata.json, latest and a data file replaced by FIFOs or a device.
  const std::string dir = root + "/step-1";
  const std::string data = dir + "/rank-00000.safetensors";
  REQUIRE(::rename(data.c_str(), (data + ".real").c_str()) == 0);
  REQUIRE(mkfifo(data.c_str(), 0600) == 0);
  auto exported = ExportSafetensors(dir, root + "/out.safetensors");
  REQUIRE_FALSE(exported.ok());
  CHECK(absl::StrContains(exported.status().message(), "is a FIFO"));
  auto report = InspectCheckpoint(dir, {.verify = true});
  REQUIRE(report.ok());
  CHECK(absl::StrContains(report->checks.message(), "is a FIFO"));
  REQUIRE(::rename((dir + "/metadata.json").c_str(), (dir + "/metadata.json.real").c_str()) == 0);
  REQUIRE(mkfifo((dir + "/metadata.json").c_str(), 0600) == 0);
  CHECK(absl::StrContains(InspectCheckpoint(dir).status().message(), "is a FIFO"));
  ::unlink((root + "/latest").c_str());
  REQUIRE(::symlink("/dev/zero", (root + "/latest").c_str()) == 0);
  CHECK(absl::StrContains(ResolveLatest(root).status().message(), "character device"));
  alarm(0);
}

}  // namespace
}  // namespace ember::ckpt
