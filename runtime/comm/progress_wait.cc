#include "runtime/comm/progress_wait.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "runtime/comm/env_knobs.h"

namespace ember::comm::internal {

int ShmSpinRounds(int local_ranks) {
  if (const char* e = getenv(kEnvShmSpin)) {
    int v;
    if (absl::SimpleAtoi(e, &v) && v >= 0) return v;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus > 0 && local_ranks <= cpus ? 2000 : kMinSpin;
}

void Backoff(int idle, const std::vector<pollfd>& fds) {
  if (!fds.empty()) {
    // Each idle round re-tries send()/recv() (syscalls that return EAGAIN); on shared, oversubscribed
    // cores that spinning steals the peer's CPU, so go to poll() after a few rounds.
    if (idle < 16) {
      _mm_pause();
      return;
    }
    std::vector<pollfd> f = fds;
    poll(f.data(), f.size(), 5);
    return;
  }
  if (idle < 2000) {
    _mm_pause();
  } else if (idle < 2000 + 2000) {
    sched_yield();
  } else {
    timespec ts{0, std::min<long>(1000000, 20000L * (1 + (idle - 4000) / 100))};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace ember::comm::internal
