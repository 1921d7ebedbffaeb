// Files of a job directory through the real daemon (issue 12): an upload can never replace a file
// the daemon writes (an upload named job.yaml once made the worker train another spec than the
// one `emberctl status` shows), and job files are 0640 in 0750 directories whatever the umask.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "testing/cluster.h"

namespace ember::e2e {
namespace {

namespace v1 = jobs::v1;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int Mode(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

TEST_CASE("an upload named job.yaml cannot shadow the validated spec; job files are private") {
  const mode_t old_umask = ::umask(022);  // the common default, under which 0644 was the bug
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  const std::string spec = Spec("files-ok", 1, 6);
  const std::string evil = Spec("files-evil", 1, 2);
  auto r = c->Submit(spec, "", {{"job.yaml", evil}, {"data/x.bin", "abc"}});
  REQUIRE(r.ok());
  auto done = c->Wait(r->job().id(), absl::Seconds(30));
  REQUIRE(done.ok());
  INFO(done->reason());
  REQUIRE(done->state() == v1::SUCCEEDED);
  CHECK(done->progress().step() == 6);  // the worker ran the submitted spec, not the upload
  const std::string dir = done->job_dir();
  CHECK(Slurp(dir + "/job.yaml") == spec);
  CHECK(Slurp(dir + "/uploads/job.yaml") == evil);
  CHECK(Slurp(dir + "/uploads/data/x.bin") == "abc");
  for (const std::string& d : {dir, dir + "/uploads", dir + "/uploads/data", dir + "/logs",
                               dir + "/checkpoints", dir + "/flight"}) {
    INFO(d);
    CHECK(Mode(d) == 0750);
  }
  for (const std::string& f : {dir + "/job.yaml", dir + "/uploads/job.yaml",
                               dir + "/uploads/data/x.bin", dir + "/logs/rank-0.log"}) {
    INFO(f);
    CHECK(Mode(f) == 0640);
  }
  ::umask(old_umask);
}

// job.yaml is written last and only when every upload is in place: on a work root shared by
// several daemons its presence tells the others the files are complete. Uploads "a" and "a/b"
// cannot both be written (a file and a directory of one name): the attempt must fail naming the
// upload, not run without it (it used to: job.yaml was written anyway, and the job SUCCEEDED).
TEST_CASE("a job whose uploads cannot all be written fails with the reason; job.yaml not written") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  auto r = c->Submit(Spec("files-clash", 1, 2) + "max_restarts: 0\n", "",
                     {{"a", "file"}, {"a/b", "under a"}});
  REQUIRE(r.ok());
  auto done = c->Wait(r->job().id(), absl::Seconds(60));
  REQUIRE(done.ok());
  INFO("state " << v1::JobState_Name(done->state()) << ", reason: " << done->reason());
  CHECK(done->state() == v1::FAILED);
  REQUIRE(done->attempts_size() == 1);
  const v1::RankExit& cause = done->attempts(0).root_cause();
  std::string lines;
  for (const auto& l : cause.last_log_lines()) lines += l + "\n";
  INFO("root cause: exit " << cause.exit_code() << ", " << lines);
  CHECK(lines.find("upload 'a") != std::string::npos);  // named, with the job directory's path
  CHECK(::access((done->job_dir() + "/job.yaml").c_str(), F_OK) != 0);
}

}  // namespace
}  // namespace ember::e2e
