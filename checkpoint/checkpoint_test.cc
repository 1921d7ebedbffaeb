#include "checkpoint/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include <catch2/catch.hpp>

#include <set>

#include "absl/strings/match.h"
#include "runtime/base/json.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/fuzz_targets.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_util.h"
#include "checkpoint/tools.h"

namespace ember::ckpt {
namespace {

using testing::GlobalTensor;
using testing::MakeModel;
using testing::Rows;
using testing::ShardState;
using testing::TmpDir;

// Saves `model` at `world` ranks (threads sharing one LocalCommitProtocol). Returns each rank's status.
std::vector<absl::Status> SaveWorld(const std::string& root, const std::vector<GlobalTensor>& model,
                                    int64_t step, int world, int keep_last = 3,
                                    int broken_rank = -1) {
  LocalCommitProtocol protocol;
  std::vector<absl::Status> out(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      RankState st = ShardState(model, step, r, world);
      if (r == broken_rank) st.tensors[0].data = st.tensors[0].data.substr(1);  // not whole rows
      out[r] = SaveCheckpoint({.root = root, .rank = r, .world_size = world, .keep_last = keep_last,
                               .commit_timeout = absl::Seconds(20)},
                              st, &protocol);
    });
  }
  for (auto& t : ts) t.join();
  return out;
}

std::vector<std::string> ListDirForTest(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  return out;
}

