// fsdp_bench: FSDP training throughput and communication on the CPU backend.
//
// Ranks are forked processes (one per rank, file rendezvous in a temp dir, cpu backend over
// shm/TCP loopback) training the kernels benchmark model (vocab 8192, context 256, 4 layers,
// width 256) on a fixed global batch. Reports, per configuration, tokens/s (global), median step
// time, the share of step time the training thread waited on collectives, peak RSS and the
// persistent state bytes (fp32 params + grads + AdamW m, v) per rank, and bytes per step per dtype
// for the bf16-with-fp32-norms policy next to PyTorch's promotion rule.
//
// "comm wait" is the time the training thread spent in collectives: issuing them (small ones,
// <= 256 KiB, run inline on the caller's thread) plus blocked in Wait(). Figures derived from
// shapes and counted bytes rather than timed (state bytes, bytes per step, the promotion rule's
// bytes) are labelled `computed` and carry no target. The overlap on/off pair, the one timed
// target, runs interleaved (on, off, on, off, ...; median of --rounds).
//
//   bazel run -c opt //runtime/fsdp:fsdp_bench -- [--json] [--quick] [--steps=5] [--global_batch=4]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/fsdp/fsdp.h"

ABSL_FLAG(int, steps, 5, "measured steps per configuration (after 2 warmup steps)");
ABSL_FLAG(int, rounds, 3, "interleaved rounds of the overlap on/off pair; --quick: 1");
ABSL_FLAG(int, global_batch, 4, "sequences per step over all ranks");
ABSL_FLAG(int, layers, 4, "model layers");
ABSL_FLAG(int, threads, 0, "compute threads per rank; 0 = max(1, cores / ranks)");

