// ember::bench: the one report format every *_bench binary uses (issue 11).
//
// A benchmark fills tables (nccl-tests style: one table per measurement, units in the header, the
// 1-minute load average beside it) and a list of targets, then calls Finish():
//
//   bench::Report report("store_bench", argc, argv);   // after flag parsing, before forking
//   bench::Table& t = report.AddTable("ops", {"op", "clients", "ember ops/s", "tcpstore ops/s"});
//   t.AddRow({"add", 4, 71234.0, bench::Cell()});       // Cell() = not measured, printed "-"
//   report.AddTarget(bench::Target::VsPeer("add_4_clients", 71234, peer_or_nullopt, 2.0,
//                                          bench::kHigherIsBetter, "ops/s", peer_error));
//   return report.Finish();
//
// Output: without --json, the tables and a target summary go to stdout. With --json, stdout
// carries exactly one JSON object (bench/bench_schema.json): {benchmark, command, quick, load,
// tables: [{title, columns, rows, load_begin, load_end, notes}], targets: [...], meta}; the
// constructor points file descriptor 1 at stderr so that nothing else (logs, peers, children) can
// write to stdout, and the object goes to the saved descriptor.
//
// Target rule: a target with a peer compares value/peer against `goal`; without one, value itself.
// A peer target whose peer failed, timed out or was skipped has peer = null, met = false and a
// reason; in --json mode Finish() then exits 3 unless --allow-missing-peers.
//
// Thread-compatible: one thread builds the report.
#ifndef EMBER_BENCH_REPORT_H_
#define EMBER_BENCH_REPORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "runtime/base/json.h"

namespace ember::bench {

inline constexpr bool kHigherIsBetter = true;
inline constexpr bool kLowerIsBetter = false;

// Median of `v` (the upper median for even sizes); NaN when empty.
double Median(std::vector<double> v);

// The 1-, 5- and 15-minute load averages from /proc/loadavg (-1 each when unreadable).
struct LoadAverage {
  double m1 = -1, m5 = -1, m15 = -1;
};
LoadAverage ReadLoadAverage();

// A table cell: text, an integer, a number, or nothing (a measurement that did not run: "-" in
// text, null in JSON).
class Cell {
 public:
  Cell() = default;
  Cell(const char* s) : v_(std::string(s)) {}
  Cell(std::string s) : v_(std::move(s)) {}
  Cell(int i) : v_(int64_t{i}) {}
  Cell(int64_t i) : v_(i) {}
  Cell(double d) : v_(d) {}
  Cell(std::optional<double> d) { if (d) v_ = *d; }
  std::string Text() const;
  json::Value Json() const;

 private:
  std::variant<std::monostate, std::string, int64_t, double> v_;
};

class Table {
 public:
  Table(std::string title, std::vector<std::string> columns);
  // REQUIRES: cells.size() == number of columns.
  void AddRow(std::vector<Cell> cells);
  // The load averages shown beside the table: by default when it was created and at its last row;
  // a table filled after the measurement passes the load seen while measuring.
  void SetLoad(LoadAverage begin, LoadAverage end) {
    load_begin_ = begin;
    load_end_ = end;
    load_fixed_ = true;
  }
  // A line printed under the table (what a column means, round trips per op, ...).
  void AddNote(std::string note) { notes_.push_back(std::move(note)); }
  std::string Text() const;
  json::Value Json() const;

 private:
  std::string title_;
  std::vector<std::string> columns_;
  std::vector<std::vector<Cell>> rows_;
  std::vector<std::string> notes_;
  LoadAverage load_begin_, load_end_;
  bool load_fixed_ = false;
};

struct Target {
  std::string name;
  double value = 0;
  std::optional<double> peer;  // the peer's figure; nullopt when absolute or not measured
  bool vs_peer = false;        // goal applies to value/peer (and needs a peer)
  double goal = 0;
  bool higher_is_better = true;
  std::string unit;
  std::string reason;          // why the peer is missing (only when it is)
  std::string note;            // free text (shape, transport, round trips...)

  // Goal on value / peer. A missing peer leaves the target not measured with `reason`.
  static Target VsPeer(std::string name, double value, std::optional<double> peer, double goal,
                       bool higher_is_better, std::string unit, std::string reason_if_missing,
                       std::string note = "");
  // Goal on value itself.
  static Target Absolute(std::string name, double value, double goal, bool higher_is_better,
                         std::string unit, std::string note = "");

  bool measured() const { return !vs_peer || peer.has_value(); }
  // value/peer for a peer target, else value; nullopt when not measured.
  std::optional<double> compared() const;
  // Met when measured, not a failed measurement, and compared() is on the right side of goal.
  bool met() const;
  // True for a lower-is-better target whose value (or ratio) is <= 0: nothing was measured.
  bool failed_measurement() const;
  // "met", "missed by 12.3%" (relative to the goal), or "not measured: <reason>".
  std::string Status() const;
  json::Value Json() const;
};

class Report {
 public:
  // `argv` is recorded as the command line. Reads --json and --allow-missing-peers.
  Report(std::string benchmark, int argc, char** argv);
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;

  bool json() const { return json_; }
  // The returned table stays valid for the report's lifetime.
  Table& AddTable(std::string title, std::vector<std::string> columns);
  void AddTarget(Target t) { targets_.push_back(std::move(t)); }
  // Free-form metadata ("meta" object in JSON, "key: value" lines in text).
  void SetMeta(std::string key, json::Value v) { meta_.Set(std::move(key), std::move(v)); }
  const std::vector<Target>& targets() const { return targets_; }

  // Prints everything; returns the process exit status: 0, or 3 in --json mode when a target is
  // not measured and --allow-missing-peers is off.
  int Finish();
  // Prints `s` to stderr and returns 1 (the run failed: no JSON object is printed).
  int Fail(const absl::Status& s);

 private:
  std::string benchmark_;
  std::string command_;
  bool json_;
  bool allow_missing_;
  int out_fd_ = 1;
  LoadAverage load_begin_;
  std::vector<std::unique_ptr<Table>> tables_;
  std::vector<Target> targets_;
  json::Value meta_ = json::Value::MakeObject();
};

// Whether the caller passed --quick (the shared smoke-run flag: small sizes, seconds per bench).
bool Quick();

}  // namespace ember::bench

#endif  // EMBER_BENCH_REPORT_H_
