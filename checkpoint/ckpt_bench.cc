// ckpt_bench: checkpoint save/load throughput against the disk's sequential bandwidth (dd on the
// same filesystem, same run), the time an async save blocks training, safetensors export/import.
//   ckpt_bench [--dir=/tmp/ckpt_bench] [--mib=256] [--world=2] [--json]
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
#include "runtime/base/flags.h"

ABSL_FLAG(std::string, dir, "/tmp/ckpt_bench", "scratch directory (on the filesystem to measure)");
ABSL_FLAG(int, mib, 256, "model size in MiB (f32 tensors of 8 MiB)");
ABSL_FLAG(int, world, 2, "ranks (threads)");
ABSL_FLAG(bool, json, false, "print JSON with a targets array");

namespace ember::ckpt {
namespace {

double Seconds(absl::Time t0) { return absl::ToDoubleSeconds(absl::Now() - t0); }

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int world = absl::GetFlag(FLAGS_world);
  const uint64_t bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_mib)) << 20;
  (void)RemoveAll(dir);
  (void)MakeDirs(dir);
  // Disk: dd with fdatasync, same size as the checkpoint.
  absl::Time t0 = absl::Now();
  std::string dd = absl::StrFormat("dd if=/dev/zero of=%s/dd.bin bs=4M count=%d conv=fdatasync 2>/dev/null",
                                   dir, static_cast<int>(bytes >> 22));
  if (std::system(dd.c_str()) != 0) return 1;
  double dd_mbs = bytes / 1e6 / Seconds(t0);
  (void)RemoveAll(dir + "/dd.bin");

  // Model: tensors of 2048 x 1024 f32 (8 MiB).
  const int64_t rows = 2048, cols = 1024;
  int ntensors = static_cast<int>(bytes / (rows * cols * 4));
  std::vector<std::string> data(ntensors);
  for (int i = 0; i < ntensors; ++i) {
    data[i].resize(rows * cols * 4);
    for (size_t j = 0; j < data[i].size(); j += 4096) data[i][j] = static_cast<char>(i + j);
  }
  auto state = [&](int rank, int64_t step) {
    RankState st;
    st.step = step;
    for (int i = 0; i < ntensors; ++i) {
      auto [b, e] = ShardRows(rows, rank, world);
      st.tensors.push_back({absl::StrCat("layer", i, ".w"), DType::kF32, {rows, cols}, b,
                            absl::string_view(data[i]).substr(b * cols * 4, (e - b) * cols * 4)});
    }
    return st;
  };
  auto save_world = [&](int64_t step) {
    LocalCommitProtocol protocol;
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r) {
      ts.emplace_back([&, r] {
        absl::Status s = SaveCheckpoint({.root = dir, .rank = r, .world_size = world}, state(r, step), &protocol);
        if (!s.ok()) { std::fprintf(stderr, "%s\n", s.ToString().c_str()); std::exit(1); }
      });
    }
    for (auto& t : ts) t.join();
  };
  t0 = absl::Now();
  save_world(1);
  double save_s = Seconds(t0);

  // Load at world 2 from a fresh reader (page cache is warm: an upper bound for reads).
  t0 = absl::Now();
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r) {
      ts.emplace_back([&, r] {
        auto reader = CheckpointReader::Open(dir);
        for (int i = 0; i < ntensors; ++i) (void)(*reader)->ReadShard(absl::StrCat("layer", i, ".w"), r, world);
      });
    }
    for (auto& t : ts) t.join();
  }
  double load_s = Seconds(t0);

  // Async: how long Start() blocks versus a plain host copy of the same bytes.
  t0 = absl::Now();
  { std::vector<std::string> copy = data; }
  double copy_s = Seconds(t0);
  double blocked_s = 0;
  {
    AsyncSaver saver({.root = dir, .rank = 0, .world_size = 1}, std::make_shared<LocalCommitProtocol>());
    RankState st;
    st.step = 2;
    for (int i = 0; i < ntensors; ++i) st.tensors.push_back({absl::StrCat("layer", i, ".w"), DType::kF32, {rows, cols}, 0, data[i]});
    t0 = absl::Now();
    (void)saver.Start(st);
    blocked_s = Seconds(t0);
    if (!saver.Wait().ok()) return 1;
  }

  t0 = absl::Now();
  auto exported = ExportSafetensors(dir, dir + "/export.safetensors");
  double export_s = Seconds(t0);
  if (!exported.ok()) return 1;
  t0 = absl::Now();
  uint64_t sum = 0;
  {
    auto f = SafetensorsFile::Open(dir + "/export.safetensors");
    for (const TensorInfo& t : (*f)->tensors()) {
      absl::string_view d = (*f)->Data(t);
      for (size_t j = 0; j < d.size(); j += 4096) sum += static_cast<unsigned char>(d[j]);
    }
  }
  double import_s = Seconds(t0);

  double mb = bytes / 1e6;
  double save_mbs = mb / save_s, load_mbs = mb / load_s;
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"bytes\": %llu, \"world\": %d, \"dd_mb_s\": %.1f, \"save_mb_s\": %.1f, \"save_mb_s_per_rank\": %.1f,"
        " \"load_mb_s\": %.1f, \"host_copy_s\": %.4f, \"async_blocked_s\": %.4f, \"export_mb_s\": %.1f,"
        " \"import_mb_s\": %.1f, \"targets\": [{\"name\": \"save >= 70%% of dd\", \"value\": %.3f,"
        " \"target\": 0.7, \"met\": %s}, {\"name\": \"async blocked <= host copy\", \"value\": %.4f,"
        " \"target\": %.4f, \"met\": %s}]}\n",
        static_cast<unsigned long long>(bytes), world, dd_mbs, save_mbs, save_mbs / world, load_mbs, copy_s,
        blocked_s, mb / export_s, mb / import_s, save_mbs / dd_mbs, save_mbs / dd_mbs >= 0.7 ? "true" : "false",
        blocked_s, copy_s * 1.2, blocked_s <= copy_s * 1.2 ? "true" : "false");
  } else {
    std::printf("checkpoint of %.0f MB, %d ranks (threads), dir %s\n", mb, world, dir.c_str());
    std::printf("  %-34s %10.1f MB/s\n", "disk sequential write (dd, fsync)", dd_mbs);
    std::printf("  %-34s %10.1f MB/s (%.0f%% of dd; target 70%%)\n", "save (aggregate, fsync)", save_mbs,
                100 * save_mbs / dd_mbs);
    std::printf("  %-34s %10.1f MB/s\n", "save per rank", save_mbs / world);
    std::printf("  %-34s %10.1f MB/s (page cache warm)\n", "load + verify (resharded reads)", load_mbs);
    std::printf("  %-34s %10.1f ms (host copy %.1f ms)\n", "async save: training blocked", blocked_s * 1e3,
                copy_s * 1e3);
    std::printf("  %-34s %10.1f MB/s\n", "export to safetensors", mb / export_s);
    std::printf("  %-34s %10.1f MB/s (mmap + touch)\n", "safetensors import", mb / import_s);
  }
  (void)sum;
  (void)RemoveAll(dir);
  return 0;
}

}  // namespace
}  // namespace ember::ckpt

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "ckpt_bench");
  return ember::ckpt::Main();
}
