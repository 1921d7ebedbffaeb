// The daemon<->worker contract: the environment (read, checked, written back) and the key space.
#include <catch2/catch.hpp>
#include <map>

#include "runtime/job/env.h"
#include "runtime/job/keys.h"
#include "runtime/job/torch_env.h"

namespace ember::job {
namespace {

using EnvMap = std::map<std::string, std::string>;

absl::StatusOr<WorkerEnv> Read(const EnvMap& m) {
  return WorkerEnv::FromEnv([&](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  });
}

EnvMap AsMap(const std::vector<std::pair<std::string, std::string>>& v) {
  EnvMap m(v.begin(), v.end());
  REQUIRE(m.size() == v.size());  // each variable once
  return m;
}

TEST_CASE("worker environment: required variables, ranges, prefix", "[job]") {
  EnvMap m = {{"EMBER_STORE_ADDR", "127.0.0.1:1"}, {"EMBER_JOB_ID", "j1"}, {"EMBER_ATTEMPT", "3"},
              {"EMBER_RANK", "1"}, {"EMBER_WORLD_SIZE", "2"}, {"EMBER_JOB_DIR", "/tmp/j1"}};
  auto e = Read(m);
  REQUIRE(e.ok());
  CHECK(e->prefix() == "jobs/j1/attempt/3/");
  CHECK(e->device == "cpu");
  CHECK(e->local_world_size == 2);
  CHECK(e->fr_dump_dir == "/tmp/j1/flight");
  CHECK(e->upload_dir == "/tmp/j1");
  auto bad = [&](const std::string& k, const std::string& v, const std::string& msg) {
    auto c = m;
    if (v.empty()) c.erase(k); else c[k] = v;
    auto r = Read(c);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find(msg) != std::string::npos);
  };
  bad("EMBER_STORE_ADDR", "", "EMBER_STORE_ADDR is not set");
  bad("EMBER_RANK", "2", "EMBER_RANK=2 must be < EMBER_WORLD_SIZE=2");
  bad("EMBER_WORLD_SIZE", "zero", "EMBER_WORLD_SIZE='zero' must be an integer >= 1");
  bad("EMBER_DEVICE", "tpu", "EMBER_DEVICE='tpu' must be cpu or cuda:N");
  bad("EMBER_JOB_ID", "a/b", "EMBER_JOB_ID='a/b' must not contain '/'");
  CHECK(!e->tls.enabled());