void RequireAllOk(const std::vector<absl::Status>& v) {
  for (const auto& s : v) {
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
}

TEST_CASE("round trip is bitwise, with step, rng, data loader, extras", "[checkpoint]") {
  std::string root = TmpDir("rt");
  auto model = MakeModel(7);
  RequireAllOk(SaveWorld(root, model, 7, 1));
  auto r = CheckpointReader::Open(root);
  REQUIRE(r.ok());
  const Metadata& m = (*r)->metadata();
  CHECK(m.step == 7);
  CHECK(m.world_size == 1);
  CHECK(m.extra.at("model") == "tiny-gpt");
  CHECK(m.parallelism.at("fsdp") == "1");
  for (const GlobalTensor& t : model) {
    auto full = (*r)->ReadFull(t.name);
    REQUIRE(full.ok());
    CHECK(*full == t.bytes);
  }
  CHECK(*(*r)->ReadBlob(0, "rng") == ShardState(model, 7, 0, 1).rng_state);
  CHECK(*(*r)->ReadBlob(0, "data_loader") == "sample=7000");
  CHECK((*r)->VerifyAll().ok());
  CHECK(*ResolveLatest(root) == root + "/step-7");
  // Every data file is itself a valid safetensors file.
  auto st = SafetensorsFile::Open(root + "/step-7/rank-00000.safetensors");
  REQUIRE(st.ok());
  CHECK((*st)->Data(*(*st)->Find("embed.weight")) == model[0].bytes);
}

TEST_CASE("reshard on load: 4 -> 2, 2 -> 3, 1 -> 4, 3 -> 1", "[checkpoint]") {
  std::pair<int, int> cases[] = {{4, 2}, {2, 3}, {1, 4}, {3, 1}, {4, 7}};
  for (auto [n, m] : cases) {
    INFO(n << " -> " << m);
    std::string root = TmpDir(absl::StrCat("reshard", n, "_", m));
    auto model = MakeModel(3, 2);
    RequireAllOk(SaveWorld(root, model, 3, n));
    auto r = CheckpointReader::Open(root);
    REQUIRE(r.ok());
    CHECK((*r)->metadata().world_size == n);
    for (const GlobalTensor& t : model) {
      std::string assembled;
      for (int rank = 0; rank < m; ++rank) {
        auto shard = (*r)->ReadShard(t.name, rank, m);
        REQUIRE(shard.ok());
        auto [b, e] = ShardRows(t.shape[0], rank, m);
        CHECK(*shard == Rows(t, b, e));
        assembled += *shard;
      }
      CHECK(assembled == t.bytes);
    }
    // Every saving rank's RNG and data-loader state is there for the new ranks to use.
    for (int rank = 0; rank < n; ++rank) {
      CHECK(*(*r)->ReadBlob(rank, "data_loader") == absl::StrCat("sample=", 3000 + rank));
    }
  }
}

TEST_CASE("dtype conversion on load: f32 <-> bf16, round to nearest even", "[checkpoint]") {
  CHECK(base::F32ToBf16(1.0f) == 0x3f80);
  float halfway;  // 1 + 2^-8: exactly between two bf16 values; ties to even (down)
  uint32_t u = 0x3f808000;
  std::memcpy(&halfway, &u, 4);
  CHECK(base::F32ToBf16(halfway) == 0x3f80);
  u = 0x3f818000;  // odd mantissa, tie: rounds up to even
  std::memcpy(&halfway, &u, 4);
  CHECK(base::F32ToBf16(halfway) == 0x3f82);
  u = 0x3f808001;
  std::memcpy(&halfway, &u, 4);
  CHECK(base::F32ToBf16(halfway) == 0x3f81);
  CHECK((base::F32ToBf16(std::nanf("")) & 0x7fc0) == 0x7fc0);

  std::string root = TmpDir("conv");
  auto model = MakeModel(1);
  RequireAllOk(SaveWorld(root, model, 1, 2));
  auto r = CheckpointReader::Open(root);
  REQUIRE(r.ok());
  auto bf = (*r)->ReadShard("embed.weight", 1, 3, DType::kBF16);
  REQUIRE(bf.ok());
  auto f32 = (*r)->ReadShard("embed.weight", 1, 3);
  REQUIRE(f32.ok());
  REQUIRE(bf->size() * 2 == f32->size());
  for (size_t i = 0; i < bf->size() / 2; ++i) {
    float f;
    uint16_t b;
    std::memcpy(&f, &(*f32)[i * 4], 4);
    std::memcpy(&b, &(*bf)[i * 2], 2);
    CHECK(b == base::F32ToBf16(f));
  }
  auto up = (*r)->ReadFull("layer0.w", DType::kF32);  // bf16 -> f32 is exact
  REQUIRE(up.ok());
  CHECK(up->size() == model[1].bytes.size() * 2);
  CHECK_FALSE((*r)->ReadFull("counts", DType::kF32).ok());
}

TEST_CASE("flipped byte, truncated and missing files are named", "[checkpoint]") {
  std::string root = TmpDir("corrupt");
  auto model = MakeModel(5);
  RequireAllOk(SaveWorld(root, model, 5, 2));
  std::string dir = root + "/step-5";
  auto r0 = CheckpointReader::Open(dir);
  REQUIRE(r0.ok());
  const TensorMeta* t = (*r0)->metadata().Find("embed.weight");
  const ChunkRef& c1 = t->chunks[1];  // rank 1's chunk
  {
    std::string path = dir + "/" + c1.file;
    std::string bytes = *ReadFile(path, 1 << 20);
    bytes[c1.offset + 3] ^= 0x10;
    REQUIRE(base::WriteFileAtomic(path, bytes).ok());
  }
  auto r = CheckpointReader::Open(dir);
  REQUIRE(r.ok());
  auto bad = (*r)->ReadShard("embed.weight", 1, 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(bad.status().message(), "tensor \"embed.weight\" chunk 1"));
  CHECK(absl::StrContains(bad.status().message(), "rank-00001.safetensors"));
  CHECK(absl::StrContains(bad.status().message(), "checksum mismatch"));
  CHECK((*r)->ReadShard("embed.weight", 0, 2).ok());  // rank 0's rows are intact
  auto all = (*r)->VerifyAll();
  CHECK(absl::StrContains(all.message(), "1 bad chunk"));

  // Truncate rank 0's file: every chunk in it is named.
  REQUIRE(::truncate((dir + "/rank-00000.safetensors").c_str(), 100) == 0);
  auto r2 = CheckpointReader::Open(dir);
  REQUIRE(r2.ok());
  auto v = (*r2)->VerifyAll();
  REQUIRE_FALSE(v.ok());
  CHECK(absl::StrContains(v.message(), "rank-00000.safetensors is truncated"));
  CHECK(absl::StrContains(v.message(), "tensor \"layer0.b\" chunk 0"));
  CHECK(absl::StrContains(v.message(), "rank 0 blob \"rng\""));
  ::unlink((dir + "/rank-00001.safetensors").c_str());
  auto r3 = CheckpointReader::Open(dir);
  auto miss = (*r3)->ReadShard("counts", 1, 2);
  CHECK(absl::StrContains(miss.status().message(), "missing data file rank-00001.safetensors"));
}

TEST_CASE("a newer major format is refused, a newer minor is read", "[checkpoint]") {
  std::string root = TmpDir("version");
  RequireAllOk(SaveWorld(root, MakeModel(1), 1, 1));
  std::string mpath = root + "/step-1/metadata.json";
  std::string text = *ReadFile(mpath, 1 << 20);
  REQUIRE(absl::StrContains(text, "\"format_version\": \"1.0\""));
  REQUIRE(base::WriteFileAtomic(mpath, absl::StrReplaceAll(text, {{"\"1.0\"", "\"1.7\""}})).ok());
  CHECK(CheckpointReader::Open(root).ok());
  REQUIRE(base::WriteFileAtomic(mpath, absl::StrReplaceAll(text, {{"\"1.0\"", "\"2.3\""}})).ok());
  auto r = CheckpointReader::Open(root);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(r.status().message(), "format 2.3"));
  CHECK(absl::StrContains(r.status().message(), "up to 1.x"));
  CHECK(absl::StrContains(r.status().message(), "newer Ember"));
}

