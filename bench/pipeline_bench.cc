// pipeline_bench: pipeline parallelism (issue 15) measured on real processes over the CPU backend.
//
// Each configuration forks one process per rank (file rendezvous in a temp dir, cpu backend over
// shm/TCP loopback, one compute thread per rank) and trains a small GPT with PipelineGpt for
// --steps measured steps after one warm-up step. Per step and rank the executor records the time
// spent in computes (F, B, I, W) and the span from the step's start to its last compute
// (PipelineGpt::last_step_timing); the measured bubble of a step is
//   1 - sum over ranks of compute time / (ranks * the longest span),
// the share of rank-time the pipeline left idle (waiting for a neighbour, sends, receives). The
// optimizer step and the loss broadcast are outside the span, as in the theory. Reported as the
// median over steps, against theory (p-1)/(m+p-1) for GPipe and 1F1B.
//
// Also: the buffer pool's peak bytes (receive and send buffers of a rank, max over ranks) just in
// time against a realistic peer, m receive buffers (what a GPipe implementation that pre-allocates
// one receive buffer per in-flight micro-batch holds; computed, not measured), and against our
// own `preallocate` mode (one buffer per send and receive: a strawman, informational only), and tokens/s of PP=2 (1F1B) against FSDP=2 (FsdpGpt, same model, same
// global batch, same thread count). It lives in //bench rather than //runtime/pipeline because it
// uses both //runtime/pipeline and //runtime/fsdp, which sit in the same layer.
//
//   bazel run //bench:pipeline_bench -- [--json] [--quick] [--steps=4] [--rounds=3]
//       [--micro_batches=8] [--stages=2] [--micro_batch_size=1]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/pipeline/stage.h"

ABSL_FLAG(int, steps, 4, "measured steps per configuration (after 1 warm-up step)");
ABSL_FLAG(int, micro_batches, 8, "micro-batches per step (m)");
ABSL_FLAG(int, stages, 2, "pipeline stages = ranks (p)");
ABSL_FLAG(int, micro_batch_size, 1, "sequences per micro-batch");
ABSL_FLAG(int, rounds, 3, "interleaved rounds over all configurations; --quick: 1");

