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
// Settings: proto/daemon_config.proto (`emberd --help` lists them with their defaults).
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
#include "runtime/flight/verdict.h"
#include "grpcpp/grpcpp.h"
#include "proto/jobs.grpc.pb.h"
#include "runtime/base/flags.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/auth.h"
#include "runtime/daemon/config.h"
#include "runtime/daemon/daemon.h"
#include "spdlog/spdlog.h"

// The settings are proto/daemon_config.proto's fields, taken out of the command line by
// ParseConfigFlags (config.h); only --config and the logging flags are absl flags.
ABSL_FLAG(std::string, config, "", "YAML config file (keys = the setting names; flags override it)");

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
  ember::daemon::EmberdConfig flags;
  auto rest = ember::daemon::ParseConfigFlags(std::vector<std::string>(argv, argv + argc), &flags);
  if (!rest.ok()) {
    std::cerr << "emberd: " << rest.status().message() << "\n";
    return 2;
  }
  for (const std::string& a : *rest) {
    if (a == "--help" || a == "-help" || a == "-h") {
      std::cout << "emberd: the Ember node daemon.\n\nsettings (flags, or keys of the --config "
                   "file; flags override the file):\n"
                << ember::daemon::ConfigFlagsHelp() << "\n";
    }
  }
  std::vector<char*> absl_argv;
  for (std::string& a : *rest) absl_argv.push_back(a.data());
  ember::base::ParseFlagsAndInitLogging(static_cast<int>(absl_argv.size()), absl_argv.data(),
                                        "emberd");
  ember::base::RaiseOpenFileLimit();  // connection limits are sized from it
  ember::daemon::EmberdConfig cfg;  // the defaults, then the file, then the flags
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::Status s = ember::daemon::LoadEmberdConfig(absl::GetFlag(FLAGS_config), &cfg);
    if (!s.ok()) {
      std::cerr << "emberd: " << s.message() << "\n";
      return 2;
    }
  }
  ember::daemon::OverrideConfig(flags, &cfg);

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
  const bool drain = sig == SIGINT || cfg.drain_on_sigterm();
  spdlog::info("emberd: signal {}; {}", sig, drain ? "draining" : "detaching (workers keep running)");
  sd_notify(0, drain ? "STOPPING=1\nSTATUS=draining" : "STOPPING=1\nSTATUS=detaching");
  if (drain) (*daemon)->Drain();
  else (*daemon)->Detach();
  done = true;
  watchdog.join();
  daemon->reset();
  return 0;
}
