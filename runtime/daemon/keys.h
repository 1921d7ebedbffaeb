// The daemon's store key space (DESIGN.md "Store key space"). Every daemon and every test derives
// keys from names through these helpers, never by hand. Thread-safe (pure functions).
//
//   nodes/<node>                          Node record (leased by that node's daemon)
//   alloc/<node>/<device>                 job id holding the device (leased by that node)
//   scheduler/leader                      name of the daemon that places jobs (leased)
//   submissions/<submission id>           job id (idempotent Submit)
//   joblist/<job>, active/<job>           indexes: every job; jobs not yet finished
//   jobs/<job>/record                     Job (binary proto), written with compare-and-set
//   jobs/<job>/spec_yaml, files/<name>    what was submitted
//   jobs/<job>/attempt/<n>/exit/<rank>    RankExit of a rank that ended
//   jobs/<job>/attempt/<n>/failure        first failing rank's RankExit (first writer wins)
//   jobs/<job>/attempt/<n>/stop           set when every rank of the attempt must stop
//   jobs/<job>/attempt/<n>/progress/<r>   worker progress JSON (written by ember-worker)
//   jobs/<job>/attempt/<n>/fr/dump_request  flight-recorder dump trigger (docs/flight-recorder.md)
#ifndef EMBER_RUNTIME_DAEMON_KEYS_H_
#define EMBER_RUNTIME_DAEMON_KEYS_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ember::daemon::keys {

inline std::string Node(absl::string_view node) { return absl::StrCat("nodes/", node); }
inline std::string AllocPrefix(absl::string_view node) { return absl::StrCat("alloc/", node, "/"); }
inline std::string Alloc(absl::string_view node, absl::string_view device) {
  return absl::StrCat("alloc/", node, "/", device);
}
inline constexpr absl::string_view kLeader = "scheduler/leader";
inline std::string Submission(absl::string_view sid) { return absl::StrCat("submissions/", sid); }
inline std::string JobList(absl::string_view job) { return absl::StrCat("joblist/", job); }
inline std::string Active(absl::string_view job) { return absl::StrCat("active/", job); }
inline std::string Record(absl::string_view job) { return absl::StrCat("jobs/", job, "/record"); }
inline std::string SpecYaml(absl::string_view job) { return absl::StrCat("jobs/", job, "/spec_yaml"); }
inline std::string File(absl::string_view job, absl::string_view name) {
  return absl::StrCat("jobs/", job, "/files/", name);
}
inline std::string Attempt(absl::string_view job, int attempt) {
  return absl::StrCat("jobs/", job, "/attempt/", attempt, "/");
}
inline std::string Exit(absl::string_view job, int attempt, int rank) {
  return absl::StrCat(Attempt(job, attempt), "exit/", rank);
}
inline std::string Failure(absl::string_view job, int attempt) {
  return absl::StrCat(Attempt(job, attempt), "failure");
}
inline std::string Stop(absl::string_view job, int attempt) {
  return absl::StrCat(Attempt(job, attempt), "stop");
}
inline std::string Progress(absl::string_view job, int attempt, int rank) {
  return absl::StrCat(Attempt(job, attempt), "progress/", rank);
}
inline std::string DumpRequest(absl::string_view job, int attempt) {
  return absl::StrCat(Attempt(job, attempt), "fr/dump_request");
}

}  // namespace ember::daemon::keys

#endif  // EMBER_RUNTIME_DAEMON_KEYS_H_