namespace ember {
namespace {

using bench::Median;

model::GptConfig BenchModel() {
  model::GptConfig c;
  c.vocab_size = 256;
  c.context = 64;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 192;
  if (bench::Quick()) {
    c.n_layer = 2;
    c.d_model = 32;
    c.context = 16;
  }
  return c;
}

struct Config {
  std::string name;
  pipeline::ScheduleKind kind = pipeline::ScheduleKind::k1F1B;
  bool preallocate = false;
  bool fsdp = false;  // FSDP over the same ranks instead of a pipeline
};

struct Result {
  std::vector<double> bubble;  // per measured step
  // Per rank, summed over measured steps: compute, waiting for received data, span.
  std::vector<double> compute_s, wait_s, span_s;
  double step_s = 0;           // median over steps of the slowest rank's step time
  int64_t peak_bytes = 0;      // pool peak, max over ranks (pipeline only)
};

int Stages() { return absl::GetFlag(FLAGS_stages); }
int MicroBatches() { return absl::GetFlag(FLAGS_micro_batches); }
int64_t Rows() { return int64_t{MicroBatches()} * absl::GetFlag(FLAGS_micro_batch_size); }

void Batch(int64_t rows, int64_t T, int64_t V, std::vector<int32_t>* tok,
           std::vector<int32_t>* tgt) {
  tok->resize(rows * T);
  tgt->resize(rows * T);
  for (int64_t i = 0; i < rows * T; ++i) {
    (*tok)[i] = static_cast<int32_t>((i * 7919) % V);
    (*tgt)[i] = static_cast<int32_t>(((*tok)[i] * 3 + 1) % V);
  }
}

// Runs in a forked child; writes "peak_bytes" then per step "step_s compute_s span_s wait_s".
absl::Status RankMain(const Config& cfg, int rank, const std::string& dir,
                      const std::string& out) {
  const int world = Stages();
  auto rdzv = comm::MakeFileRendezvous(dir);
  comm::GroupOptions go;
  go.timeout = absl::Minutes(2);
  ASSIGN_OR_RETURN(std::unique_ptr<comm::ProcessGroup> pg,
                   comm::ProcessGroup::Create(rdzv, rank, world, go));
  const model::GptConfig mc = BenchModel();
  const int64_t T = mc.context, mbs = absl::GetFlag(FLAGS_micro_batch_size);
  kernels::ThreadPool threads(1);
  kernels::ExecContext ctx{&threads, false};
  std::vector<int32_t> tok, tgt;
  std::ofstream f(out);
  const int steps = 1 + absl::GetFlag(FLAGS_steps);
  if (cfg.fsdp) {
    fsdp::FsdpOptions o;
    o.seed = 1;
    ASSIGN_OR_RETURN(auto m, fsdp::FsdpGpt::Create(mc, {pg.get(), nullptr}, o));
    const int64_t B = Rows() / world;
    Batch(B, T, mc.vocab_size, &tok, &tgt);
    f << 0 << "\n";
    for (int s = 0; s < steps; ++s) {
      const absl::Time t0 = absl::Now();
      RETURN_IF_ERROR(m->ForwardBackward(ctx, tok.data(), tgt.data(), B, T, true).status());
      RETURN_IF_ERROR(m->OptimizerStep(ctx, 1e-4f).status());
      if (s > 0) f << absl::ToDoubleSeconds(absl::Now() - t0) << " 0 0 0\n";
    }
    return f ? absl::OkStatus() : absl::InternalError("cannot write " + out);
  }
  ASSIGN_OR_RETURN(pipeline::Schedule sched,
                   pipeline::BuildSchedule({cfg.kind, world, world, MicroBatches()}));
  pipeline::PipelineOptions po;
  po.pool.preallocate = cfg.preallocate;
  po.timeout = absl::Minutes(2);
  ASSIGN_OR_RETURN(auto stage, pipeline::PipelineGpt::Create(mc, 1, sched, pg.get(), mbs, T, po));
  Batch(Rows(), T, mc.vocab_size, &tok, &tgt);
  std::vector<std::string> lines;
  for (int s = 0; s < steps; ++s) {
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(stage->Step(ctx, tok.data(), tgt.data()).status());
    const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
    const pipeline::StepTiming& tm = stage->last_step_timing();
    if (s > 0) {
      lines.push_back(absl::StrCat(dt, " ", tm.compute_s, " ", tm.span_s, " ", tm.recv_wait_s));
    }
  }
  f << stage->pool().peak_bytes() << "\n";
  for (const std::string& l : lines) f << l << "\n";
  return f ? absl::OkStatus() : absl::InternalError("cannot write " + out);
}

absl::StatusOr<Result> Run(const Config& cfg) {
  static int n = 0;
  const int world = Stages();
  const std::string dir = absl::StrCat("/tmp/pipeline_bench-", getpid(), "-", n++);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      absl::Status st = RankMain(cfg, r, dir, absl::StrCat(dir, ".rank", r));
      if (!st.ok()) std::fprintf(stderr, "%s rank %d: %s\n", cfg.name.c_str(), r,
                                 st.ToString().c_str());
      _exit(st.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  bool failed = false;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  if (failed) return absl::InternalError(absl::StrCat(cfg.name, ": a rank failed (see stderr)"));
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<std::vector<double>> step(steps), compute(steps), span(steps);
  Result res;
  res.compute_s.assign(world, 0);
  res.wait_s.assign(world, 0);
  res.span_s.assign(world, 0);
  for (int r = 0; r < world; ++r) {
    std::ifstream f(absl::StrCat(dir, ".rank", r));
    int64_t peak = 0;
    f >> peak;
    res.peak_bytes = std::max(res.peak_bytes, peak);
    for (int s = 0; s < steps; ++s) {
      double a = 0, b = 0, c = 0, w = 0;
      f >> a >> b >> c >> w;
      res.compute_s[r] += b;
      res.span_s[r] += c;
      res.wait_s[r] += w;
      step[s].push_back(a);
      compute[s].push_back(b);
      span[s].push_back(c);
    }
    if (!f) return absl::InternalError(absl::StrCat(cfg.name, ": rank ", r, " wrote no result"));
  }
  std::vector<double> step_max;
  for (int s = 0; s < steps; ++s) {
    step_max.push_back(*std::max_element(step[s].begin(), step[s].end()));
    double busy = 0;
    for (double c : compute[s]) busy += c;
    const double wall = *std::max_element(span[s].begin(), span[s].end());
    if (wall > 0) res.bubble.push_back(1.0 - busy / (world * wall));
  }
  res.step_s = Median(step_max);
  return res;
}

int Main(int argc, char** argv) {
  bench::Report report("pipeline_bench", argc, argv);
  if (bench::Quick()) {
    absl::SetFlag(&FLAGS_steps, 1);
    absl::SetFlag(&FLAGS_micro_batches, 4);
  }
  using pipeline::ScheduleKind;
  const Config configs[] = {{"gpipe", ScheduleKind::kGPipe},
                            {"1f1b", ScheduleKind::k1F1B},
                            {"zbh1", ScheduleKind::kZBH1},
                            {"1f1b preallocated", ScheduleKind::k1F1B, true},
                            {"fsdp", ScheduleKind::k1F1B, false, true}};
  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  // Rounds interleave the configurations (A, B, C, A, B, C, ...) so that all see the same load;
  // a configuration's bubble is the median over every measured step of every round, its step
  // time the median of its rounds' medians.
  const int rounds = bench::Quick() ? 1 : std::max(1, absl::GetFlag(FLAGS_rounds));
  std::vector<Result> rs(std::size(configs));
  std::vector<std::vector<double>> step_s(std::size(configs));
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < std::size(configs); ++i) {
      absl::StatusOr<Result> r = Run(configs[i]);
      if (!r.ok()) return report.Fail(r.status());
      rs[i].bubble.insert(rs[i].bubble.end(), r->bubble.begin(), r->bubble.end());
      rs[i].peak_bytes = std::max(rs[i].peak_bytes, r->peak_bytes);
      if (rs[i].compute_s.empty()) {
        rs[i].compute_s = r->compute_s;
        rs[i].wait_s = r->wait_s;
        rs[i].span_s = r->span_s;
      } else {
        for (int k = 0; k < Stages(); ++k) {
          rs[i].compute_s[k] += r->compute_s[k];
          rs[i].wait_s[k] += r->wait_s[k];
          rs[i].span_s[k] += r->span_s[k];
        }
      }
      step_s[i].push_back(r->step_s);
    }
  }
  for (size_t i = 0; i < rs.size(); ++i) rs[i].step_s = Median(step_s[i]);
  const bench::LoadAverage load_end = bench::ReadLoadAverage();
  const int p = Stages(), m = MicroBatches();
  const double theory = static_cast<double>(p - 1) / (m + p - 1);
  const model::GptConfig mc = BenchModel();
  const double tokens = static_cast<double>(Rows() * mc.context);
  // Floats per message crossing a stage boundary: micro_batch_size x T x d_model (f32).
  const int64_t msg_bytes = int64_t{absl::GetFlag(FLAGS_micro_batch_size)} * mc.context *
                            mc.d_model * static_cast<int64_t>(sizeof(float));
  report.SetMeta("stages", json::Value::Int(p));
  report.SetMeta("micro_batches", json::Value::Int(m));
  report.SetMeta("micro_batch_size", json::Value::Int(absl::GetFlag(FLAGS_micro_batch_size)));
  report.SetMeta("steps", json::Value::Int(absl::GetFlag(FLAGS_steps)));
  report.SetMeta("rounds", json::Value::Int(rounds));
  report.SetMeta("model", json::Value::Str(absl::StrCat(
      "vocab ", mc.vocab_size, ", T ", mc.context, ", ", mc.n_layer, " layers, width ",
      mc.d_model)));

