// Files of a job directory through the real daemon (issue 12): an upload can never replace a file
// the daemon writes (an upload named job.yaml once made the worker train another spec than the
// one `emberctl status` shows), and job files are 0640 in 0750 directories whatever the umask.
// Issue 31: the store is not trusted. A job record forged straight into the store (an invalid id,
// an upload named ../../../x/PWNED, a symlink planted where an upload goes) writes nothing and
// chmods nothing outside its job directory; Submit refuses what every rank would refuse.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/jobs.pb.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/jobspec/spec.h"
#include "runtime/store/client.h"
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
  CHECK(done->progress().metrics().step() == 6);  // the worker ran the submitted spec, not the upload
  const std::string dir = done->job_dir();
  CHECK(Slurp(dir + "/job.yaml") == spec::ResolvedYaml(r->job().spec()));  // the resolved spec (issue 32)
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

// --- Issue 31: nothing read from the store is trusted ---------------------------------------------

store::Client StoreOf(TestCluster& cluster) {
  store::ClientOptions so;
  so.address = cluster.node(0)->store_address();
  so.auth_token = cluster.token();
  so.default_timeout = so.connect_timeout = absl::Seconds(5);
  auto c = store::Client::Connect(so);
  REQUIRE(c.ok());
  return *c;
}

// What Submit would write, written straight into the store as anyone holding a store connection
// (or, before issue 31, a TCPStore client) could: the record under key id `key_id` naming job
// `record_id`, its spec, its uploads, and the index keys the scheduler reads.
void Forge(store::Client& s, const std::string& key_id, const std::string& record_id,
           const std::map<std::string, std::string>& files) {
  const std::string yaml = Spec("forged", 1, 2) + "max_restarts: 0\n";
  auto spec = spec::ParseJobSpec(yaml);
  REQUIRE(spec.ok());
  v1::Job j;
  j.set_id(record_id);
  j.set_name("forged");
  j.set_submission_id("forged-" + key_id);
  j.set_state(v1::PENDING);
  *j.mutable_spec() = *spec;
  j.mutable_spec()->mutable_parallelism()->set_backend("cpu");
  j.set_device_type("cpu");
  j.set_world_size(1);
  j.set_submit_unix_ms(absl::ToUnixMillis(absl::Now()));
  for (const auto& [name, data] : files) {
    REQUIRE(s.Set(absl::StrCat("jobs/", key_id, "/files/", name), data).ok());
  }
  REQUIRE(s.Set(absl::StrCat("jobs/", key_id, "/spec_yaml"), yaml).ok());
  REQUIRE(s.Set(absl::StrCat("jobs/", key_id, "/record"), j.SerializeAsString()).ok());
  REQUIRE(s.Set("joblist/" + key_id, "").ok());
  REQUIRE(s.Set("active/" + key_id, "").ok());
}

std::string RootCauseLines(const v1::Job& j) {
  std::string lines;
  for (const auto& a : j.attempts())
    for (const auto& l : a.root_cause().last_log_lines()) lines += l + "\n";
  return lines;
}

// The files under `dir`, recursively (symlinks not followed).
std::vector<std::string> Tree(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    out.push_back(it->path().string());
  }
  return out;
}

TEST_CASE("a job forged into the store with a bad id or upload name writes nothing outside its "
          "job directory and chmods nothing above it") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  const std::string root = (*cluster)->work_root();
  const std::string parent = std::filesystem::path(root).parent_path().string();
  // The probe's upload: work_root/<job>/uploads/../../../x/PWNED is <parent of the work root>/x.
  REQUIRE(::mkdir((parent + "/x").c_str(), 0755) == 0);
  REQUIRE(::chmod((parent + "/x").c_str(), 0755) == 0);
  REQUIRE(::chmod(parent.c_str(), 0755) == 0);
  REQUIRE(::chmod(root.c_str(), 0755) == 0);
  store::Client s = StoreOf(**cluster);
  Forge(s, "forged-upload", "forged-upload", {{"../../../x/PWNED", "pwned"}, {"ok.txt", "fine"}});
  Forge(s, "../x-escape", "../x-escape", {});          // an id that names a directory outside
  Forge(s, "forged-mismatch", "../y-escape", {});      // a record naming another id than its key

  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  auto done = c->Wait("forged-upload", absl::Seconds(30));
  REQUIRE(done.ok());
  const std::string lines = RootCauseLines(*done);
  INFO("state " << v1::JobState_Name(done->state()) << ", reason: " << done->reason()
                << ", root cause: " << lines);
  CHECK(done->state() == v1::FAILED);
  CHECK(absl::StrContains(lines, "../../../x/PWNED"));  // refused, named
  absl::SleepFor(absl::Seconds(1));  // passes enough for the other two to be placed and started
  CHECK(::access((parent + "/x/PWNED").c_str(), F_OK) != 0);
  CHECK(Tree(parent + "/x").empty());
  CHECK(::access((parent + "/x-escape").c_str(), F_OK) != 0);
  CHECK(::access((parent + "/y-escape").c_str(), F_OK) != 0);
  CHECK(::access((root + "/forged-upload/uploads/ok.txt").c_str(), F_OK) != 0);  // nothing written
  CHECK(::access((root + "/forged-upload/job.yaml").c_str(), F_OK) != 0);
  // No directory above the job directory changed mode (it was chmod'ed 0750 through each "..").
  CHECK(Mode(parent) == 0755);
  CHECK(Mode(root) == 0755);
  CHECK(Mode(parent + "/x") == 0755);
  // The two forged ids were never placed: their records stay as forged, unstarted.
  for (const char* key : {"../x-escape", "forged-mismatch"}) {
    auto raw = s.Get(absl::StrCat("jobs/", key, "/record"));
    REQUIRE(raw.ok());
    v1::Job j;
    REQUIRE(j.ParseFromString(*raw));
    INFO(key);
    CHECK(j.state() == v1::PENDING);
    CHECK(j.attempts_size() == 0);
  }
  CHECK_FALSE(c->Get("../x-escape").ok());
}

