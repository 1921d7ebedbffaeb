// Flight-recorder analysis: reads every rank's dump (<dir>/rank-*.json, schema in
// docs/flight-recorder.md) and explains a hang in plain words: which ranks never joined the
// collective that others are stuck in, the first sequence number where ranks disagree on op, size
// or dtype, each rank's last completed sequence number per group, and, when ranks block in
// point-to-point ops, the rank at the end of the wait-for chain (dead, hung, or a cycle).
//
//   ASSIGN_OR_RETURN(Report r, AnalyzeDir("/jobs/j1/flight"));
//   std::cout << r.ToText();            // or r.ToJson()
//   return r.problem ? 1 : 0;
//
// Pure functions over files; thread-compatible. Used by `emberctl fr analyze` and FlightVerdict
// (verdict.h).
#ifndef EMBER_RUNTIME_FLIGHT_ANALYZE_H_
#define EMBER_RUNTIME_FLIGHT_ANALYZE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ember::fr {

struct Finding {
  // "waits_for" (root of a wait chain through point-to-point ops: ranks = the root, or the
  // cycle), "never_joined", "stuck", "mismatch", "missing_dump", "failed"
  std::string kind;
  std::string group;
  int64_t seq = 0;
  std::string op;
  std::vector<int> ranks;  // the culprits (world ranks)
  std::string text;        // one sentence
};

struct GroupSummary {
  std::string name;
  std::vector<int> ranks;                    // world ranks of the members
  std::map<int, int64_t> last_enqueued;      // world rank -> seq (dumps present)
  std::map<int, int64_t> last_completed;
};

struct Report {
  std::vector<int> dumped_ranks;
  std::vector<GroupSummary> groups;
  std::vector<Finding> findings;
  bool problem = false;
  std::string ToText() const;
  std::string ToJson() const;
};

// Fails with NOT_FOUND when the directory has no rank-*.json, INVALID_ARGUMENT naming the file
// when a dump does not parse or has an unsupported major version.
absl::StatusOr<Report> AnalyzeDir(const std::string& dir);
// The same over already-read documents (file name -> text), for tests.
absl::StatusOr<Report> AnalyzeTexts(const std::map<std::string, std::string>& files);

}  // namespace ember::fr

#endif  // EMBER_RUNTIME_FLIGHT_ANALYZE_H_
