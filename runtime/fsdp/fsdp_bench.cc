// fsdp_bench: FSDP training throughput and communication on the CPU backend.
//
// Ranks are forked processes (one per rank, file rendezvous in a temp dir, cpu backend over
// shm/TCP loopback) training the kernels benchmark model (vocab 8192, context 256, 4 layers,
// width 256) on a fixed global batch. Reports, per configuration, tokens/s (global), median step
// time, the share of step time the training thread waited on collectives, peak RSS and the
// persistent state bytes (fp32 params + grads + AdamW m, v) per rank, and bytes per step per dtype
// for the bf16-with-fp32-norms policy next to PyTorch's promotion rule.
//
//   bazel run -c opt //runtime/fsdp:fsdp_bench -- [--json] [--steps=5] [--global_batch=4]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/fsdp/fsdp.h"

ABSL_FLAG(bool, json, false, "print one JSON object with a targets array");
ABSL_FLAG(int, steps, 5, "measured steps per configuration (after 2 warmup steps)");
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

model::GptConfig BenchModel() {
  model::GptConfig c = model::BenchmarkConfig();
  c.n_layer = absl::GetFlag(FLAGS_layers);
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
  static int n = 0;
  const std::string dir = absl::StrCat("/tmp/fsdp_bench-", getpid(), "-", n++);
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

struct Target {
  std::string name;
  double value;
  std::optional<double> peer, goal;
  bool higher_is_better;
  std::string unit;
};

std::string Opt(const std::optional<double>& v) { return v ? absl::StrCat(*v) : "null"; }

int Main() {
  const Config configs[] = {{"fp32 1 rank", 1, true, false},     {"fp32 2 ranks", 2, true, false},
                            {"fp32 4 ranks", 4, true, false},    {"fp32 4 ranks overlap off", 4, false, false},
                            {"bf16+fp32 norms 4 ranks", 4, true, true}};
  std::vector<Result> rs;
  std::printf("%-28s %10s %9s %10s %12s %14s\n", "config", "tok/s", "step ms", "comm wait", "peak RSS MB", "state MB/rank");
  for (const Config& c : configs) {
    rs.push_back(Run(c));
    const Result& r = rs.back();
    std::printf("%-28s %10.0f %9.1f %9.1f%% %12.1f %14.2f\n", c.name.c_str(), r.tokens_per_s, r.step_s * 1e3,
                100 * r.wait_share, r.peak_rss / 1e6, r.state_bytes / 1e6);
  }
  const Result& mixed = rs[4];
  int64_t rs_bytes = 0;
  for (const auto& [k, v] : mixed.bytes.reduce_scatter) rs_bytes += v;
  std::printf("\nbytes/step, bf16+fp32 norms, 4 ranks: all-gather f32 %lld bf16 %lld | reduce-scatter "
              "f32 %lld bf16 %lld (total %lld) | PyTorch promotion rule: %lld\n",
              (long long)mixed.bytes.all_gather.at("f32"), (long long)mixed.bytes.all_gather.at("bf16"),
              (long long)mixed.bytes.reduce_scatter.at("f32"), (long long)mixed.bytes.reduce_scatter.at("bf16"),
              (long long)rs_bytes, (long long)mixed.bytes.reduce_scatter_promoted);
  std::vector<Target> t = {
      {"tokens_per_s_1rank", rs[0].tokens_per_s, std::nullopt, std::nullopt, true, "tok/s"},
      {"tokens_per_s_2ranks", rs[1].tokens_per_s, std::nullopt, std::nullopt, true, "tok/s"},
      {"tokens_per_s_4ranks", rs[2].tokens_per_s, std::nullopt, std::nullopt, true, "tok/s"},
      {"state_bytes_per_rank_4_vs_1", static_cast<double>(rs[2].state_bytes), static_cast<double>(rs[0].state_bytes),
       0.30, false, "bytes"},
      {"tokens_per_s_4ranks_overlap_on_vs_off", rs[2].tokens_per_s, rs[3].tokens_per_s, 1.0, true, "tok/s"},
      {"comm_wait_share_4ranks_overlap_on", rs[2].wait_share, std::nullopt, std::nullopt, false, "fraction"},
      {"comm_wait_share_4ranks_overlap_off", rs[3].wait_share, std::nullopt, std::nullopt, false, "fraction"},
      {"peak_rss_per_rank_4ranks", static_cast<double>(rs[2].peak_rss), static_cast<double>(rs[0].peak_rss),
       std::nullopt, false, "bytes"},
      {"reduce_scatter_bytes_mixed_vs_promoted", static_cast<double>(rs_bytes),
       static_cast<double>(mixed.bytes.reduce_scatter_promoted), 0.60, false, "bytes"},
  };
  if (absl::GetFlag(FLAGS_json)) {
    std::ostringstream o;
    o << "{\"benchmark\":\"fsdp_bench\",\"targets\":[";
    for (size_t i = 0; i < t.size(); ++i) {
      o << (i ? "," : "") << "{\"name\":\"" << t[i].name << "\",\"value\":" << t[i].value
        << ",\"peer\":" << Opt(t[i].peer) << ",\"goal\":" << Opt(t[i].goal)
        << ",\"higher_is_better\":" << (t[i].higher_is_better ? "true" : "false") << ",\"unit\":\""
        << t[i].unit << "\"}";
    }
    o << "]}";
    std::printf("%s\n", o.str().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace ember::fsdp

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ember::fsdp::Main();
}
