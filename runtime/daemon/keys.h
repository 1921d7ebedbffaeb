// The daemon's store key space (DESIGN.md "Store key space"). Every daemon and every test derives
// keys from names through these helpers, never by hand. Thread-safe (pure functions).
//
//   nodes/<node>                          Node record (leased by that node's daemon)
//   alloc/<node>/<device>                 job id holding the device (leased by that node)
//   scheduler/leader                      name of the daemon that places jobs (leased)
//   submissions/<submission id>           job id (idempotent Submit)
//   joblist/<job>, active/<job>           indexes: every job; jobs not yet finished
//   jobs/<job>/record                     Job (binary proto), written with compare-and-set
//   jobs/<job>/spec_yaml                  the resolved spec (spec::Resolve at Submit; <job>/job.yaml)
//
// The keys the daemon shares with the workers (jobs/<job>/files/, jobs/<job>/attempt/<n>/...: stop,
// failure, exit/<r>, progress/<r>, worker_exit/<r>, fr/dump_request) are defined once in
// runtime/job/keys.h; the using-declarations below make them keys::Stop(...) etc. here too.
#ifndef EMBER_RUNTIME_DAEMON_KEYS_H_
#define EMBER_RUNTIME_DAEMON_KEYS_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/job/keys.h"

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
inline std::string Record(absl::string_view job) { return absl::StrCat(::ember::job::keys::JobPrefix(job), "record"); }
inline std::string SpecYaml(absl::string_view job) {
  return absl::StrCat(::ember::job::keys::JobPrefix(job), "spec_yaml");
}

using ::ember::job::keys::DumpRequest;
using ::ember::job::keys::Drain;
using ::ember::job::keys::Exit;
using ::ember::job::keys::Failure;
using ::ember::job::keys::Fence;
using ::ember::job::keys::File;
using ::ember::job::keys::FilesPrefix;
using ::ember::job::keys::Progress;
using ::ember::job::keys::Stop;
using ::ember::job::keys::WorkerExit;

}  // namespace ember::daemon::keys

#endif  // EMBER_RUNTIME_DAEMON_KEYS_H_
