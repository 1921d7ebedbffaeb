// emberctl plot (a metric's curve: SVG, PNG or braille on the terminal) and emberctl top (a live
// per-rank table).
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "launcher/cli.h"
#include "launcher/plot.h"
#include "runtime/daemon/series.h"

namespace ember::cli {
namespace {

namespace v1 = ::ember::jobs::v1;

int TerminalColumns() {
  struct winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char* c = std::getenv("COLUMNS");
  return c && std::atoi(c) > 0 ? std::atoi(c) : 80;
}

std::string Human(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.1fG", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.1fM", bytes / 1e6);
  return absl::StrFormat("%.0fK", bytes / 1e3);
}

plot::Chart SeriesChart(const v1::Series& s, const std::string& job, int only_rank) {
  plot::Chart c{.title = absl::StrCat(s.metric(), ": ", job), .x_label = "step",
                .y_label = s.metric()};
  for (const v1::RankSeries& r : s.ranks()) {
    if (r.step_size() == 0 || (only_rank >= 0 && r.rank() != only_rank)) continue;
    plot::Line l{.label = absl::StrCat("rank ", r.rank())};
    l.x.assign(r.step().begin(), r.step().end());
    l.y.assign(r.last().begin(), r.last().end());
    bool coarse = false;  // a band only where buckets hold several steps
    for (int i = 0; i < r.step_size(); ++i) coarse |= r.first_step(i) != r.step(i);
    if (coarse) {
      l.lo.assign(r.min().begin(), r.min().end());
      l.hi.assign(r.max().begin(), r.max().end());
    }
    c.lines.push_back(std::move(l));
  }
  return c;
}

// One frame of `top`: a header per job and a row per rank.
std::string TopFrame(const std::string& id, const v1::MetricsUpdate& u);

}  // namespace

int RunPlot(Ctl& ctl) {
  const std::string job = ctl.rest()[0];
  const std::string out = ctl.args().Get("--out");
  int rank = -1, attempt = -1, max_points = 0;
  if (!ctl.IntOption("--rank", 0, &rank) || !ctl.IntOption("--attempt", 0, &attempt) ||
      !ctl.IntOption("--max-points", 1, &max_points)) {
    return kUsage;
  }
  const bool svg = absl::EndsWith(out, ".svg"), png = absl::EndsWith(out, ".png");
  if (!out.empty() && !svg && !png) {
    return ctl.UsageError(absl::StrCat("--out ", out, ": the file name must end in .svg or .png"));
  }
  auto metric = daemon::CanonicalMetric(ctl.args().Get("--metric", "loss"));
  if (!metric.ok()) return ctl.UsageError(std::string(metric.status().message()));
  const int cols = std::clamp(TerminalColumns(), 40, 400);
  if (max_points == 0) max_points = out.empty() ? 2 * cols : 2000;
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  auto series = c->GetSeries(job, *metric, max_points, attempt);
  if (!series.ok()) return ctl.Fail(series.status());
  if (ctl.json() || ctl.args().Has("--json")) {
    std::cout << Ctl::ToJson(*series) << "\n";
    return kOk;
  }
  plot::Chart chart = SeriesChart(*series, job, rank);
  if (chart.lines.empty()) {
    return ctl.Fail(absl::FailedPreconditionError(absl::StrCat(
        "job ", job, " has no ", *metric, " points yet (", rank >= 0 ? "rank " : "any rank",
        rank >= 0 ? absl::StrCat(rank) : "", "); its ranks write metrics every log_every steps")));
  }
  if (out.empty()) {
    std::cout << plot::RenderBraille(chart, cols, 20, isatty(STDOUT_FILENO));
    return kOk;
  }
  const std::string path = Ctl::UserPath(out);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << (svg ? plot::RenderSvg(chart) : plot::RenderPng(chart));
  f.close();
  if (!f) return ctl.Fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", path)));
  std::cerr << "wrote " << path << "\n";
  return kOk;
}

