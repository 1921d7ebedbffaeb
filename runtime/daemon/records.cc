// Job records, nodes and device claims in the store (keys.h). Called from any thread (the control
// thread, gRPC handlers), never with Impl::mu held.
// The store is not trusted: ids and records are checked (ParseRecord) before they steer anything.
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

absl::StatusOr<Job> ParseRecord(const std::string& id, const std::string& raw) {
  RETURN_IF_ERROR(CheckJobId(id));
  Job job;
  if (!job.ParseFromString(raw)) return absl::DataLossError("job record " + id + " is corrupt");
  if (job.id() != id) {
    return absl::DataLossError(absl::StrCat(
        "the record under ", keys::Record(id), " names job '", absl::CHexEscape(job.id().substr(0, 128)),
        "', not ", id, "; refusing it (written by hand, or forged through the store)"));
  }
  return job;
}

absl::StatusOr<std::pair<Job, std::string>> Daemon::Impl::ReadRecord(const std::string& id) {
  RETURN_IF_ERROR(CheckJobId(id));  // before the id names a key
  ASSIGN_OR_RETURN(std::string raw, store->Get(keys::Record(id)));
  ASSIGN_OR_RETURN(Job job, ParseRecord(id, raw));
  return std::make_pair(std::move(job), std::move(raw));
}

void Daemon::Impl::WarnRefusedRecord(const std::string& id, const absl::Status& why) {
  if (absl::IsNotFound(why) || absl::IsUnavailable(why) || absl::IsDeadlineExceeded(why)) return;
  absl::MutexLock l(&refused_mu);
  if (refused_records.size() >= 1024 || !refused_records.insert(id).second) return;
  spdlog::error("refusing the job under active/{} from the store: {}", absl::CHexEscape(id.substr(0, 128)),
                why.ToString());
}

absl::StatusOr<Job> Daemon::Impl::UpdateRecord(const std::string& id,
                                               const std::function<bool(Job*)>& mutate) {
  for (int tries = 0; tries < 50; ++tries) {
    ASSIGN_OR_RETURN(auto rec, ReadRecord(id));
    Job job = rec.first;
    if (!mutate(&job)) return rec.first;
    ASSIGN_OR_RETURN(store::CompareSetResult r,
                     store->CompareSet(keys::Record(id), rec.second, job.SerializeAsString()));
    if (r.swapped) return job;
  }
  return absl::AbortedError("job record " + id + " kept changing; try again");
}

absl::StatusOr<std::vector<jobs::v1::Node>> Daemon::Impl::ReadNodes() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, store->ListKeys("nodes/"));
  ASSIGN_OR_RETURN(auto values, store->MultiGet(names));
  std::vector<jobs::v1::Node> out;
  for (const auto& v : values) {
    jobs::v1::Node n;
    if (v && n.ParseFromString(*v)) out.push_back(std::move(n));
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> Daemon::Impl::ReadAllocs() {
  ASSIGN_OR_RETURN(std::vector<std::string> names, store->ListKeys("alloc/"));
  ASSIGN_OR_RETURN(auto values, store->MultiGet(names));
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (values[i]) out[names[i].substr(strlen("alloc/"))] = *values[i];
  }
  return out;
}

void Daemon::Impl::FillProgress(Job* job) {
  if (job->attempts_size() == 0) return;
  int n = job->attempts(job->attempts_size() - 1).number();
  auto v = store->Get(keys::Progress(job->id(), n, 0));
  if (!v.ok()) return;
  if (!job->mutable_progress()->ParseFromString(*v)) job->clear_progress();
}

}  // namespace ember::daemon
