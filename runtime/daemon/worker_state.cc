// <state_dir>/workers.state: what a restarted daemon needs to re-attach to running workers (the
// node's lease, each unreleased attempt's devices, each worker's pid and start time).
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/files.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/process.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

std::string Daemon::Impl::StateTextLocked() const {
  // Lines:
  //   lease <id>
  //   attempt <job> <n> <device,device,...>
  //   worker <job> <n> <rank> <local rank> <pid> <start ticks> <device> <exited> <code> <signal> <log>
  std::string text = "# ember daemon worker state v2\n";
  absl::StrAppend(&text, "lease ", lease.load(), "\n");
  for (const auto& [k, a] : local) {
    if (a.released) continue;
    absl::StrAppend(&text, "attempt ", a.job, " ", a.attempt, " ",
                    a.devices.empty() ? "-" : absl::StrJoin(a.devices, ","), "\n");
    for (const auto& w : a.workers) {
      absl::StrAppend(&text, "worker ", a.job, " ", a.attempt, " ", w.rank, " ", w.local_rank, " ",
                      w.pid, " ", w.start_ticks, " ", w.device, " ", w.exited ? 1 : 0, " ",
                      w.exit_code, " ", w.signal, " ", w.log_path, "\n");
    }
  }
  return text;
}

void Daemon::Impl::Persist() {
  // Read back by LoadState(). Written atomically and durably (temp file, fsync, rename, fsync of
  // the directory) so it is never half-written; persist_mu keeps the writes in snapshot order.
  absl::MutexLock p(&persist_mu);
  std::string text;
  {
    absl::MutexLock l(&mu);
    text = StateTextLocked();
  }
  absl::Status s = base::WriteFileAtomic(opts.state_dir + "/workers.state", text);
  if (!s.ok()) {
    spdlog::error("cannot save the re-attach state: {} (a daemon restarted now would not find "
                  "its running workers)", s.ToString());
  }
}

void Daemon::Impl::LoadState() {
  std::ifstream f(opts.state_dir + "/workers.state");
  if (!f) return;
  std::string line;
  int adopted = 0, gone = 0;
  std::map<std::string, LocalAttempt> loaded;
  while (std::getline(f, line)) {
    std::vector<std::string> t = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (t.empty() || t[0][0] == '#') continue;
    if (t[0] == "lease" && t.size() == 2) {
      int64_t id = 0;
      if (absl::SimpleAtoi(t[1], &id)) lease = id;
    } else if (t[0] == "attempt" && t.size() == 4) {
      int n = 0;
      if (!absl::SimpleAtoi(t[2], &n)) continue;
      LocalAttempt& a = loaded[absl::StrCat(t[1], "#", n)];
      a.job = t[1];
      a.attempt = n;
      if (t[3] != "-") a.devices = absl::StrSplit(t[3], ',');
    } else if (t[0] == "worker" && t.size() == 12) {
      int n = 0;
      if (!absl::SimpleAtoi(t[2], &n)) continue;
      auto it = loaded.find(absl::StrCat(t[1], "#", n));
      if (it == loaded.end()) continue;
      LocalWorker w;
      bool ok = absl::SimpleAtoi(t[3], &w.rank) && absl::SimpleAtoi(t[4], &w.local_rank) &&
                absl::SimpleAtoi(t[5], &w.pid) && absl::SimpleAtoi(t[6], &w.start_ticks) &&
                absl::SimpleAtoi(t[9], &w.exit_code) && absl::SimpleAtoi(t[10], &w.signal);
      if (!ok) continue;
      w.device = t[7];
      w.exited = t[8] == "1";
      w.log_path = t[11];
      w.adopted = true;
      if (!w.exited) ++(ProcessAlive(w.pid, w.start_ticks) ? adopted : gone);
      it->second.workers.push_back(w);
    }
  }
  {
    absl::MutexLock l(&mu);
    for (auto& [key, a] : loaded) local[key] = std::move(a);
  }
  if (adopted + gone > 0) {
    spdlog::info("re-attached to {} running worker(s) from {}/workers.state ({} ended while no "
                 "daemon watched; reported on the first pass)",
                 adopted, opts.state_dir, gone);
  }
}

}  // namespace ember::daemon