TEST_CASE("the v1 fixture loads forever", "[checkpoint][fixture]") {
  // Generated once by make_fixture (MakeModel(42) saved at world 2); never regenerate it.
  std::string dir = std::string(getenv("TEST_SRCDIR")) + "/ember/checkpoint/testdata/v1";
  auto r = CheckpointReader::Open(dir);
  REQUIRE(r.ok());
  CHECK((*r)->metadata().format_major == 1);
  CHECK((*r)->metadata().step == 42);
  CHECK((*r)->VerifyAll().ok());
  for (const GlobalTensor& t : MakeModel(42)) {
    INFO(t.name);
    CHECK(*(*r)->ReadFull(t.name) == t.bytes);
    CHECK(*(*r)->ReadShard(t.name, 2, 3) == Rows(t, ShardRows(t.shape[0], 2, 3).first,
                                                  ShardRows(t.shape[0], 2, 3).second));
  }
  CHECK(*(*r)->ReadBlob(1, "data_loader") == "sample=42001");
}

TEST_CASE("keep the last K; latest moves only on commit; a failing rank fails everyone",
          "[checkpoint]") {
  std::string root = TmpDir("retain");
  for (int step = 1; step <= 4; ++step) RequireAllOk(SaveWorld(root, MakeModel(step), step, 2, 2));
  CHECK(ListSteps(root) == std::vector<int64_t>{3, 4});
  CHECK(*ResolveLatest(root) == root + "/step-4");
  auto res = SaveWorld(root, MakeModel(5), 5, 3, 2, /*broken_rank=*/1);
  for (const auto& s : res) CHECK_FALSE(s.ok());
  CHECK(absl::StrContains(res[0].message(), "rank 1"));
  CHECK(*ResolveLatest(root) == root + "/step-4");
  CHECK_FALSE(PathExists(root + "/step-5"));
  CHECK(ListSteps(root) == std::vector<int64_t>{3, 4});
  // Re-saving a committed step replaces it.
  RequireAllOk(SaveWorld(root, MakeModel(4), 4, 1, 2));
  CHECK((*CheckpointReader::Open(root))->metadata().world_size == 1);
}

// Issue 12: checkpoints were 0644 (any local user could read the weights). Modes must not depend
// on the umask: with umask 0 the old code made 0666 files and 0777 directories.
TEST_CASE("checkpoint files are 0640 and directories 0750 whatever the umask", "[checkpoint]") {
  const mode_t old = ::umask(0);
  std::string root = TmpDir("modes") + "/nested/ckpts";
  RequireAllOk(SaveWorld(root, MakeModel(2), 2, 2));
  ::umask(old);
  auto mode = [](const std::string& p) {
    struct stat st;
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return static_cast<int>(st.st_mode & 07777);
  };
  CHECK(mode(root) == 0750);
  CHECK(mode(root + "/step-2") == 0750);
  for (const char* f : {"metadata.json", "rank-00000.safetensors", "rank-00001.safetensors",
                        "rank-00000.manifest.json"}) {
    INFO(f);
    CHECK(mode(root + "/step-2/" + f) == 0640);
  }
  CHECK(mode(root + "/latest") == 0640);
}

