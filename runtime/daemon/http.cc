// The daemon's HTTP endpoint (base::HttpServer) and its /metrics handler: a snapshot of what the
// daemon knows, rendered by MetricsExporter (metrics.h), reused for scrapes within a second. The
// job pages register on the same server (Daemon::http_server()).
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/grpc_server.h"
#include "runtime/base/status_macros.h"
#include "runtime/daemon/daemon_impl.h"
#include "runtime/daemon/keys.h"
#include "runtime/job/env.h"
#include "spdlog/spdlog.h"

namespace ember::daemon {

namespace {
constexpr absl::Duration kScrapeReuse = absl::Seconds(1);
}  // namespace

absl::Status Daemon::Impl::StartHttp() {
  base::HttpServerOptions ho = opts.http;
  ho.listen = opts.http_listen;
  absl::StatusOr<std::unique_ptr<base::HttpServer>> started = base::HttpServer::Start(ho);
  if (!started.ok()) return base::Annotate(started.status(), "http_listen");
  http = std::move(*started);
  const bool loopback = absl::StartsWith(http->address(), "127.") ||
                        absl::StartsWith(http->address(), "localhost:");
  if (opts.tls.enabled() && !loopback && opts.metrics_require_token && !opts.auth_token.empty()) {
    spdlog::warn("http {}: plain HTTP while the API uses TLS: Prometheus' bearer token (the "
                 "cluster token) crosses the network in clear text; bind http_listen to loopback "
                 "or use metrics_auth: none on a trusted network", http->address());
  }
  http->Handle("/metrics", [this](const base::HttpRequest& r) { return ServeMetrics(r); });
  return absl::OkStatus();
}

MetricsSnapshot Daemon::Impl::TakeSnapshot() {
  MetricsSnapshot s;
  s.node = opts.node_name;
  s.leader = leader;
  s.cpu_slots = inventory->cpu_slots();
  for (const std::string& d : inventory->devices()) ++s.devices[d.substr(0, d.find(':'))];
  ReadMemInfo(&s.memory_total_bytes, &s.memory_available_bytes);
  if (const Nvml* nvml = inventory->nvml()) {
    s.nvml = true;
    for (int i = 0; i < inventory->cuda_devices(); ++i) s.gpus.push_back(nvml->Sample(i));
  }
  {
    absl::MutexLock l(&mu);
    for (const auto& [key, a] : local) {
      if (a.released) continue;
      for (const std::string& d : a.devices) ++s.devices_in_use[d.substr(0, d.find(':'))];
      for (const LocalWorker& w : a.workers) {
        if (w.exited) continue;
        ++s.workers;
        s.ranks.push_back({a.job, a.attempt, w.rank, job::MetricsPath(JobDir(a.job), w.rank)});
      }
    }
  }
  if (s.leader) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<std::vector<std::string>> names = store->ListKeys("joblist/");
    std::vector<std::string> ids, records;
    if (names.ok()) {
      for (const std::string& k : *names) {
        std::string id = k.substr(k.find('/') + 1);
        if (!CheckJobId(id).ok()) continue;  // not one emberd wrote (spec_policy.h)
        records.push_back(keys::Record(id));
        ids.push_back(std::move(id));
      }
    }
    absl::StatusOr<std::vector<std::optional<std::string>>> values =
        names.ok() ? store->MultiGet(records) : names.status();
    metrics->ObserveStoreOp("read_jobs", absl::ToDoubleSeconds(absl::Now() - t0));
    if (!values.ok()) {
      s.snapshot_error = values.status().ToString();
    } else {
      for (size_t i = 0; i < values->size() && i < ids.size(); ++i) {
        if (!(*values)[i]) continue;
        auto j = ParseRecord(ids[i], *(*values)[i]);  // its id is its key's (records.cc)
        if (j.ok()) s.jobs.push_back(std::move(*j));
      }
    }
  }
  return s;
}

base::HttpResponse Daemon::Impl::ServeMetrics(const base::HttpRequest& req) {
  base::HttpResponse resp;
  if (req.method != "GET" && req.method != "HEAD") {
    resp.status = 405;
    resp.headers.push_back({"Allow", "GET, HEAD"});
    resp.body = "only GET and HEAD\n";
    return resp;
  }
  if (opts.metrics_require_token && !opts.auth_token.empty()) {
    const std::string auth = req.Header("authorization");
    if (!absl::StartsWith(auth, "Bearer ") ||
        !base::ConstantTimeEquals(auth.substr(7), opts.auth_token)) {
      resp.status = 401;
      resp.headers.push_back({"WWW-Authenticate", "Bearer realm=\"emberd\""});
      resp.body = "metrics_auth is token: send Authorization: Bearer <cluster token>\n";
      return resp;
    }
  }
  resp.content_type = "text/plain; version=0.0.4; charset=utf-8";
  absl::MutexLock l(&scrape_mu);  // one render at a time; concurrent scrapers share it
  const absl::Time now = absl::Now();
  if (now - scrape_at >= kScrapeReuse || now < scrape_at) {
    scrape_text = metrics->Render(TakeSnapshot());
    scrape_at = now;
  }
  resp.body = scrape_text;
  return resp;
}

}  // namespace ember::daemon
