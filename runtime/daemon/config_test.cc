// emberd's settings: defaults, the YAML file (unknown keys and wrong types named), flags over the
// file, the checks of ToDaemonOptions, the sample config in deploy/.
#include "runtime/daemon/config.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "runtime/base/auth.h"

namespace ember::daemon {
namespace {

std::string Tmp(const std::string& name) {
  const char* t = getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

std::string Write(const std::string& name, const std::string& text) {
  std::string path = Tmp(name);
  std::ofstream(path) << text;
  return path;
}

absl::Status Load(const std::string& text, EmberdConfig* cfg) {
  return LoadEmberdConfig(Write("emberd.yaml", text), cfg);
}

TEST_CASE("config: the defaults are emberd's documented ones") {
  // The values the settings had before they moved into proto/daemon_config.proto.
  EmberdConfig cfg;
  CHECK(cfg.node_name().empty());
  CHECK(cfg.listen() == "127.0.0.1:29400");
  CHECK(cfg.advertise().empty());
  CHECK(!cfg.host_store());
  CHECK(cfg.store_listen() == "127.0.0.1:29500");
  CHECK(cfg.store_data_dir().empty());
  CHECK(cfg.store().empty());
  CHECK(cfg.auth_token_file().empty());
  CHECK(!cfg.insecure_no_auth());
  CHECK(cfg.tls_cert().empty());
  CHECK(cfg.tls_key().empty());
  CHECK(cfg.tls_ca().empty());
  CHECK(cfg.tls_verify_clients());
  CHECK(cfg.work_root() == "/var/lib/ember/jobs");
  CHECK(cfg.state_dir().empty());
  CHECK(cfg.worker_binary() == "/usr/local/bin/ember-worker");
  CHECK(cfg.cpu_slots() == -1);
  CHECK(cfg.cuda_devices() == -1);
  CHECK(cfg.data_root().empty());
  CHECK(cfg.keep_finished_jobs() == 100);
  CHECK(cfg.finished_job_ttl_h() == 168);
  CHECK(cfg.scheduler());
  CHECK(cfg.lease_ttl_s() == 6);
  CHECK(cfg.poll_s() == 0.1);
  CHECK(cfg.restart_backoff_s() == 1);
  CHECK(!cfg.drain_on_sigterm());
  cfg.set_host_store(true);
  cfg.set_insecure_no_auth(true);
  auto o = ToDaemonOptions(cfg);
  REQUIRE(o.ok());
  CHECK(o->listen == "127.0.0.1:29400");
  CHECK(o->work_root == "/var/lib/ember/jobs");
  CHECK(o->inventory.cpu_slots == -1);
  CHECK(o->tls.verify_clients);
  CHECK(o->keep_finished_jobs == 100);
  CHECK(o->finished_job_ttl == absl::Hours(168));
  CHECK(o->lease_ttl == absl::Seconds(6));
  CHECK(o->heartbeat == absl::Seconds(1));
  CHECK(o->poll == absl::Milliseconds(100));
  CHECK(o->restart_backoff == absl::Seconds(1));
  CHECK(o->scheduler);
  CHECK(o->http_listen == "127.0.0.1:29401");  // http_listen: auto
  CHECK(o->metrics_require_token);
  CHECK(o->metrics.finished_jobs == 10);
  CHECK(cfg.process_cgroup() == "auto");
  CHECK(o->process_cgroup == "auto");
  // Every setting is listed by --help with its default.
  std::string help = ConfigFlagsHelp();
  CHECK(absl::StrContains(help, "--work_root=string"));
  CHECK(absl::StrContains(help, "(default /var/lib/ember/jobs)"));
  CHECK(absl::StrContains(help, "--data_root=A,B,..."));
  CHECK(!absl::StrContains(help, "cgroup_root"));
}

TEST_CASE("config: unknown keys and wrong types are refused, naming the key and the file") {
  EmberdConfig cfg;
  auto s = Load("host_store: true\nwork_rot: /x\n", &cfg);
  REQUIRE(absl::IsInvalidArgument(s));
  CHECK(absl::StrContains(s.message(), "work_rot: unknown field"));
  CHECK(absl::StrContains(s.message(), "emberd.yaml"));
  CHECK(absl::StrContains(s.message(), "work_root"));  // the allowed keys are listed
  for (const char* bad : {"cpu_slots: lots\n", "host_store: maybe\n", "poll_s: fast\n",
                          "data_root: /data\n", "listen: [a, b]\n"}) {
    cfg = EmberdConfig();
    s = Load(bad, &cfg);
    INFO(bad << " -> " << s);
    REQUIRE(absl::IsInvalidArgument(s));
    std::string key(bad, std::string(bad).find(':'));
    CHECK(absl::StrContains(s.message(), key + ":"));
  }
  s = Load("host_store: true\nhost_store: false\n", &cfg);
  CHECK(absl::StrContains(s.message(), "duplicate key on line 2"));
  // The cgroup setting is gone (it never set limits): an old config says so instead of lying.
  s = Load("cgroup_root: /sys/fs/cgroup/ember\n", &cfg);
  REQUIRE(absl::IsInvalidArgument(s));
  CHECK(absl::StrContains(s.message(), "cgroup_root was removed"));
  CHECK(absl::IsNotFound(LoadEmberdConfig(Tmp("no-such.yaml"), &cfg)));
}

TEST_CASE("config: process_cgroup is auto, off or an absolute path") {
  for (const char* good : {"off", "auto", "/sys/fs/cgroup/ember.slice"}) {
    EmberdConfig cfg;
    REQUIRE(Load(absl::StrCat("insecure_no_auth: true\nhost_store: true\nprocess_cgroup: ", good, "\n"), &cfg).ok());
    auto o = ToDaemonOptions(cfg);
    INFO(good);
    REQUIRE(o.ok());
    CHECK(o->process_cgroup == good);
  }
  for (const char* bad : {"on", "sys/fs/cgroup", "\"\""}) {
    EmberdConfig cfg;
    REQUIRE(Load(absl::StrCat("insecure_no_auth: true\nhost_store: true\nprocess_cgroup: ", bad, "\n"), &cfg).ok());
    auto o = ToDaemonOptions(cfg);
    INFO(bad << " -> " << o.status());
    REQUIRE(absl::IsInvalidArgument(o.status()));
    CHECK(absl::StrContains(o.status().message(), "process_cgroup"));
  }
}

TEST_CASE("config: flags override the file; other arguments pass through") {
  EmberdConfig cfg;
  REQUIRE(Load("host_store: true\ncpu_slots: 3\nwork_root: /a\ndata_root: [/d1, /d2]\n"
               "keep_finished_jobs: 5\n", &cfg).ok());
  CHECK(cfg.cpu_slots() == 3);
  CHECK(cfg.data_root_size() == 2);
  CHECK(cfg.listen() == "127.0.0.1:29400");  // not in the file: the default
  EmberdConfig flags;
  auto rest = ParseConfigFlags({"emberd", "--config=/etc/ember/emberd.yaml", "--cpu-slots=5",
                                "--work_root", "/b", "--data-root=/e,/f", "--no-scheduler",
                                "--log_level=debug", "-poll_s=0.5", "--drain_on_sigterm",
                                "--tls_verify_clients=false", "positional"},
                               &flags);
  REQUIRE(rest.ok());
  CHECK(*rest == std::vector<std::string>{"emberd", "--config=/etc/ember/emberd.yaml",
                                          "--log_level=debug", "positional"});
  OverrideConfig(flags, &cfg);
  CHECK(cfg.cpu_slots() == 5);
  CHECK(cfg.work_root() == "/b");
  CHECK(std::vector<std::string>(cfg.data_root().begin(), cfg.data_root().end()) ==
        std::vector<std::string>{"/e", "/f"});
  CHECK(!cfg.scheduler());
  CHECK(cfg.poll_s() == 0.5);
  CHECK(cfg.drain_on_sigterm());
  CHECK(!cfg.tls_verify_clients());
  CHECK(cfg.host_store());               // from the file
  CHECK(cfg.keep_finished_jobs() == 5);  // from the file
  EmberdConfig neg;
  REQUIRE(ParseConfigFlags({"emberd", "--no_scheduler=false", "--nohost_store"}, &neg).ok());
  CHECK(neg.has_scheduler());
  CHECK(neg.scheduler());
  CHECK(neg.has_host_store());
  CHECK(!neg.host_store());
  // Bad flag values are named.
  for (std::vector<std::string> bad :
       {std::vector<std::string>{"emberd", "--cpu_slots=abc"}, {"emberd", "--work-root"},
        {"emberd", "--host_store=perhaps"}, {"emberd", "--no_scheduler=maybe"}}) {
    EmberdConfig f;
    auto r = ParseConfigFlags(bad, &f);
    INFO(bad[1] << " -> " << r.status());
    REQUIRE(absl::IsInvalidArgument(r.status()));
    std::string name = bad[1].substr(0, bad[1].find('='));
    std::replace(name.begin(), name.end(), '-', '_');
    CHECK(absl::StrContains(r.status().message(), "--" + name.substr(2)));
  }
}

TEST_CASE("config: tokens, retention and TLS are checked by ToDaemonOptions") {
  EmberdConfig cfg;
  REQUIRE(Load("host_store: true\ncpu_slots: 3\n", &cfg).ok());
  auto o = ToDaemonOptions(cfg);
  REQUIRE(absl::IsInvalidArgument(o.status()));
  CHECK(absl::StrContains(o.status().message(), "auth_token_file"));
  std::string tok = Tmp("token");
  REQUIRE(base::WriteTokenFile(tok, base::GenerateToken()).ok());
  cfg.set_auth_token_file(tok);
  o = ToDaemonOptions(cfg);
  REQUIRE(o.ok());
  CHECK(o->auth_token.size() == 64);
  CHECK(o->inventory.cpu_slots == 3);
  REQUIRE(Load("keep_finished_jobs: 5\nfinished_job_ttl_h: 0.5\n", &cfg).ok());
  o = ToDaemonOptions(cfg);
  REQUIRE(o.ok());
  CHECK(o->keep_finished_jobs == 5);
  CHECK(o->finished_job_ttl == absl::Minutes(30));
  cfg.set_keep_finished_jobs(-1);
  CHECK(absl::IsInvalidArgument(ToDaemonOptions(cfg).status()));
  cfg.set_keep_finished_jobs(5);
  // TLS: a CA without a certificate cannot serve; a missing key file is named.
  REQUIRE(Load(absl::StrCat("tls_ca: ", tok, "\ntls_verify_clients: false\n"), &cfg).ok());
  CHECK(!cfg.tls_verify_clients());
  o = ToDaemonOptions(cfg);
  REQUIRE(absl::IsInvalidArgument(o.status()));
  CHECK(absl::StrContains(o.status().message(), "--tls-cert and --tls-key"));
  cfg.set_tls_cert(tok);
  cfg.set_tls_key(Tmp("no-such.key"));
  o = ToDaemonOptions(cfg);
  REQUIRE(!o.ok());
  CHECK(absl::StrContains(o.status().message(), "no-such.key"));
  // Without a hosted store, a store address is required.
  EmberdConfig joiner;
  joiner.set_insecure_no_auth(true);
  CHECK(absl::StrContains(ToDaemonOptions(joiner).status().message(), "--store=HOST:PORT"));
}

TEST_CASE("config: store: etcd://... hosts a store backed by etcd, with its etcd settings") {
  EmberdConfig cfg;
  REQUIRE(Load("insecure_no_auth: true\nstore: etcd://127.0.0.1:2379, http://h2:2379/team\n"
               "store_listen: 127.0.0.1:0\n", &cfg).ok());
  auto o = ToDaemonOptions(cfg);
  REQUIRE(o.ok());
  CHECK(o->host_store);
  CHECK(o->store_address.empty());
  CHECK(o->store_listen == "127.0.0.1:0");
  REQUIRE(o->store_backend != nullptr);
  CHECK(o->store_backend_name == "etcd [127.0.0.1:2379,h2:2379] prefix /team/");
  // The default prefix is ember-store's (/ember/), so both can share one etcd key space.
  cfg.set_store("etcd://a:2379");
  CHECK(ToDaemonOptions(cfg)->store_backend_name == "etcd [a:2379] prefix /ember/");
  // A password file's content never shows; user without password (and the reverse) is refused.
  const std::string pw = Tmp("etcd-pw");
  std::ofstream(pw) << "s3cret-pass\n";
  cfg.set_etcd_user("ember");
  auto bad = ToDaemonOptions(cfg);
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(absl::StrContains(bad.status().message(), "etcd_password_file"));
  cfg.set_etcd_password_file(pw);
  cfg.set_etcd_tls_ca(pw);
  o = ToDaemonOptions(cfg);
  REQUIRE(o.ok());
  CHECK(o->store_backend_name == "etcd [a:2379] prefix /ember/, user ember, tls");
  CHECK(!absl::StrContains(o->store_backend_name, "s3cret"));
  cfg.clear_etcd_user();
  CHECK(absl::StrContains(ToDaemonOptions(cfg).status().message(), "needs etcd_user"));
  cfg.clear_etcd_password_file();
  // Bad URLs, a data dir (etcd keeps the data) and a bad timeout are named.
  for (const char* url : {"etcd://", "etcd://hostonly", "etcd:///prefix"}) {
    cfg.set_store(url);
    auto r = ToDaemonOptions(cfg);
    REQUIRE(absl::IsInvalidArgument(r.status()));
    CHECK(absl::StrContains(r.status().message(), url));
  }
  cfg.set_store("etcd://a:2379");
  cfg.set_store_data_dir("/tmp/x");
  CHECK(absl::StrContains(ToDaemonOptions(cfg).status().message(), "store_data_dir"));
  cfg.clear_store_data_dir();
  cfg.set_etcd_op_timeout_s(0);
  CHECK(absl::StrContains(ToDaemonOptions(cfg).status().message(), "etcd_op_timeout_s"));
  // A plain address still joins a store elsewhere.
  cfg.set_etcd_op_timeout_s(15);
  cfg.set_store("10.0.0.1:29500");
  o = ToDaemonOptions(cfg);
  REQUIRE(o.ok());
  CHECK(!o->host_store);
  CHECK(o->store_backend == nullptr);
}

TEST_CASE("config: http_listen and metrics_auth") {
  CHECK(*HttpListenOf("auto", "10.0.0.5:7000") == "10.0.0.5:7001");
  CHECK(*HttpListenOf("auto", "127.0.0.1:0") == "127.0.0.1:0");
  CHECK(*HttpListenOf("auto", "[::1]:29400") == "127.0.0.1:29401");  // HTTP is IPv4 only
  CHECK(*HttpListenOf("auto", "[::]:29400") == "0.0.0.0:29401");
  CHECK(absl::IsInvalidArgument(HttpListenOf("auto", "[fe80::1]:29400").status()));
  CHECK(HttpListenOf("", "127.0.0.1:29400")->empty());  // off
  CHECK(*HttpListenOf("0.0.0.0:9100", "127.0.0.1:29400") == "0.0.0.0:9100");
  CHECK(absl::IsInvalidArgument(HttpListenOf("auto", "no-port").status()));
  EmberdConfig cfg;
  cfg.set_host_store(true);
  cfg.set_insecure_no_auth(true);
  cfg.set_metrics_auth("none");
  REQUIRE(ToDaemonOptions(cfg).ok());
  CHECK(!ToDaemonOptions(cfg)->metrics_require_token);
  cfg.set_metrics_auth("basic");
  auto bad = ToDaemonOptions(cfg);
  CHECK(absl::StrContains(bad.status().message(), "metrics_auth: 'basic'"));
  cfg.set_metrics_auth("token");
  cfg.set_metrics_finished_jobs(-1);
  CHECK(absl::StrContains(ToDaemonOptions(cfg).status().message(), "metrics_finished_jobs"));
}

TEST_CASE("config: the sample in deploy/ parses") {
  EmberdConfig cfg;
  REQUIRE(LoadEmberdConfig("deploy/emberd.yaml", &cfg).ok());
  CHECK(cfg.host_store());
  CHECK(cfg.store_data_dir() == "/var/lib/ember/store");
  CHECK(cfg.auth_token_file() == "/etc/ember/token");
  CHECK(cfg.cpu_slots() == -1);
  CHECK(cfg.http_listen() == "auto");
  CHECK(cfg.metrics_auth() == "token");
}

}  // namespace
}  // namespace ember::daemon