TEST_CASE("async save: host copy, one in flight, failures reported", "[checkpoint]") {
  std::string root = TmpDir("async");
  auto model = MakeModel(10);
  AsyncSaver saver({.root = root}, std::make_shared<LocalCommitProtocol>());
  std::vector<GlobalTensor> live = model;
  REQUIRE(saver.Start(ShardState(live, 10, 0, 1)).ok());
  for (auto& t : live) std::fill(t.bytes.begin(), t.bytes.end(), 0x55);  // training goes on
  REQUIRE(saver.Start(ShardState(live, 11, 0, 1)).ok());  // waits for step 10 first
  REQUIRE(saver.Wait().ok());
  CHECK(saver.last_committed_step() == 11);
  auto r = CheckpointReader::Open(root + "/step-10");
  REQUIRE(r.ok());
  CHECK(*(*r)->ReadFull("embed.weight") == model[0].bytes);
  CHECK(*ResolveLatest(root) == root + "/step-11");

  // A save that fails (root is a file) is reported by Wait, and by the next Start if nobody asked.
  std::string file_root = TmpDir("async_bad") + "/not_a_dir";
  REQUIRE(base::WriteFileAtomic(file_root, "x").ok());
  AsyncSaver bad({.root = file_root}, std::make_shared<LocalCommitProtocol>());
  REQUIRE(bad.Start(ShardState(model, 1, 0, 1)).ok());
  CHECK_FALSE(bad.Wait().ok());
  REQUIRE(bad.Start(ShardState(model, 2, 0, 1)).ok());
  auto next = bad.Start(ShardState(model, 3, 0, 1));
  CHECK_FALSE(next.ok());
  CHECK(absl::StrContains(next.message(), "previous async checkpoint failed"));
  CHECK_FALSE(bad.last_committed_step().has_value());
}

TEST_CASE("inspect and export to safetensors", "[checkpoint][tools]") {
  std::string root = TmpDir("export");
  auto model = MakeModel(9);
  RequireAllOk(SaveWorld(root, model, 9, 3));
  auto text = InspectCheckpoint(root, {.verify = true});
  REQUIRE(text.ok());
  CHECK(text->checks.ok());
  CHECK(absl::StrContains(text->text, "embed.weight"));
  CHECK(absl::StrContains(text->text, "all checksums OK"));
  auto js = InspectCheckpoint(root, {.json = true});
  REQUIRE(js.ok());
  CHECK(absl::StrContains(js->text, "\"world_size\": 3"));
  std::string out = root + "/model.safetensors";
  auto n = ExportSafetensors(root, out);
  REQUIRE(n.ok());
  auto f = SafetensorsFile::Open(out);
  REQUIRE(f.ok());
  CHECK((*f)->Find("optim.embed.weight.exp_avg") == nullptr);
  for (const GlobalTensor& t : model) {
    if (absl::StartsWith(t.name, "optim.")) continue;
    REQUIRE((*f)->Find(t.name) != nullptr);
    CHECK((*f)->Data(*(*f)->Find(t.name)) == t.bytes);
    CHECK((*f)->Find(t.name)->shape == t.shape);
  }
  CHECK((*f)->metadata().at("format") == "pt");
  CHECK((*f)->metadata().at("ember.step") == "9");
}

