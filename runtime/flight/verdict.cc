#include "runtime/flight/verdict.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/flight/analyze.h"

namespace ember {
namespace {

int Priority(const std::string& kind) {
  static const char* kOrder[] = {"waits_for", "never_joined", "mismatch", "stuck", "failed",
                                 "missing_dump"};
  for (int i = 0; i < 6; ++i)
    if (kind == kOrder[i]) return i;
  return 6;
}

// When some rank left no dump (killed, crashed), it explains the survivors that wait: they stopped
// wherever the stop request found them, so one may have nothing pending ("rank 0 never joined: it
// has no op pending") or be stuck in a collective with the dead rank. Then the order is: a wait
// chain to a dead rank or a cycle, a mismatch, the ranks with no dump, then the rest.
int PriorityWithDeadRanks(const fr::Finding& f, const std::set<int>& dumped) {
  const bool live_root = f.kind == "waits_for" && f.ranks.size() == 1 && dumped.count(f.ranks[0]);
  if (f.kind == "waits_for" && !live_root) return 0;
  if (f.kind == "mismatch") return 1;
  if (f.kind == "missing_dump") return 2;
  return 3 + Priority(f.kind);
}

std::string Ranks(const std::vector<int>& r) {
  return absl::StrCat(r.size() == 1 ? "rank " : "ranks ", absl::StrJoin(r, ", "));
}

}  // namespace

std::string FlightVerdict(const std::string& dir) {
  auto report = fr::AnalyzeDir(dir);
  if (!report.ok() || !report->problem) return "";
  std::vector<fr::Finding> f = report->findings;
  const std::set<int> dumped(report->dumped_ranks.begin(), report->dumped_ranks.end());
  const bool dead = std::any_of(f.begin(), f.end(),
                                [](const fr::Finding& x) { return x.kind == "missing_dump"; });
  std::stable_sort(f.begin(), f.end(), [&](const fr::Finding& a, const fr::Finding& b) {
    if (dead) return PriorityWithDeadRanks(a, dumped) < PriorityWithDeadRanks(b, dumped);
    return Priority(a.kind) < Priority(b.kind);
  });
  std::vector<std::string> parts;
  std::set<int> named_dead;  // roots of wait chains already named as having left no dump
  for (const fr::Finding& x : f) {
    if (parts.size() == 3) break;
    if (x.kind == "waits_for" && x.ranks.size() == 1 && !dumped.count(x.ranks[0])) {
      named_dead.insert(x.ranks[0]);
    }
    if (x.kind == "missing_dump" &&
        std::all_of(x.ranks.begin(), x.ranks.end(), [&](int r) { return named_dead.count(r); })) {
      continue;
    }
    if (x.kind == "never_joined") {
      parts.push_back(absl::StrCat(Ranks(x.ranks), " never joined ", x.op.empty() ? "the op" : x.op,
                                   " seq ", x.seq, " of group '", x.group, "'"));
    } else if (x.kind == "missing_dump") {
      parts.push_back(absl::StrCat(Ranks(x.ranks), " left no dump (dead, or hung before its "
                                   "watchdog dumped)"));
    } else if (x.kind == "stuck") {
      parts.push_back(absl::StrCat(Ranks(x.ranks), " stuck in ", x.op.empty() ? "the op" : x.op,
                                   " seq ", x.seq, " of group '", x.group, "'"));
    } else {
      parts.push_back(x.text);
    }
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace ember