TEST_CASE("a symlink planted where an upload goes is never followed") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  const std::string root = (*cluster)->work_root();
  const std::string parent = std::filesystem::path(root).parent_path().string();
  const std::string outside_dir = parent + "/linked-dir", outside_file = parent + "/linked-file";
  REQUIRE(::mkdir(outside_dir.c_str(), 0755) == 0);
  REQUIRE(::chmod(outside_dir.c_str(), 0755) == 0);
  { std::ofstream(outside_file) << "original"; }
  const std::string uploads = root + "/forged-link/uploads";
  std::filesystem::create_directories(uploads);
  REQUIRE(::symlink(outside_dir.c_str(), (uploads + "/sub").c_str()) == 0);
  REQUIRE(::symlink(outside_file.c_str(), (uploads + "/file.txt").c_str()) == 0);
  store::Client s = StoreOf(**cluster);
  Forge(s, "forged-link", "forged-link", {{"file.txt", "new"}, {"sub/inner.txt", "through"}});

  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  auto done = c->Wait("forged-link", absl::Seconds(30));
  REQUIRE(done.ok());
  const std::string lines = RootCauseLines(*done);
  INFO("state " << v1::JobState_Name(done->state()) << ", root cause: " << lines);
  CHECK(done->state() == v1::FAILED);  // the upload under the symlinked directory: refused
  CHECK(absl::StrContains(lines, "sub/inner.txt"));
  CHECK(absl::StrContains(lines, "symlink"));
  CHECK(Tree(outside_dir).empty());
  CHECK(Mode(outside_dir) == 0755);
  CHECK(Slurp(outside_file) == "original");
  // The file symlink was replaced, not written through.
  struct stat st;
  REQUIRE(::lstat((uploads + "/file.txt").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(Slurp(uploads + "/file.txt") == "new");
}

TEST_CASE("Submit refuses, naming the field, the specs every rank would refuse at its start") {
  auto cluster = TestCluster::Start({.nodes = 1});
  REQUIRE(cluster.ok());
  auto c = (*cluster)->Connect(0);
  REQUIRE(c.ok());
  const std::string model = "model: {n_layers: 2, d_model: 32, n_heads: 2, context_length: 16}\n";
  const std::pair<std::string, std::string> cases[] = {
      // (PP x HSDP and a pipeline initialised from safetensors, refused here before, train now.)
      {"name: pp-mb\n" + model +
           "parallelism: {strategy: pipeline, pipeline_stages: 2, pipeline_micro_batches: 1, world_size: 2}\n"
           "steps: 2\n",
       "parallelism.pipeline_micro_batches"},
      {"name: cuda-hsdp\n" + model +
           "resources: {device_type: cuda}\nparallelism: {dp_replicate: 2, world_size: 4}\nsteps: 2\n",
       "parallelism.dp_replicate"},
      {"name: none-2\n" + model + "parallelism: {strategy: none, world_size: 2}\nsteps: 2\n",
       "parallelism.strategy"},
      {"name: gpt-hf\n" + model + "checkpoint: {init_from: hf}\nsteps: 2\n",
       "checkpoint.init_from"},
  };
  for (const auto& [spec, field] : cases) {
    auto r = c->Submit(spec, "", {});
    INFO(spec << " -> " << (r.ok() ? std::string("accepted") : r.status().ToString()));
    CHECK(absl::IsInvalidArgument(r.status()));
    CHECK(absl::StrContains(r.status().message(), field + ":"));
  }
}

}  // namespace
}  // namespace ember::e2e