namespace {
std::string TopFrame(const std::string& id, const v1::MetricsUpdate& u) {
  std::string s = absl::StrFormat("%s  %s  attempt %d%s\n", id, v1::JobState_Name(u.state()),
                                  u.attempt(), u.reason().empty() ? "" : "  (" + u.reason() + ")");
  std::vector<daemon::RecentStats> stats;
  for (const auto& [r, p] : u.ranks()) {
    const v1::StepMetrics& m = p.metrics();
    daemon::RecentStats st;
    st.lines = m.step() > 0 ? 1 : 0;
    st.step = m.step();
    st.busy_s = std::max(0.0, m.step_s() - m.comm_wait_s());
    stats.push_back(st);
  }
  const std::vector<bool> slow = daemon::FindStragglers(stats);
  s += absl::StrFormat("  %4s %8s %10s %10s %10s %9s %8s\n", "RANK", "STEP", "STEP TIME",
                       "COMM WAIT", "TOK/S", "LOSS", "MEM");
  size_t i = 0;
  for (const auto& [r, p] : u.ranks()) {
    const v1::StepMetrics& m = p.metrics();
    const double wait_pct = m.step_s() > 0 ? 100 * m.comm_wait_s() / m.step_s() : 0;
    s += absl::StrFormat("  %4d %8d %9.1fms %9.0f%% %10.0f %9.4f %8s%s\n", r, m.step(),
                         1e3 * m.step_s(), wait_pct, m.tokens_per_s(), m.loss(),
                         Human(m.peak_rss_bytes()), slow[i++] ? "  straggler" : "");
  }
  if (u.ranks().empty()) s += "  (no rank has reported yet)\n";
  return s;
}
}  // namespace

int RunTop(Ctl& ctl) {
  int interval = 1000;
  if (!ctl.IntOption("--interval-ms", 100, &interval)) return kUsage;
  const bool once = ctl.args().Has("--once") || ctl.json();
  auto c = ctl.Connect();
  if (!c.ok()) return ctl.Fail(c.status());
  const bool tty = isatty(STDOUT_FILENO) && !once;
  if (tty) std::cout << "\x1b[?25l";  // hide the cursor while redrawing
  int rc = kOk;
  for (;;) {
    std::vector<std::string> ids;
    if (!ctl.rest().empty()) {
      ids.push_back(ctl.rest()[0]);
    } else {
      auto jobs = c->List(/*active_only=*/true, 0);
      if (!jobs.ok()) { rc = ctl.Fail(jobs.status()); break; }
      for (const auto& j : *jobs) ids.push_back(j.id());
    }
    std::string frame;
    bool all_ended = !ids.empty();
    for (const std::string& id : ids) {
      v1::MetricsUpdate last;
      absl::Status s = c->StreamMetrics(id, /*follow=*/false, 0, [&](const v1::MetricsUpdate& u) {
        last = u;
        return false;
      });
      if (!s.ok()) { rc = ctl.Fail(s); break; }
      if (ctl.json()) {
        std::cout << Ctl::ToJson(last) << "\n";
      } else {
        frame += TopFrame(id, last) + "\n";
      }
      all_ended &= IsTerminalState(last.state());
    }
    if (rc != kOk) break;
    if (ids.empty() && !ctl.json()) frame = "no active jobs\n";
    if (tty) {  // redraw in place: home, each line cleared to its end, then the rest cleared
      std::string painted;
      std::istringstream lines(frame);
      for (std::string l; std::getline(lines, l);) painted += l + "\x1b[K\n";
      std::cout << "\x1b[H" << painted << "\x1b[J" << std::flush;
    } else if (!ctl.json()) {
      std::cout << frame << std::flush;
    }
    if (once || (all_ended && !ctl.rest().empty()) || Interrupted()) break;
    for (absl::Time until = absl::Now() + absl::Milliseconds(interval);
         absl::Now() < until && !Interrupted();) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (Interrupted()) break;
  }
  if (tty) std::cout << "\x1b[?25h" << std::flush;
  return rc;
}

}  // namespace ember::cli
