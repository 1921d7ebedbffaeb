// emberd: the Ember node daemon.
//
//   emberd --config=/etc/ember/emberd.yaml            # a config file (flags override it)
//   emberd --host-store --auth-token-file=/etc/ember/token --work-root=/var/lib/ember/jobs
//          --worker-binary=/usr/local/bin/ember-worker   (one line)
//
// Under systemd (Type=notify): READY=1 once the API port is bound, devices are inventoried and the
// node is registered; WATCHDOG=1 only while the control loop and the store heartbeat make progress;
// STATUS= lines.
//
// Signals (docs/operations.md "Restarting emberd"):
//   SIGTERM  detach (default): stop serving, persist state, exit; workers keep running and the next
//            emberd with the same state_dir re-attaches to them. This is what `systemctl restart`
//            and `systemctl stop` send; with KillMode=process systemd signals only the daemon.
//            With --drain_on_sigterm (config drain_on_sigterm: true) SIGTERM drains instead.
//   SIGINT   drain: no new jobs, this node's workers stopped, devices released, node deregistered
//            (`systemctl kill -s INT emberd`, or Ctrl-C).
// Exit codes: 0 clean shutdown, 1 start-up failure, 2 bad flags or config.
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/flight/verdict.h"
#include "grpcpp/grpcpp.h"
#include "proto/jobs.grpc.pb.h"
#include "runtime/base/flags.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/config.h"
#include "runtime/daemon/daemon.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "YAML config file (keys = these flag names with underscores)");
ABSL_FLAG(std::string, node_name, "", "node name (default: host name)");
ABSL_FLAG(std::string, listen, "", "Jobs/Nodes API address (default 127.0.0.1:29400)");
ABSL_FLAG(std::string, advertise, "", "address other daemons and clients use for this one");
ABSL_FLAG(bool, host_store, false, "host the rendezvous store in this process");
ABSL_FLAG(std::string, store_listen, "", "hosted store address (default 127.0.0.1:29500)");
ABSL_FLAG(std::string, store_data_dir, "", "hosted store durability directory");
ABSL_FLAG(std::string, store, "", "address of the store to join (without --host-store)");
ABSL_FLAG(std::string, auth_token_file, "", "file with the cluster token (required)");
ABSL_FLAG(bool, insecure_no_auth, false, "run WITHOUT authentication (testing only)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate: serve TLS (API and hosted store); also presented when dialing (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA: verifies the store and daemons this one dials; as a server, requires and "
          "verifies client certificates (mTLS) unless --tls-verify-clients=false");
ABSL_FLAG(bool, tls_verify_clients, true,
          "with --tls-ca: require client certificates (mTLS); false = TLS without client certs");
ABSL_FLAG(std::string, work_root, "", "job directories (default /var/lib/ember/jobs)");
ABSL_FLAG(std::string, state_dir, "", "persisted worker state (default <work-root>/.emberd/<node>)");
ABSL_FLAG(std::string, worker_binary, "", "the ember-worker executable");
ABSL_FLAG(int, cpu_slots, -2, "CPU ranks offered (-1 = online cores)");
ABSL_FLAG(int, cuda_devices, -2, "CUDA devices offered (-1 = detect)");
ABSL_FLAG(std::string, data_root, "", "comma-separated absolute dirs specs may read data from");
ABSL_FLAG(int, keep_finished_jobs, -1, "finished jobs kept in the store (default 100; 0 = no count limit)");
ABSL_FLAG(double, finished_job_ttl_h, -1, "hours a finished job stays in the store (default 168; 0 = no age limit)");
ABSL_FLAG(bool, no_scheduler, false, "never act as the scheduler");
ABSL_FLAG(double, lease_ttl_s, -1, "node lease TTL in seconds (default 6)");
ABSL_FLAG(double, poll_s, -1, "supervision period in seconds (default 0.1)");
ABSL_FLAG(double, restart_backoff_s, -1, "first restart delay in seconds (default 1)");
ABSL_FLAG(bool, drain_on_sigterm, false, "SIGTERM drains (stops workers) instead of detaching");