// Hugging Face's loaders read a sharded set through the index: metadata.total_size is the sum of
// the tensors' bytes, weight_map names each tensor's file, and transformers refuses a shard whose
// __metadata__ lacks format "pt". Checked here against the files themselves.
TEST_CASE("export --max-shard-bytes writes a Hugging Face sharded set", "[checkpoint][tools]") {
  std::string root = TmpDir("export_sharded");
  auto model = MakeModel(9);
  RequireAllOk(SaveWorld(root, model, 9, 2));
  const std::string out = root + "/sharded";
  auto n = ExportSafetensors(root, out, {.max_shard_bytes = 300});
  REQUIRE(n.ok());
  std::string text = *ReadFile(out + "/model.safetensors.index.json", 1 << 20);
  auto index = json::Parse(text);
  REQUIRE(index.ok());
  const json::Value* wm = index->Find("weight_map");
  REQUIRE(wm != nullptr);
  std::set<std::string> files;
  uint64_t total = 0, expected_total = 0;
  for (const GlobalTensor& t : model) {
    if (absl::StartsWith(t.name, "optim.")) {
      CHECK(wm->Find(t.name) == nullptr);
      continue;
    }
    expected_total += t.bytes.size();
    const json::Value* file = wm->Find(t.name);
    REQUIRE(file != nullptr);
    auto f = SafetensorsFile::Open(out + "/" + file->as_string());
    REQUIRE(f.ok());
    CHECK((*f)->metadata().at("format") == "pt");
    REQUIRE((*f)->Find(t.name) != nullptr);
    CHECK((*f)->Data(*(*f)->Find(t.name)) == t.bytes);
    files.insert(file->as_string());
  }
  for (const std::string& f : files) {
    auto sf = SafetensorsFile::Open(out + "/" + f);
    uint64_t data = 0;
    for (const TensorInfo& t : (*sf)->tensors()) data += t.nbytes();
    total += data;
    // A shard exceeds the limit only when it holds a single tensor larger than the limit.
    CHECK((data <= 300 || (*sf)->tensors().size() == 1));
  }
  CHECK(files.size() > 1);
  CHECK(*n == expected_total);
  CHECK(total == expected_total);
  CHECK(index->Find("metadata")->Find("total_size")->as_int() == static_cast<int64_t>(expected_total));
  for (const std::string& f : ListDirForTest(out)) CHECK_FALSE(absl::EndsWith(f, ".tmp"));
  auto set = SafetensorsSet::Open(out + "/model.safetensors.index.json");
  REQUIRE(set.ok());
  CHECK((*set)->names().size() == 5);
  CHECK(InspectCheckpoint(out + "/model.safetensors.index.json").ok());
}

TEST_CASE("inspect --verify reports damage as a failed check, not success", "[checkpoint][tools]") {
  std::string root = TmpDir("inspect_bad");
  RequireAllOk(SaveWorld(root, MakeModel(3), 3, 1));
  const std::string path = root + "/step-3/rank-00000.safetensors";
  std::string bytes = *ReadFile(path, 1 << 20);
  bytes[bytes.size() - 40] ^= 0x01;
  REQUIRE(base::WriteFileAtomic(path, bytes).ok());
  for (bool js : {false, true}) {
    auto r = InspectCheckpoint(root, {.json = js, .verify = true});
    REQUIRE(r.ok());
    CHECK(r->checks.code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(r->checks.message(), "checksum mismatch"));
  }
  auto plain = InspectCheckpoint(root, {});
  REQUIRE(plain.ok());
  CHECK(plain->checks.ok());  // nothing was checked
}

TEST_CASE("seeded mutation fuzzing of the metadata parser", "[checkpoint][fuzz]") {
  std::string root = TmpDir("fuzzmeta");
  RequireAllOk(SaveWorld(root, MakeModel(1), 1, 2));
  std::string seed = *ReadFile(root + "/step-1/metadata.json", 1 << 20);
  REQUIRE(ParseMetadata(seed).ok());
  std::mt19937_64 rng(777);
  const char* tokens[] = {"0", "-1", "99999999999999999999", "\"", "{", "}", "[", "]", ",",
                          "\"2.0\"", "\"../x\"", "null", "1.5"};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = seed;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = static_cast<char>(rng()); break;
        case 1: s.insert(pos, tokens[rng() % 13]); break;
        case 2: s.erase(pos, 1 + rng() % 6); break;
      }
    }
    FuzzCheckpointMetadata(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
}

}  // namespace
}  // namespace ember::ckpt
