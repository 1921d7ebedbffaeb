// ckpt_bench: checkpoint save/load throughput against the disk's sequential bandwidth (dd on the
// same filesystem, same run), the time an async save blocks training, safetensors export/import.
//
//   ckpt_bench [--dir=/tmp/ckpt_bench] [--mib=256] [--world=2] [--rounds=3] [--quick]
//              [--json [--allow-missing-peers]]
//
// Saves at --world ranks (threads) and reads back at another world size (--world + 1, so shard
// boundaries differ and every reader stitches rows from two saved shards). dd and our save run
// interleaved (dd, save, dd, save, ...; median of --rounds), as do the host copy and the async
// save's blocking time. The async-save target is blocked time <= one host copy of the same bytes,
// with no slack factor.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tools.h"
#include "runtime/base/flags.h"
#include "runtime/base/status_macros.h"

ABSL_FLAG(std::string, dir, "/tmp/ckpt_bench", "scratch directory (on the filesystem to measure)");
ABSL_FLAG(int, mib, 256, "model size in MiB (f32 tensors of 8 MiB); --quick: 16");
ABSL_FLAG(int, world, 2, "ranks (threads) that save; the load reads at world + 1");
ABSL_FLAG(int, rounds, 3, "interleaved rounds (median reported); --quick: 1");

