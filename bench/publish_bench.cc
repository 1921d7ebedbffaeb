// publish_bench: what live weight publishing costs the training loop (issue 16). One in-process
// daemon (hosting the store) with 2 CPU slots runs a 2-rank job of the real ember-worker (GPT
// d_model 128, 4 layers, context 64: about 0.9 M parameters, 3.6 MB published per step), alternately
// without publishing and with publish.every_steps = --every and a subscriber attached through
// ember::Client::SubscribeWeights (what `emberctl weights subscribe` runs). Measured, per job:
//
//   step_s   the median over the job's publish periods (--every steps each, from step --skip on)
//            of their wall time per step, from the unix_ms that rank 0 writes in its metrics line
//            at every step (runtime/worker/step_io.cc). A period holds exactly one publish (the
//            hook's all-reduce and shard copy, the transfer, the subscriber's write), so the median
//            keeps the publishing cost and drops the periods a neighbour's burst on the shared
//            machine lengthened. Start-up, the subscriber's connect and the first publish fall
//            before --skip. The job's progress is not polled while it runs (the RPCs cost CPU).
//
// Target: with-subscriber / without <= 1.05, as the geometric mean of the rounds' ratios. Each
// round runs the pair back to back, in alternating order (without first in even rounds), so drift
// in the machine's load affects both arms alike, and a job that runs second in its pair being
// slower cancels in the geometric mean of an even number of rounds. The table adds the median,
// quartiles and min-max of the ratios and the ratio of the arms' medians. A round with a subscriber
// counts only if its first snapshot came before the measured window. --subscriber=false publishes
// with no subscriber attached (the cost of the publisher alone: its agent, thread and agreement).
//
// The bench's UCX_* variables (UCX_TLS=tcp, ...) are passed to the ranks as well.
//
//   bazel run -c opt //bench:publish_bench -- [--json] [--rounds=6] [--steps=90] [--quick]
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/daemon/series.h"
#include "testing/cluster.h"
#include "testing/harness.h"

ABSL_FLAG(int, rounds, 6,
          "interleaved pairs of jobs (without and with a subscriber; the order alternates per round)");
ABSL_FLAG(double, settle_s, 1, "pause before each job (the previous job's processes finish exiting)");
ABSL_FLAG(int, steps, 90, "steps of each job");
ABSL_FLAG(int, skip, 15, "steps left out at the start of each job (start-up, connect, first publish)");
ABSL_FLAG(int, every, 5, "publish.every_steps of the job with a subscriber, and the period measured");
ABSL_FLAG(bool, subscriber, true, "attach a subscriber to the publishing job (false: publish to none)");

