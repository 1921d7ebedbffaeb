#include "bench/report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

ABSL_FLAG(bool, json, false,
          "print exactly one JSON object on stdout (tables, load, targets); all else to stderr");
ABSL_FLAG(bool, allow_missing_peers, false,
          "with --json: exit 0 even when a peer did not run (its targets are reported as not "
          "measured either way)");
ABSL_FLAG(bool, quick, false, "smoke run: small sizes and short windows (seconds per benchmark)");

namespace ember::bench {

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

LoadAverage ReadLoadAverage() {
  LoadAverage l;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &l.m1, &l.m5, &l.m15) != 3) l = LoadAverage();
    std::fclose(f);
  }
  return l;
}

bool Quick() { return absl::GetFlag(FLAGS_quick); }

namespace {

std::string Num(double d) {
  if (!std::isfinite(d)) return "-";
  double a = std::fabs(d);
  if (a >= 1e5) return absl::StrFormat("%.0f", d);
  if (a >= 100) return absl::StrFormat("%.1f", d);
  if (a >= 1) return absl::StrFormat("%.2f", d);
  if (a == 0) return "0";
  return absl::StrFormat("%.3g", d);
}

// Finite numbers to 7 significant digits (more is noise in a timing); NaN/inf become null.
json::Value Number(double d) {
  if (!std::isfinite(d)) return json::Value();
  return json::Value::Double(std::strtod(absl::StrFormat("%.7g", d).c_str(), nullptr));
}

json::Value LoadJson(const LoadAverage& l) {
  json::Value v = json::Value::MakeObject();
  v.Set("1m", Number(l.m1));
  v.Set("5m", Number(l.m5));
  v.Set("15m", Number(l.m15));
  return v;
}

std::string LoadText(const LoadAverage& l) {
  return absl::StrFormat("%.2f %.2f %.2f", l.m1, l.m5, l.m15);
}

}  // namespace

std::string Cell::Text() const {
  if (auto* s = std::get_if<std::string>(&v_)) return *s;
  if (auto* i = std::get_if<int64_t>(&v_)) return absl::StrCat(*i);
  if (auto* d = std::get_if<double>(&v_)) return Num(*d);
  return "-";
}

json::Value Cell::Json() const {
  if (auto* s = std::get_if<std::string>(&v_)) return json::Value::Str(*s);
  if (auto* i = std::get_if<int64_t>(&v_)) return json::Value::Int(*i);
  if (auto* d = std::get_if<double>(&v_)) return Number(*d);
  return json::Value();
}

Table::Table(std::string title, std::vector<std::string> columns)
    : title_(std::move(title)), columns_(std::move(columns)), load_begin_(ReadLoadAverage()),
      load_end_(load_begin_) {}

void Table::AddRow(std::vector<Cell> cells) {
  cells.resize(columns_.size());
  rows_.push_back(std::move(cells));
  if (!load_fixed_) load_end_ = ReadLoadAverage();
}

std::string Table::Text() const {
  std::vector<size_t> w(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) w[c] = columns_[c].size();
  std::vector<std::vector<std::string>> text;
  for (const auto& row : rows_) {
    text.emplace_back();
    for (size_t c = 0; c < row.size(); ++c) {
      text.back().push_back(row[c].Text());
      w[c] = std::max(w[c], text.back().back().size());
    }
  }
  std::string out = absl::StrFormat("# %s   (load average %s at start, %s at end)\n", title_,
                                    LoadText(load_begin_), LoadText(load_end_));
  auto line = [&](const std::vector<std::string>& cells, bool first_left) {
    for (size_t c = 0; c < cells.size(); ++c) {
      bool left = c == 0 && first_left;
      absl::StrAppend(&out, c ? "  " : "",
                      left ? absl::StrFormat("%-*s", w[c], cells[c])
                           : absl::StrFormat("%*s", w[c], cells[c]));
    }
    out += "\n";
  };
  line(columns_, true);
  for (const auto& r : text) line(r, true);
  for (const auto& n : notes_) absl::StrAppend(&out, "  note: ", n, "\n");
  return out;
}

json::Value Table::Json() const {
  json::Value t = json::Value::MakeObject();
  t.Set("title", json::Value::Str(title_));
  json::Value cols = json::Value::MakeArray();
  for (const auto& c : columns_) cols.Push(json::Value::Str(c));
  t.Set("columns", std::move(cols));
  json::Value rows = json::Value::MakeArray();
  for (const auto& r : rows_) {
    json::Value row = json::Value::MakeArray();
    for (const auto& c : r) row.Push(c.Json());
    rows.Push(std::move(row));
  }
  t.Set("rows", std::move(rows));
  t.Set("load_begin", LoadJson(load_begin_));
  t.Set("load_end", LoadJson(load_end_));
  json::Value notes = json::Value::MakeArray();
  for (const auto& n : notes_) notes.Push(json::Value::Str(n));
  t.Set("notes", std::move(notes));
  return t;
}

Target Target::VsPeer(std::string name, double value, std::optional<double> peer, double goal,
                      bool higher_is_better, std::string unit, std::string reason_if_missing,
                      std::string note) {
  Target t;
  t.name = std::move(name);
  t.value = value;
  if (peer && std::isfinite(*peer) && *peer > 0) t.peer = peer;
  t.vs_peer = true;
  t.goal = goal;
  t.higher_is_better = higher_is_better;
  t.unit = std::move(unit);
  if (!t.peer) {
    t.reason = reason_if_missing.empty() ? "the peer did not run" : std::move(reason_if_missing);
    if (peer) absl::StrAppend(&t.reason, " (peer figure ", *peer, " is not a usable measurement)");
  }
  t.note = std::move(note);
  return t;
}

