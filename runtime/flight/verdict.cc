#include "runtime/flight/verdict.h"

#include <algorithm>
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

std::string Ranks(const std::vector<int>& r) {
  return absl::StrCat(r.size() == 1 ? "rank " : "ranks ", absl::StrJoin(r, ", "));
}

}  // namespace

std::string FlightVerdict(const std::string& dir) {
  auto report = fr::AnalyzeDir(dir);
  if (!report.ok() || !report->problem) return "";
  std::vector<fr::Finding> f = report->findings;
  std::stable_sort(f.begin(), f.end(), [](const fr::Finding& a, const fr::Finding& b) {
    return Priority(a.kind) < Priority(b.kind);
  });
  std::vector<std::string> parts;
  for (const fr::Finding& x : f) {
    if (parts.size() == 3) break;
    if (x.kind == "never_joined") {
      parts.push_back(absl::StrCat(Ranks(x.ranks), " never joined ", x.op.empty() ? "the op" : x.op,
                                   " seq ", x.seq, " of group '", x.group, "'"));
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