namespace ember {
namespace {

// `subscribed`: a subscriber attaches right after the submit; the ranks wait (bounded) for it
// before step 1 (publish.wait_for_subscribers), so a slow connect on a loaded machine cannot leave
// the measured window without snapshots. The wait is before the first step, outside the window.
std::string BenchSpec(const std::string& name, int steps, int every, bool subscribed) {
  return absl::StrCat(
      "name: ", name, "\n",
      "model: {vocab_size: 256, context_length: 64, n_layers: 4, n_heads: 4, d_model: 128}\n",
      "data: {text_path: data/tiny_corpus.txt}\n",
      "optimizer: {lr: 0.003, schedule: constant}\n",
      "parallelism: {strategy: fsdp, world_size: 2}\n",
      "resources: {device_type: cpu}\n", "steps: ", steps, "\nbatch_size: 4\nseed: 1\n",
      "threads: 1\nlog_every: 1\n",
      every > 0 ? absl::StrCat("publish: {every_steps: ", every,
                               subscribed ? ", wait_for_subscribers: 1, wait_timeout_s: 60" : "", "}\n")
                : "");
}

struct Run {
  std::vector<std::string> publisher_lines;  // each rank's exit line of its publisher (logs)
  double step_s = -1;       // median over the measured periods, per step
  double mean_step_s = -1;  // the whole measured window, per step
  int periods = 0;
  int64_t snapshots = 0, first_snapshot = -1;
  bool ok = false;
  std::string error;
};

// step -> unix_ms from rank 0's metrics lines (the last attempt's, the only one here).
std::map<int64_t, double> StepTimes(const std::string& job_dir) {
  std::map<int64_t, double> out;
  std::ifstream f(absl::StrCat(job_dir, "/metrics/rank-0.jsonl"));
  std::string line;
  while (std::getline(f, line)) {
    std::optional<double> step = daemon::LineNumber(line, "step"), ms = daemon::LineNumber(line, "unix_ms");
    if (step && ms) out[static_cast<int64_t>(*step)] = *ms;
  }
  return out;
}

// One job; with `store` non-empty, a subscriber attached for its whole life.
Run Measure(Client& c, const std::string& store, const std::string& name, const std::string& out,
            bool publish) {
  Run run;
  const int steps = absl::GetFlag(FLAGS_steps), every = absl::GetFlag(FLAGS_every);
  const int from = (absl::GetFlag(FLAGS_skip) + every - 1) / every * every;  // a period boundary
  auto r = c.Submit(BenchSpec(name, steps, publish ? every : 0, !store.empty()), "",
                    {{"data/tiny_corpus.txt", recovery::Corpus()}});
  if (!r.ok()) {
    run.error = absl::StrCat("submit: ", r.status().ToString());
    return run;
  }
  const std::string id = r->job().id();
  std::atomic<int64_t> first{-1}, written{0};
  std::thread subscriber;
  if (!store.empty()) {
    subscriber = std::thread([&] {
      pthread_setname_np(pthread_self(), "subscriber");  // its CPU apart from the daemon's in top -H
      auto n = c.SubscribeWeights(id, store, out, 0, [&](int64_t step, const std::string&) {
        int64_t none = -1;
        first.compare_exchange_strong(none, step);
        ++written;
      });
      if (!n.ok()) std::fprintf(stderr, "subscriber: %s\n", n.status().ToString().c_str());
    });
  }
  auto end = c.Wait(id, absl::Seconds(180));
  if (subscriber.joinable()) subscriber.join();
  run.snapshots = written.load();
  run.first_snapshot = first.load();
  if (!end.ok() || end->state() != jobs::v1::SUCCEEDED) {
    run.error = absl::StrCat("job ", id, " did not succeed: ", end.ok() ? end->reason() : end.status().ToString());
    return run;
  }
  if (!store.empty() && (run.first_snapshot < 0 || run.first_snapshot > from)) {
    run.error = absl::StrCat("the subscriber's first snapshot (step ", run.first_snapshot,
                             ") came after the measured window's start (step ", from, "): raise --skip");
    return run;
  }
  for (int rank = 0; rank < 2; ++rank) {  // what publishing cost each rank's threads
    std::ifstream log(absl::StrCat(end->job_dir(), "/logs/rank-", rank, ".log"));
    std::string line;
    while (std::getline(log, line)) {
      if (absl::StrContains(line, "weights published")) run.publisher_lines.push_back(line);
    }
  }
  const std::map<int64_t, double> t = StepTimes(end->job_dir());
  std::vector<double> per_step;
  for (int64_t s = from; s + every <= steps; s += every) {
    auto a = t.find(s), b = t.find(s + every);
    if (a != t.end() && b != t.end()) per_step.push_back((b->second - a->second) / 1e3 / every);
  }
  auto a = t.find(from);
  auto b = t.rbegin();
  if (per_step.empty() || a == t.end() || b->first <= from) {
    run.error = absl::StrCat("rank 0's metrics in ", end->job_dir(), " lack steps ", from, "..", steps);
    return run;
  }
  run.periods = static_cast<int>(per_step.size());
  run.step_s = bench::Median(per_step);
  run.mean_step_s = (b->second - a->second) / 1e3 / static_cast<double>(b->first - from);
  run.ok = true;
  return run;
}

int Main(int argc, char** argv) {
  bench::Report report("publish_bench", argc, argv);
  if (bench::Quick()) {
    absl::SetFlag(&FLAGS_rounds, 1);
    absl::SetFlag(&FLAGS_steps, 16);
    absl::SetFlag(&FLAGS_every, 2);
    absl::SetFlag(&FLAGS_skip, 8);
  }
  const bool attach = absl::GetFlag(FLAGS_subscriber);
  e2e::ClusterOptions o;
  o.nodes = 1;
  o.slots = 2;
  o.worker = recovery::Runfile(argv[0], "runtime/worker/ember-worker");
  for (char** e = environ; *e != nullptr; ++e) {  // UCX_TLS=tcp etc. reach the ranks too
    absl::string_view kv(*e);
    if (absl::StartsWith(kv, "UCX_") && kv.find('=') != absl::string_view::npos) {
      o.worker_env.push_back({std::string(kv.substr(0, kv.find('='))), std::string(kv.substr(kv.find('=') + 1))});
    }
  }
  recovery::EnterRunfiles(argv[0]);
  auto cluster = e2e::TestCluster::Start(o);
  if (!cluster.ok()) return report.Fail(cluster.status());
  auto c = (*cluster)->Connect(0);
  if (!c.ok()) return report.Fail(c.status());
  const std::string store = (*cluster)->node(0)->store_address();
  const bench::LoadAverage load_begin = bench::ReadLoadAverage();
  const int every = absl::GetFlag(FLAGS_every);
  const int from = (absl::GetFlag(FLAGS_skip) + every - 1) / every * every;
  bench::Table& table = report.AddTable(
      absl::StrFormat("2 ranks, %d steps (measured from step %d), publish every %d steps to %s vs "
                      "no publishing", absl::GetFlag(FLAGS_steps), from, every,
                      attach ? "1 subscriber" : "no subscriber"),
      {"round", "without: step s", "with subscriber: step s", "ratio", "mean ratio", "snapshots written"});
  std::vector<double> without, with, ratio, mean_ratio;
  for (int i = 0; i < absl::GetFlag(FLAGS_rounds); ++i) {
    Run a, b;
    auto off = [&] {
      absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_settle_s)));
      a = Measure(*c, "", absl::StrCat("bench-off-", i), "", false);
    };
    auto on = [&] {
      absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_settle_s)));
      b = Measure(*c, attach ? store : "", absl::StrCat("bench-on-", i),
                  absl::StrCat((*cluster)->work_root(), "/snap-", i), true);
    };
    if (i % 2 == 0) {
      off();
      on();
    } else {
      on();
      off();
    }
    if (!a.ok || !b.ok) {
      return report.Fail(absl::InternalError(absl::StrCat("round ", i, " failed: ", a.ok ? b.error : a.error)));
    }
    without.push_back(a.step_s);
    with.push_back(b.step_s);
    ratio.push_back(b.step_s / a.step_s);
    mean_ratio.push_back(b.mean_step_s / a.mean_step_s);
    table.AddRow({i, a.step_s, b.step_s, ratio.back(), mean_ratio.back(), b.snapshots});
    for (const std::string& line : b.publisher_lines) std::fprintf(stderr, "round %d: %s\n", i, line.c_str());
    if (i + 1 == absl::GetFlag(FLAGS_rounds)) {
      for (const std::string& line : b.publisher_lines) table.AddNote(absl::StrCat("last round's log: ", line));
    }
  }
  auto geomean = [](const std::vector<double>& v) {
    double log_sum = 0;
    for (double r : v) log_sum += std::log(r);
    return std::exp(log_sum / v.size());
  };
  table.AddRow({"median", bench::Median(without), bench::Median(with), bench::Median(ratio),
                bench::Median(mean_ratio), bench::Cell()});
  std::vector<double> sorted = ratio;
  std::sort(sorted.begin(), sorted.end());
  auto quantile = [&](double q) { return sorted[static_cast<size_t>(q * (sorted.size() - 1) + 0.5)]; };
  table.AddRow({"ratio quartiles", bench::Cell(), bench::Cell(),
                absl::StrFormat("%.3f-%.3f", quantile(0.25), quantile(0.75)), bench::Cell(), bench::Cell()});
  table.AddRow({"ratio min-max", bench::Cell(), bench::Cell(),
                absl::StrFormat("%.3f-%.3f", sorted.front(), sorted.back()), bench::Cell(), bench::Cell()});
  table.AddRow({"geometric mean", bench::Cell(), bench::Cell(), geomean(ratio), geomean(mean_ratio), bench::Cell()});
  table.AddRow({"median with / median without", bench::Cell(), bench::Cell(),
                bench::Median(with) / bench::Median(without), bench::Cell(), bench::Cell()});
  table.SetLoad(load_begin, bench::ReadLoadAverage());
  table.AddNote("each round runs the two jobs back to back, without first in even rounds and with "
                "first in odd ones; ratio = with / without of the same round; step s = median over "
                "the job's publish periods of wall time per step (rank 0's metrics); mean ratio: the "
                "same from each job's whole measured window");
  report.AddTarget(bench::Target::Absolute(
      "step_time_with_subscriber_ratio", geomean(ratio), 1.05, bench::kLowerIsBetter, "x",
      absl::StrFormat("geometric mean over %d interleaved rounds (alternating order) of "
                      "with/without, each the median over publish periods from step %d; median "
                      "%.3f, quartiles %.3f-%.3f, min-max %.3f-%.3f; whole-window means: geometric "
                      "mean %.3f%s",
                      static_cast<int>(ratio.size()), from, bench::Median(ratio), quantile(0.25),
                      quantile(0.75), sorted.front(), sorted.back(), geomean(mean_ratio),
                      attach ? "" : "; NO subscriber attached (--subscriber=false)")));
  return report.Finish();
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "publish_bench");
  return ember::Main(argc, argv);
}