Target Target::Absolute(std::string name, double value, double goal, bool higher_is_better,
                        std::string unit, std::string note) {
  Target t;
  t.name = std::move(name);
  t.value = value;
  t.goal = goal;
  t.higher_is_better = higher_is_better;
  t.unit = std::move(unit);
  t.note = std::move(note);
  return t;
}

std::optional<double> Target::compared() const {
  if (!std::isfinite(value)) return std::nullopt;
  if (!vs_peer) return value;
  if (!peer) return std::nullopt;
  return value / *peer;
}

bool Target::met() const {
  std::optional<double> c = compared();
  if (!c || failed_measurement()) return false;
  return higher_is_better ? *c >= goal : *c <= goal;
}

bool Target::failed_measurement() const {
  // A lower-is-better time, size or ratio of 0 (or below) is a measurement that did not happen
  // (a timer that never started, a peer that did nothing), never a win.
  std::optional<double> c = compared();
  return c && !higher_is_better && (value <= 0 || *c <= 0);
}

std::string Target::Status() const {
  std::optional<double> c = compared();
  if (!c) return absl::StrCat("not measured: ", reason.empty() ? "no value" : reason);
  if (failed_measurement()) return "not measured: a lower-is-better value of 0 or less is a failed measurement";
  if (met()) return "met";
  // How far from the goal, relative to the goal: 1.6x vs >= 2x is "20% short".
  double off = goal != 0 ? std::fabs(*c - goal) / std::fabs(goal) * 100 : std::fabs(*c);
  return absl::StrFormat("missed by %.1f%%", off);
}

json::Value Target::Json() const {
  json::Value t = json::Value::MakeObject();
  t.Set("name", json::Value::Str(name));
  t.Set("value", Number(value));
  t.Set("peer", peer ? Number(*peer) : json::Value());
  t.Set("goal", json::Value::Double(goal));
  t.Set("goal_applies_to", json::Value::Str(vs_peer ? "value/peer" : "value"));
  t.Set("higher_is_better", json::Value::Bool(higher_is_better));
  t.Set("unit", json::Value::Str(unit));
  std::optional<double> c = compared();
  t.Set("compared", c ? Number(*c) : json::Value());
  t.Set("met", json::Value::Bool(met()));
  t.Set("status", json::Value::Str(Status()));
  t.Set("reason", measured() ? json::Value() : json::Value::Str(reason));
  t.Set("note", json::Value::Str(note));
  return t;
}

Report::Report(std::string benchmark, int argc, char** argv)
    : benchmark_(std::move(benchmark)),
      json_(absl::GetFlag(FLAGS_json)),
      allow_missing_(absl::GetFlag(FLAGS_allow_missing_peers)),
      load_begin_(ReadLoadAverage()) {
  std::vector<std::string> args(argv, argv + argc);
  command_ = absl::StrJoin(args, " ");
  if (json_) {
    // Keep stdout for the one JSON object: everything else written to fd 1 (our printf, logs,
    // children and peers that inherit it) lands on stderr.
    std::fflush(stdout);
    int fd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (fd >= 0 && dup2(2, 1) >= 0) out_fd_ = fd;
  }
}

Table& Report::AddTable(std::string title, std::vector<std::string> columns) {
  tables_.push_back(std::make_unique<Table>(std::move(title), std::move(columns)));
  return *tables_.back();
}

int Report::Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s: FAILED: %s\n", benchmark_.c_str(), s.ToString().c_str());
  return 1;
}

int Report::Finish() {
  int missing = 0;
  for (const Target& t : targets_) missing += !t.measured();
  const LoadAverage load_end = ReadLoadAverage();
  if (!json_) {
    std::string out = absl::StrFormat("%s: %s\n", benchmark_, command_);
    for (const auto& [k, v] : meta_.object()) absl::StrAppend(&out, k, ": ", json::Write(v), "\n");
    for (const auto& t : tables_) absl::StrAppend(&out, "\n", t->Text());
    if (!targets_.empty()) {
      Table summary("targets", {"target", "value", "peer", "compared", "goal", "unit", "status"});
      for (const Target& t : targets_) {
        summary.AddRow({t.name, t.value, t.peer, t.compared(),
                        absl::StrCat(t.higher_is_better ? ">= " : "<= ", Num(t.goal),
                                     t.vs_peer ? " x peer" : ""),
                        t.unit, t.Status()});
      }
      absl::StrAppend(&out, "\n", summary.Text());
    }
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
    return 0;
  }
  json::Value root = json::Value::MakeObject();
  root.Set("benchmark", json::Value::Str(benchmark_));
  root.Set("command", json::Value::Str(command_));
  root.Set("quick", json::Value::Bool(Quick()));
  root.Set("load_begin", LoadJson(load_begin_));
  root.Set("load_end", LoadJson(load_end));
  json::Value tables = json::Value::MakeArray();
  for (const auto& t : tables_) tables.Push(t->Json());
  root.Set("tables", std::move(tables));
  json::Value targets = json::Value::MakeArray();
  for (const Target& t : targets_) targets.Push(t.Json());
  root.Set("targets", std::move(targets));
  root.Set("meta", meta_);
  std::string text = json::Write(root) + "\n";
  for (size_t off = 0; off < text.size();) {
    ssize_t k = write(out_fd_, text.data() + off, text.size() - off);
    if (k <= 0) return 1;
    off += static_cast<size_t>(k);
  }
  if (missing > 0 && !allow_missing_) {
    std::fprintf(stderr,
                 "%s: %d target(s) not measured (a peer did not run); exiting 3. Pass "
                 "--allow-missing-peers to accept that.\n",
                 benchmark_.c_str(), missing);
    return 3;
  }
  return 0;
}

}  // namespace ember::bench