// Liveness as a client sees it: a new connection to the API (its own subchannel, never a cached
// one) and a real call. A daemon whose listener stopped accepting is not alive, however busy its
// control loop is.
absl::Status ProbeApi(const ember::daemon::DaemonOptions& o, std::string address) {
  for (const char* any : {"0.0.0.0:", "[::]:"}) {
    if (absl::StartsWith(address, any)) address = "127.0.0.1:" + address.substr(strlen(any));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (o.tls.enabled()) {
    auto c = ember::base::MakeChannelCredentials(o.tls);
    if (!c.ok()) return c.status();
    creds = *c;
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = ember::jobs::v1::Nodes::NewStub(grpc::CreateCustomChannel(address, creds, args));
  grpc::ClientContext ctx;
  if (!o.auth_token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.auth_token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ember::jobs::v1::ListNodesResponse resp;
  return ember::base::FromGrpcStatus(stub->List(&ctx, {}, &resp));
}

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "emberd");
  ember::base::RaiseOpenFileLimit();  // connection limits are sized from it
  ember::daemon::EmberdConfig cfg;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::Status s = ember::daemon::LoadEmberdConfig(absl::GetFlag(FLAGS_config), &cfg);
    if (!s.ok()) {
      std::cerr << "emberd: " << s.message() << "\n";
      return 2;
    }
  }
  auto str = [](const std::string& flag, std::string* field) {
    if (!flag.empty()) *field = flag;
  };
  str(absl::GetFlag(FLAGS_node_name), &cfg.node_name);
  str(absl::GetFlag(FLAGS_listen), &cfg.listen);
  str(absl::GetFlag(FLAGS_advertise), &cfg.advertise);
  if (absl::GetFlag(FLAGS_host_store)) cfg.host_store = true;
  str(absl::GetFlag(FLAGS_store_listen), &cfg.store_listen);
  str(absl::GetFlag(FLAGS_store_data_dir), &cfg.store_data_dir);
  str(absl::GetFlag(FLAGS_store), &cfg.store);
  str(absl::GetFlag(FLAGS_auth_token_file), &cfg.auth_token_file);
  if (absl::GetFlag(FLAGS_insecure_no_auth)) cfg.insecure_no_auth = true;
  str(absl::GetFlag(FLAGS_tls_cert), &cfg.tls.cert_file);
  str(absl::GetFlag(FLAGS_tls_key), &cfg.tls.key_file);
  str(absl::GetFlag(FLAGS_tls_ca), &cfg.tls.ca_file);
  if (!absl::GetFlag(FLAGS_tls_verify_clients)) cfg.tls.verify_clients = false;
  str(absl::GetFlag(FLAGS_work_root), &cfg.work_root);
  str(absl::GetFlag(FLAGS_state_dir), &cfg.state_dir);
  str(absl::GetFlag(FLAGS_worker_binary), &cfg.worker_binary);
  if (absl::GetFlag(FLAGS_cpu_slots) != -2) cfg.cpu_slots = absl::GetFlag(FLAGS_cpu_slots);
  if (absl::GetFlag(FLAGS_cuda_devices) != -2) cfg.cuda_devices = absl::GetFlag(FLAGS_cuda_devices);
  if (!absl::GetFlag(FLAGS_data_root).empty()) {
    cfg.data_roots = absl::StrSplit(absl::GetFlag(FLAGS_data_root), ',', absl::SkipEmpty());
  }
  if (absl::GetFlag(FLAGS_keep_finished_jobs) >= 0) {
    cfg.keep_finished_jobs = absl::GetFlag(FLAGS_keep_finished_jobs);
  }
  if (absl::GetFlag(FLAGS_finished_job_ttl_h) >= 0) {
    cfg.finished_job_ttl_h = absl::GetFlag(FLAGS_finished_job_ttl_h);
  }
  if (absl::GetFlag(FLAGS_no_scheduler)) cfg.scheduler = false;
  if (absl::GetFlag(FLAGS_lease_ttl_s) >= 0) cfg.lease_ttl_s = absl::GetFlag(FLAGS_lease_ttl_s);
  if (absl::GetFlag(FLAGS_poll_s) >= 0) cfg.poll_s = absl::GetFlag(FLAGS_poll_s);
  if (absl::GetFlag(FLAGS_restart_backoff_s) >= 0) {
    cfg.restart_backoff_s = absl::GetFlag(FLAGS_restart_backoff_s);
  }
  if (absl::GetFlag(FLAGS_drain_on_sigterm)) cfg.drain_on_sigterm = true;

  auto opts = ember::daemon::ToDaemonOptions(cfg);
  if (!opts.ok()) {
    std::cerr << "emberd: " << opts.status().message() << "\n";
    return 2;
  }
  opts->analyze_flight = ember::FlightVerdict;  // the analyzer's verdict on failed attempts

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  sd_notify(0, "STATUS=starting: inventory, store, registration");
  auto daemon = ember::daemon::Daemon::Start(*opts);
  if (!daemon.ok()) {
    spdlog::error("emberd failed to start: {}", daemon.status().ToString());
    sd_notifyf(0, "STATUS=failed: %s", std::string(daemon.status().message()).c_str());
    return 1;
  }
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s (store %s)", (*daemon)->address().c_str(),
             (*daemon)->store_address().c_str());

  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    uint64_t usec = 0;
    bool enabled = sd_watchdog_enabled(0, &usec) > 0;
    absl::Duration every = enabled ? absl::Microseconds(usec / 3) : absl::Seconds(5);
    while (!done) {
      absl::Time until = absl::Now() + every;
      while (!done && absl::Now() < until) absl::SleepFor(absl::Milliseconds(50));
      if (done) break;
      absl::Status api = ProbeApi(*opts, (*daemon)->address());
      if (!api.ok()) {
        spdlog::warn("liveness check failed: the API does not answer a new connection ({})",
                     api.ToString());
        sd_notifyf(0, "STATUS=unhealthy: API does not answer: %s",
                   std::string(api.message()).c_str());
      } else if ((*daemon)->Healthy()) {
        sd_notifyf(0, "%sSTATUS=%s", enabled ? "WATCHDOG=1\n" : "",
                   (*daemon)->StatusLine().c_str());
      } else {
        spdlog::warn("liveness check failed (control loop or store heartbeat stalled)");
        sd_notifyf(0, "STATUS=unhealthy: control loop or store heartbeat stalled");
      }
    }
  });

  int sig = 0;
  sigwait(&set, &sig);
  const bool drain = sig == SIGINT || cfg.drain_on_sigterm;
  spdlog::info("emberd: signal {}; {}", sig, drain ? "draining" : "detaching (workers keep running)");
  sd_notify(0, drain ? "STOPPING=1\nSTATUS=draining" : "STOPPING=1\nSTATUS=detaching");
  if (drain) (*daemon)->Drain();
  else (*daemon)->Detach();
  done = true;
  watchdog.join();
  daemon->reset();
  return 0;
}