namespace ember::ckpt {
namespace {

double Seconds(absl::Time t0) { return absl::ToDoubleSeconds(absl::Now() - t0); }

// Runs fn(rank) on `world` threads; the first error wins.
absl::Status OnThreads(int world, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> st(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back([&, r] { st[r] = fn(r); });
  for (auto& t : ts) t.join();
  for (const auto& s : st) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  bench::Report report("ckpt_bench", argc, argv);
  const bool quick = bench::Quick();
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int world = absl::GetFlag(FLAGS_world);
  const int read_world = world + 1;
  const int rounds = quick ? 1 : std::max(1, absl::GetFlag(FLAGS_rounds));
  const uint64_t bytes = static_cast<uint64_t>(quick ? 16 : absl::GetFlag(FLAGS_mib)) << 20;
  (void)RemoveAll(dir);
  if (absl::Status s = base::MakeDirs(dir, kDirMode); !s.ok()) return report.Fail(s);

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
    return OnThreads(world, [&](int r) {
      return SaveCheckpoint({.root = dir, .rank = r, .world_size = world}, state(r, step),
                            &protocol);
    });
  };

  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  // Disk (dd with fdatasync, same size) and our save, interleaved.
  std::vector<double> dd_mbs, save_mbs;
  std::string dd_error;
  const double mb = bytes / 1e6;
  for (int round = 0; round < rounds; ++round) {
    absl::Time t0 = absl::Now();
    std::string dd = absl::StrFormat(
        "dd if=/dev/zero of=%s/dd.bin bs=4M count=%d conv=fdatasync 2>/dev/null", dir,
        static_cast<int>(bytes >> 22));
    int rc = std::system(dd.c_str());
    if (rc == 0) {
      dd_mbs.push_back(mb / Seconds(t0));
    } else {
      dd_error = absl::StrCat("dd exited with status ", rc);
    }
    (void)RemoveAll(dir + "/dd.bin");
    t0 = absl::Now();
    if (absl::Status s = save_world(1 + round); !s.ok()) return report.Fail(s);
    save_mbs.push_back(mb / Seconds(t0));
  }

  // Load at another world size from a fresh reader (page cache is warm: an upper bound for reads).
  std::vector<double> load_mbs;
  for (int round = 0; round < rounds; ++round) {
    absl::Time t0 = absl::Now();
    absl::Status s = OnThreads(read_world, [&](int r) -> absl::Status {
      ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir));
      for (int i = 0; i < ntensors; ++i) {
        ASSIGN_OR_RETURN(std::string shard,
                         reader->ReadShard(absl::StrCat("layer", i, ".w"), r, read_world));
        auto [b, e] = ShardRows(rows, r, read_world);
        if (shard.size() != static_cast<size_t>((e - b) * cols * 4) ||
            shard != absl::string_view(data[i]).substr(b * cols * 4, (e - b) * cols * 4)) {
          return absl::DataLossError(absl::StrCat("resharded read of layer", i, ".w rank ", r,
                                                  " of ", read_world, " differs from the saved data"));
        }
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return report.Fail(s);
    load_mbs.push_back(mb / Seconds(t0));
  }

  // Async: how long Start() blocks versus one plain host copy of the same bytes, interleaved.
  std::vector<double> copy_s, blocked_s;
  for (int round = 0; round < rounds; ++round) {
    absl::Time t0 = absl::Now();
    { std::vector<std::string> copy = data; }
    copy_s.push_back(Seconds(t0));
    AsyncSaver saver({.root = dir, .rank = 0, .world_size = 1},
                     std::make_shared<LocalCommitProtocol>());
    RankState st;
    st.step = 100 + round;
    for (int i = 0; i < ntensors; ++i) {
      st.tensors.push_back({absl::StrCat("layer", i, ".w"), DType::kF32, {rows, cols}, 0, data[i]});
    }
    t0 = absl::Now();
    absl::Status started = saver.Start(st);
    blocked_s.push_back(Seconds(t0));
    if (!started.ok()) return report.Fail(started);
    if (absl::Status s = saver.Wait(); !s.ok()) return report.Fail(s);
  }

  absl::Time t0 = absl::Now();
  auto exported = ExportSafetensors(dir, dir + "/export.safetensors");
  double export_s = Seconds(t0);
  if (!exported.ok()) return report.Fail(exported.status());
  t0 = absl::Now();
  uint64_t sum = 0;
  {
    auto f = SafetensorsFile::Open(dir + "/export.safetensors");
    if (!f.ok()) return report.Fail(f.status());
    for (const TensorInfo& t : (*f)->tensors()) {
      absl::string_view d = (*f)->Data(t);
      for (size_t j = 0; j < d.size(); j += 4096) sum += static_cast<unsigned char>(d[j]);
    }
  }
  double import_s = Seconds(t0);
  (void)sum;
  (void)RemoveAll(dir);

  std::optional<double> dd;
  if (!dd_mbs.empty()) dd = bench::Median(dd_mbs);
  const double save = bench::Median(save_mbs);
  report.SetMeta("bytes", json::Value::Int(static_cast<int64_t>(bytes)));
  report.SetMeta("dir", json::Value::Str(dir));
  bench::Table& t = report.AddTable(
      absl::StrFormat("checkpoint of %.0f MB, saved by %d ranks (threads), read by %d; median of "
                      "%d interleaved rounds",
                      mb, world, read_world, rounds),
      {"measurement", "value", "unit", "reference"});
  t.SetLoad(load_begin, bench::ReadLoadAverage());
  t.AddRow({"disk sequential write (dd, fdatasync)", dd, "MB/s", "peer"});
  t.AddRow({"save (aggregate, fsync)", save, "MB/s", "vs dd"});
  t.AddRow({"save per rank", save / world, "MB/s", ""});
  t.AddRow({absl::StrCat("load + verify, resharded ", world, " -> ", read_world, " ranks"),
            bench::Median(load_mbs), "MB/s", "page cache warm"});
  t.AddRow({"host copy of the same bytes", bench::Median(copy_s) * 1e3, "ms", "peer"});
  t.AddRow({"async save: training blocked", bench::Median(blocked_s) * 1e3, "ms", "vs host copy"});
  t.AddRow({"export to safetensors", mb / export_s, "MB/s", "one run"});
  t.AddRow({"safetensors import (mmap + touch)", mb / import_s, "MB/s", "one run"});
  report.AddTarget(bench::Target::VsPeer("save_mb_s_vs_dd", save, dd, 0.7,
                                         bench::kHigherIsBetter, "MB/s", dd_error,
                                         "same filesystem, same bytes, fsync on both"));
  report.AddTarget(bench::Target::VsPeer(
      "async_save_blocked_vs_host_copy_s", bench::Median(blocked_s), bench::Median(copy_s), 1.0,
      bench::kLowerIsBetter, "s", "", "no slack: blocked time <= one host copy"));
  return report.Finish();
}

}  // namespace
}  // namespace ember::ckpt

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "ckpt_bench");
  return ember::ckpt::Main(argc, argv);
}