  bench::Table& t = report.AddTable(
      absl::StrCat("Pipeline, measured: ", p, " ranks, ", m, " micro-batches, ", rounds,
                   " interleaved rounds of ", absl::GetFlag(FLAGS_steps),
                   " steps after 1 warm-up"),
      {"config", "bubble", "theory", "step ms", "tok/s", "peak pool bytes"});
  t.SetLoad(load_begin, load_end);
  t.AddNote("bubble: 1 - sum of ranks' compute time (F, B, I, W) / (ranks x longest span from "
            "step start to a rank's last compute); theory (p-1)/(m+p-1) for GPipe and 1F1B, "
            "(p-1)/(3m+p-1) for ZB-H1 when F = I = W");
  t.AddNote("peak pool bytes: the rank's receive and send buffers at their peak, max over ranks");
  t.AddNote(absl::StrCat("one message (activation or gradient of a micro-batch) = ", msg_bytes,
                         " bytes; a GPipe-style peer pre-allocating one receive buffer per "
                         "in-flight micro-batch holds m x that = ", m * msg_bytes, " bytes"));
  t.AddNote("fsdp: FsdpGpt over the same 2 ranks, same model and global batch (no pipeline)");
  const double zb_theory = static_cast<double>(p - 1) / (3 * m + p - 1);
  for (size_t i = 0; i < rs.size(); ++i) {
    const bool pipe = !configs[i].fsdp;
    bench::Cell th = !pipe ? bench::Cell()
                     : configs[i].kind == ScheduleKind::kZBH1 ? bench::Cell(zb_theory)
                                                              : bench::Cell(theory);
    t.AddRow({configs[i].name, pipe ? bench::Cell(Median(rs[i].bubble)) : bench::Cell(), th,
              rs[i].step_s * 1e3, tokens / rs[i].step_s,
              pipe ? bench::Cell(rs[i].peak_bytes) : bench::Cell()});
  }
  bench::Table& w = report.AddTable(
      "Where each rank's step went (ms per step, mean over all measured steps)",
      {"config", "rank", "compute", "waiting for input", "other", "span"});
  w.SetLoad(load_begin, load_end);
  w.AddNote("compute: F, B, I, W less their waits; waiting for input: a compute blocked on its "
            "received activation or gradient; other: span - compute - waiting (sends, pool, "
            "receive posting, scheduling)");
  const double measured = static_cast<double>(rounds) * absl::GetFlag(FLAGS_steps);
  for (size_t i = 0; i < rs.size(); ++i) {
    if (configs[i].fsdp) continue;
    for (int k = 0; k < p; ++k) {
      const double c = 1e3 * rs[i].compute_s[k] / measured, wt = 1e3 * rs[i].wait_s[k] / measured,
                   sp = 1e3 * rs[i].span_s[k] / measured;
      w.AddRow({configs[i].name, k, c, wt, sp - c - wt, sp});
    }
  }
  const std::string per_step = "median over steps of 1 - busy / (ranks x span)";
  const std::string vs_theory = absl::StrCat(
      "compared: ours = the measured bubble; peer = the formula (p-1)/(m+p-1) for equal stages "
      "(issue 37's goal: <= 1.3x theory); p = ", p, ", m = ", m, "; ", per_step);
  report.AddTarget(bench::Target::VsPeer("bubble_gpipe_vs_theory", Median(rs[0].bubble), theory,
                                         1.3, bench::kLowerIsBetter, "fraction", "", vs_theory));
  report.AddTarget(bench::Target::VsPeer("bubble_1f1b_vs_theory", Median(rs[1].bubble), theory,
                                         1.3, bench::kLowerIsBetter, "fraction", "", vs_theory));
  report.AddTarget(bench::Target::VsPeer(
      "bubble_zbh1_vs_1f1b", Median(rs[2].bubble), Median(rs[1].bubble), 1.0,
      bench::kLowerIsBetter, "fraction", "",
      "compared: both sides are our own executor, a schedule comparison (issue 37's goal: ZB-H1 "
      "below 1F1B); same p, m; ZB-H1 runs input-grad (I) and weight-grad (W) as separate computes"));
  report.AddTarget(bench::Target::VsPeer(
      "peak_buffer_bytes_1f1b_jit_vs_gpipe_m_recv_buffers", static_cast<double>(rs[1].peak_bytes),
      static_cast<double>(m * msg_bytes), 0.5, bench::kLowerIsBetter, "bytes", "",
      absl::StrCat("compared: ours = the measured buffer pool peak of 1F1B (receive + send "
                   "buffers), max over ranks; peer = computed, not measured: m = ", m,
                   " receive buffers of one message (", msg_bytes, " bytes) each, what a GPipe "
                   "implementation pre-allocating one receive buffer per in-flight micro-batch "
                   "holds (its send buffers not counted); same p = ", p, ", m, model")));
  report.AddTarget(bench::Target::VsPeer(
      "peak_buffer_bytes_1f1b_jit_vs_preallocated_strawman", static_cast<double>(rs[1].peak_bytes),
      static_cast<double>(rs[3].peak_bytes), 0.5, bench::kLowerIsBetter, "bytes", "",
      "informational: the peer is our own preallocate mode, one buffer per send and per receive "
      "of the schedule (2m), a strawman no real implementation uses, so the ratio is about "
      "depth/2m by construction; buffer pool peak (receive + send buffers), max over ranks"));
  report.AddTarget(bench::Target::VsPeer(
      "tokens_per_s_pp2_1f1b_vs_fsdp2", tokens / rs[1].step_s, tokens / rs[4].step_s, 0.5,
      bench::kHigherIsBetter, "tok/s", "",
      "informational: both sides are our own runtime (FsdpGpt is the peer) and the 0.5 floor was "
      "set by us; compared: same model, global batch, 2 ranks and 1 compute thread per rank on "
      "both; a floor, not a claim of speed: same FLOPs, PP pays the bubble and activation copies, "
      "FSDP all-gathers and reduce-scatters; below 0.5 would mean the executor itself is slow"));
  return report.Finish();
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "pipeline_bench");
  return ember::Main(argc, argv);
}