namespace ember::fsdp {
namespace {

struct Config {
  std::string name;
  int world = 1;
  bool overlap = true;  // prefetch + separate reduce-scatter group
  bool bf16 = false;    // bf16 params/grads, fp32 norm weights
};

struct Result {
  double tokens_per_s = 0, step_s = 0, wait_share = 0;
  int64_t peak_rss = 0, state_bytes = 0;
  CommBytes bytes;  // of one step
};

using bench::Median;

model::GptConfig BenchModel() {
  model::GptConfig c = model::BenchmarkConfig();
  c.n_layer = absl::GetFlag(FLAGS_layers);
  if (bench::Quick()) {  // a smoke run: same code paths, a small model
    c.vocab_size = 1024;
    c.context = 64;
    c.d_model = 64;
  }
  return c;
}

// Runs in a forked child: trains and writes "tps step_s wait rss state ag... " to `out`.
int RankMain(const Config& cfg, int rank, const std::string& dir, const std::string& out) {
  auto rdzv = comm::MakeFileRendezvous(dir);
  comm::GroupOptions go;
  go.timeout = absl::Minutes(5);
  auto pg = comm::ProcessGroup::Create(rdzv, rank, cfg.world, go);
  if (!pg.ok()) return 3;
  std::unique_ptr<comm::ProcessGroup> rs;
  if (cfg.overlap && cfg.world > 1) {
    go.name = "rs";
    auto g = comm::ProcessGroup::Create(rdzv, rank, cfg.world, go);
    if (!g.ok()) return 3;
    rs = std::move(*g);
  }
  FsdpOptions o;
  o.prefetch = cfg.overlap;
  o.seed = 1;
  if (cfg.bf16) {
    o.mp.param_dtype = DataType::kBF16;
    o.mp.overrides.push_back({"*ln*", DataType::kF32, std::nullopt});
  }
  const model::GptConfig mc = BenchModel();
  auto m = FsdpGpt::Create(mc, {pg->get(), rs.get()}, o);
  if (!m.ok()) return 4;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                        : std::max(1, cores / cfg.world);
  kernels::ThreadPool pool(threads);
  kernels::ExecContext ctx{&pool, false};
  const int64_t T = mc.context, B = std::max(1, absl::GetFlag(FLAGS_global_batch) / cfg.world);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tok[i] = static_cast<int32_t>((i * 7919 + rank * 31) % mc.vocab_size);
    tgt[i] = static_cast<int32_t>((tok[i] * 3 + 1) % mc.vocab_size);
  }
  std::vector<double> step_s, wait_s;
  CommBytes bytes;
  const int warmup = 2, steps = absl::GetFlag(FLAGS_steps);
  for (int s = 0; s < warmup + steps; ++s) {
    (*m)->ResetCommBytes();
    (*m)->ResetCommWait();
    const absl::Time t0 = absl::Now();
    if (!(*m)->ForwardBackward(ctx, tok.data(), tgt.data(), B, T, true).ok()) return 5;
    if (!(*m)->OptimizerStep(ctx, 1e-4f).ok()) return 5;
    const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
    if (s >= warmup) {
      step_s.push_back(dt);
      wait_s.push_back(absl::ToDoubleSeconds((*m)->comm_wait()) / dt);
    }
    bytes = (*m)->comm_bytes();
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  std::ofstream f(out);
  f << Median(step_s) << " " << Median(wait_s) << " " << ru.ru_maxrss * 1024 << " " << (*m)->state_bytes()
    << " " << bytes.reduce_scatter_promoted;
  for (const auto* mp : {&bytes.all_gather, &bytes.reduce_scatter})
    for (const char* dt : {"f32", "bf16"}) f << " " << (mp->count(dt) ? mp->at(dt) : 0);
  f << "\n";
  return f ? 0 : 6;
}

Result Run(const Config& cfg) {
  // A new, empty rendezvous directory: "/tmp/fsdp_bench-<pid>-<n>" could hold the rank addresses
  // of an earlier process with the same (reused) pid (pipeline_bench failed that way).
  std::string dir = "/tmp/fsdp_bench-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "fsdp_bench: mkdtemp failed: %s\n", std::strerror(errno));
    std::exit(1);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < cfg.world; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RankMain(cfg, r, dir, absl::StrCat(dir, ".rank", r)));
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr, "%s: rank failed (status %d)\n", cfg.name.c_str(), st);
      std::exit(1);
    }
  }
  Result res;
  std::vector<double> steps, waits;
  for (int r = 0; r < cfg.world; ++r) {
    std::ifstream f(absl::StrCat(dir, ".rank", r));
    double step, wait;
    int64_t rss, state, promoted, ag32, ag16, rs32, rs16;
    f >> step >> wait >> rss >> state >> promoted >> ag32 >> ag16 >> rs32 >> rs16;
    steps.push_back(step);
    waits.push_back(wait);
    res.peak_rss = std::max(res.peak_rss, rss);
    res.state_bytes = std::max(res.state_bytes, state);
    if (r == 0) {
      res.bytes.reduce_scatter_promoted = promoted;
      res.bytes.all_gather = {{"f32", ag32}, {"bf16", ag16}};
      res.bytes.reduce_scatter = {{"f32", rs32}, {"bf16", rs16}};
    }
  }
  res.step_s = *std::max_element(steps.begin(), steps.end());  // the slowest rank sets the pace
  res.wait_share = Median(waits);
  res.tokens_per_s = absl::GetFlag(FLAGS_global_batch) * BenchModel().context / res.step_s;
  return res;
}