  auto t = m;
  t["EMBER_TLS_CA"] = "/etc/ember/tls/ca.crt";
  e = Read(t);
  REQUIRE(e.ok());
  CHECK(e->tls.enabled());
  CHECK(e->tls.ca_file == "/etc/ember/tls/ca.crt");
  t["EMBER_TLS_CERT"] = "/etc/ember/tls/node.crt";
  e = Read(t);
  REQUIRE(!e.ok());  // a certificate without its key
  CHECK(std::string(e.status().message()).find("EMBER_TLS_KEY") != std::string::npos);
  t["EMBER_TLS_KEY"] = "/etc/ember/tls/node.key";
  e = Read(t);
  REQUIRE(e.ok());
  CHECK(e->tls.key_file == "/etc/ember/tls/node.key");
}

TEST_CASE("worker environment: FromEnv(ToEnv(x)) == x", "[job]") {
  SECTION("every field set") {
    WorkerEnv x;
    x.store_addr = "10.0.0.1:29400";
    x.job_id = "train-7";
    x.attempt = 2;
    x.rank = 5;
    x.world_size = 8;
    x.local_rank = 1;
    x.local_world_size = 4;
    x.node_rank = 1;
    x.device = "cuda:1";
    x.job_dir = "/var/lib/ember/jobs/train-7";
    x.auth_token_file = "/etc/ember/token";
    x.job_spec = "/tmp/spec.yaml";
    x.fr_dump_dir = "/tmp/fr";
    x.upload_dir = "/tmp/up";
    x.fault = "hang:rank=5,step=3";
    x.tls.ca_file = "/ca";
    x.tls.cert_file = "/cert";
    x.tls.key_file = "/key";
    const EnvMap m = AsMap(x.ToEnv());
    CHECK(m.size() == 18);
    CHECK(m.at("EMBER_RANK") == "5");
    CHECK(m.at("EMBER_LOCAL_WORLD_SIZE") == "4");
    CHECK(m.at("EMBER_TLS_KEY") == "/key");
    auto y = Read(m);
    REQUIRE(y.ok());
    CHECK(*y == x);
    y->tls.key_file = "/other";
    CHECK(*y != x);  // equality looks at every field
  }
  SECTION("only the required variables: defaults survive the round trip") {
    auto x = Read({{"EMBER_STORE_ADDR", "h:1"}, {"EMBER_JOB_ID", "j"}, {"EMBER_RANK", "0"},
                   {"EMBER_WORLD_SIZE", "1"}, {"EMBER_JOB_DIR", "/d"}});
    REQUIRE(x.ok());
    const EnvMap m = AsMap(x->ToEnv());
    CHECK(m.count("EMBER_AUTH_TOKEN_FILE") == 0);  // unset optional strings stay unset
    CHECK(m.count("EMBER_TLS_CA") == 0);
    CHECK(m.count("EMBER_WORKER_FAULT") == 0);
    auto y = Read(m);
    REQUIRE(y.ok());
    CHECK(*y == *x);
  }
}

TEST_CASE("job keys: absolute keys are the attempt prefix plus the relative ones", "[job]") {
  CHECK(keys::JobPrefix("j") == "jobs/j/");
  CHECK(keys::FilesPrefix("j") == "jobs/j/files/");
  CHECK(keys::File("j", "data/a.bin") == "jobs/j/files/data/a.bin");
  CHECK(keys::AttemptPrefix("j", 3) == "jobs/j/attempt/3/");
  CHECK(keys::Stop("j", 3) == "jobs/j/attempt/3/stop");
  CHECK(keys::Failure("j", 3) == "jobs/j/attempt/3/failure");
  CHECK(keys::DumpRequest("j", 3) == "jobs/j/attempt/3/fr/dump_request");
  CHECK(keys::Exit("j", 3, 1) == "jobs/j/attempt/3/exit/1");
  CHECK(keys::Progress("j", 3, 12) == "jobs/j/attempt/3/progress/12");
  CHECK(keys::WorkerExit("j", 3, 0) == "jobs/j/attempt/3/worker_exit/0");
  CHECK(keys::ProgressOf(12) == "progress/12");
  CHECK(keys::WorkerExitOf(0) == "worker_exit/0");
  CHECK(keys::ExitOf(1) == "exit/1");
}


// torchrun's contract (torch/distributed/elastic/agent/server/local_elastic_agent.py in 1.13
// sets the same names); see torch_env.h for where Ember differs.
TEST_CASE("torchrun environment: every name once, OMP rule, visible devices", "[job]") {
  TorchEnv t;
  t.rank = 5;
  t.local_rank = 1;
  t.world_size = 8;
  t.local_world_size = 4;
  t.group_rank = 1;
  t.group_world_size = 2;
  t.master_addr = "10.0.0.1";
  t.master_port = 41234;
  t.restart_count = 2;
  t.max_restarts = 3;
  t.run_id = "job-1";
  t.flight_dir = "/j/flight/attempt-2";
  EnvMap m = AsMap(t.ToEnv());
  CHECK(m["RANK"] == "5");
  CHECK(m["LOCAL_RANK"] == "1");
  CHECK(m["WORLD_SIZE"] == "8");
  CHECK(m["LOCAL_WORLD_SIZE"] == "4");
  CHECK(m["GROUP_RANK"] == "1");
  CHECK(m["GROUP_WORLD_SIZE"] == "2");
  CHECK(m["ROLE_RANK"] == "5");
  CHECK(m["ROLE_WORLD_SIZE"] == "8");
  CHECK(m["ROLE_NAME"] == "default");
  CHECK(m["MASTER_ADDR"] == "10.0.0.1");
  CHECK(m["MASTER_PORT"] == "41234");
  CHECK(m["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(m["TORCHELASTIC_MAX_RESTARTS"] == "3");
  CHECK(m["TORCHELASTIC_RUN_ID"] == "job-1");
  CHECK(m["TORCHELASTIC_USE_AGENT_STORE"] == "True");  // rank 0 must not bind MASTER_PORT
  CHECK(m["OMP_NUM_THREADS"] == "1");
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "");  // a CPU rank sees no GPU
  CHECK(m["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/j/flight/attempt-2/torch-rank-");
  CHECK(m["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1");
  CHECK(m.count("GLOO_SOCKET_IFNAME") == 0);  // gloo's default unless the daemon names one
  t.gloo_socket_ifname = "eth1";
  CHECK(AsMap(t.ToEnv())["GLOO_SOCKET_IFNAME"] == "eth1");
  CHECK_FALSE(IsTorchContractName("GLOO_SOCKET_IFNAME"));  // worker.env may choose another
  t.gloo_socket_ifname.clear();
  t.local_world_size = 1;
  t.cuda = true;
  t.cuda_visible_devices = "3";
  m = AsMap(t.ToEnv());
  CHECK(m.count("OMP_NUM_THREADS") == 0);  // torchrun sets it only for several local ranks
  CHECK(m["CUDA_VISIBLE_DEVICES"] == "3");
  for (const auto& [k, v] : t.ToEnv()) CHECK(IsTorchContractName(k));
  CHECK(IsTorchContractName("EMBER_RANK"));
  CHECK_FALSE(IsTorchContractName("OMP_NUM_THREADS"));
  CHECK_FALSE(IsTorchContractName("NCCL_DEBUG"));
}
}  // namespace
}  // namespace ember::job
