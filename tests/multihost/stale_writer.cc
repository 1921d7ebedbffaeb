// stale_writer (issue 20, fencing): plays a stale worker of an old attempt. Run with the EMBER_*
// environment of a rank of that attempt (partition_test copies it from a live rank on the host it
// cuts off), after the job has moved on to a newer attempt. Through the worker's own fenced store
// client (worker::ConnectJobStore) it tries what such a worker could do:
//   1. its progress record under its own attempt's keys;
//   2. the same record under the next attempt's keys (jobs/<job>/attempt/<n+1>/...);
//   3. a checkpoint save of --step into --checkpoint_root (the job's checkpoint directory), with
//      the real commit protocol (world 1).
// Prints one line per try: "refused: <what>: <error>" or "WRITTEN: <what>". Exit status: 0 if every
// try was refused by the fence, 1 otherwise (one got through, or failed for another reason).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/commit.h"
#include "runtime/base/flags.h"
#include "runtime/job/env.h"
#include "runtime/job/keys.h"
#include "runtime/store/client.h"
#include "runtime/worker/trainer.h"

ABSL_FLAG(std::string, checkpoint_root, "", "the job's checkpoint directory");
ABSL_FLAG(int64_t, step, 1, "the step the stale checkpoint save claims");

int main(int argc, char** argv) {
  using namespace ember;
  base::ParseFlagsAndInitLogging(argc, argv, "stale_writer");
  absl::StatusOr<job::WorkerEnv> env = job::WorkerEnv::FromEnv(getenv);
  if (!env.ok()) {
    std::fprintf(stderr, "stale_writer: %s\n", env.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<store::Client> client = worker::ConnectJobStore(*env);
  if (!client.ok()) {
    std::fprintf(stderr, "stale_writer: %s\n", client.status().ToString().c_str());
    return 2;
  }
  store::Client mine = client->WithPrefix(env->prefix());
  store::Client next = client->WithPrefix(job::keys::AttemptPrefix(env->job_id, env->attempt + 1));
  int fenced = 0, tries = 0;
  auto report = [&](const std::string& what, const absl::Status& s) {
    ++tries;
    if (s.ok()) {
      std::printf("WRITTEN: %s\n", what.c_str());
    } else {
      std::printf("refused: %s: %s\n", what.c_str(), s.ToString().c_str());
      fenced += store::IsFenced(s) ? 1 : 0;
    }
  };
  const std::string who = absl::StrCat("rank ", env->rank, " of attempt ", env->attempt);
  report(absl::StrCat(who, " progress under attempt ", env->attempt),
         mine.Set(job::keys::ProgressOf(env->rank), "stale"));
  report(absl::StrCat(who, " progress under attempt ", env->attempt + 1),
         next.Set(job::keys::ProgressOf(env->rank), "stale"));
  const std::string data(16, '\x7f');
  ckpt::RankState st;
  st.step = absl::GetFlag(FLAGS_step);
  st.tensors.push_back({"stale.weight", ckpt::DType::kF32, {1, 4}, 0, data});
  ckpt::StoreCommitProtocol protocol(mine);
  report(absl::StrCat(who, " checkpoint step ", st.step),
         ckpt::SaveCheckpoint({.root = absl::GetFlag(FLAGS_checkpoint_root), .rank = 0,
                               .world_size = 1, .commit_timeout = absl::Seconds(5)},
                              st, &protocol));
  std::printf("stale writer (%s of job %s): %d of %d writes refused by the fence; exiting\n",
              who.c_str(), env->job_id.c_str(), fenced, tries);
  return fenced == tries ? 0 : 1;
}