int Main(int argc, char** argv) {
  bench::Report report("fsdp_bench", argc, argv);
  if (bench::Quick()) {
    absl::SetFlag(&FLAGS_layers, 1);
    absl::SetFlag(&FLAGS_steps, 1);
  }
  const int rounds = bench::Quick() ? 1 : std::max(1, absl::GetFlag(FLAGS_rounds));
  const Config configs[] = {{"fp32 1 rank", 1, true, false},     {"fp32 2 ranks", 2, true, false},
                            {"fp32 4 ranks", 4, true, false},    {"fp32 4 ranks overlap off", 4, false, false},
                            {"bf16+fp32 norms 4 ranks", 4, true, true}};
  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  std::vector<Result> rs;
  for (const Config& c : configs) rs.push_back(Run(c));
  // The overlap on/off pair again, interleaved, for the target (median over rounds, the first
  // measurements above included).
  std::vector<double> on_tps = {rs[2].tokens_per_s}, off_tps = {rs[3].tokens_per_s};
  for (int r = 1; r < rounds; ++r) {
    on_tps.push_back(Run(configs[2]).tokens_per_s);
    off_tps.push_back(Run(configs[3]).tokens_per_s);
  }
  const bench::LoadAverage load_end = bench::ReadLoadAverage();
  report.SetMeta("layers", json::Value::Int(absl::GetFlag(FLAGS_layers)));
  report.SetMeta("global_batch", json::Value::Int(absl::GetFlag(FLAGS_global_batch)));
  report.SetMeta("steps", json::Value::Int(absl::GetFlag(FLAGS_steps)));
  bench::Table& t = report.AddTable(
      absl::StrCat("FSDP training, measured: median of ", absl::GetFlag(FLAGS_steps),
                   " steps after 2 warm-up (slowest rank)"),
      {"config", "tok/s", "step ms", "comm wait %", "peak RSS MB"});
  t.SetLoad(load_begin, load_end);
  t.AddNote("comm wait: share of step time in collectives on the training thread (issue, "
            "including inline runs of <= 256 KiB, plus Wait())");
  for (size_t i = 0; i < rs.size(); ++i) {
    t.AddRow({configs[i].name, rs[i].tokens_per_s, rs[i].step_s * 1e3, 100 * rs[i].wait_share,
              rs[i].peak_rss / 1e6});
  }
  bench::Table& c = report.AddTable("FSDP, computed (from shapes and counted bytes; no targets)",
                                    {"figure", "kind", "value", "reference", "ratio", "unit"});
  const Result& mixed = rs[4];
  int64_t rs_bytes = 0;
  for (const auto& [k, v] : mixed.bytes.reduce_scatter) rs_bytes += v;
  c.AddRow({"state bytes per rank, 4 ranks vs 1", "computed", static_cast<double>(rs[2].state_bytes),
            static_cast<double>(rs[0].state_bytes),
            static_cast<double>(rs[2].state_bytes) / rs[0].state_bytes, "bytes"});
  c.AddRow({"reduce-scatter bytes/step, bf16+fp32 norms vs PyTorch promotion rule", "computed",
            static_cast<double>(rs_bytes), static_cast<double>(mixed.bytes.reduce_scatter_promoted),
            static_cast<double>(rs_bytes) / mixed.bytes.reduce_scatter_promoted, "bytes"});
  for (const char* dt : {"f32", "bf16"}) {
    c.AddRow({absl::StrCat("all-gather bytes/step ", dt, ", bf16+fp32 norms 4 ranks"), "computed",
              static_cast<double>(mixed.bytes.all_gather.at(dt)), bench::Cell(), bench::Cell(),
              "bytes"});
    c.AddRow({absl::StrCat("reduce-scatter bytes/step ", dt, ", bf16+fp32 norms 4 ranks"),
              "computed", static_cast<double>(mixed.bytes.reduce_scatter.at(dt)), bench::Cell(),
              bench::Cell(), "bytes"});
  }
  bench::Table& p = report.AddTable(
      absl::StrCat("overlap on vs off, 4 ranks: ", rounds, " interleaved rounds"),
      {"round", "overlap on tok/s", "overlap off tok/s"});
  p.SetLoad(load_begin, load_end);
  for (size_t r = 0; r < on_tps.size(); ++r) p.AddRow({static_cast<int>(r), on_tps[r], off_tps[r]});
  report.AddTarget(bench::Target::VsPeer("tokens_per_s_4ranks_overlap_on_vs_off", Median(on_tps),
                                         Median(off_tps), 1.0, bench::kHigherIsBetter, "tok/s", "",
                                         "peer = the same run with prefetch/overlap off"));
  return report.Finish();
}

}  // namespace
}  // namespace ember::fsdp

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "fsdp_bench");
  return ember::fsdp::Main(argc, argv);
}
