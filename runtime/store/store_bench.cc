// store_bench: ember-store vs PyTorch's TCPStore, side by side in one run.
//
//   bazel run -c opt //runtime/store:store_bench -- [--json [--allow-missing-peers]] [--quick]
//       [--seconds=1] [--rounds=3] [--no_peer]
//
// For 1, 4 and 16 client processes: set/get/add ops/s with p50/p99 latency (each client one op in
// flight; the one-in-flight add is the headline), plus pipelined adds (store::Pipeline,
// --add_window in flight per client; informational only: TCPStore's client has no equivalent, it
// waits for each answer) and pipelined acknowledged sets. Then the time for 256 processes (one
// connection each) to connect and pass a barrier (Add, then Wait, on both sides), and 1024
// simulated ranks (64 processes x 16 connections; informational, no peer). The TCPStore peer runs the same loops
// from the same number of processes (tcpstore_peer.py under Debian's /usr/bin/python3).
//
// Like for like (issue 11): TCPStore speaks TCP, so every row that carries a TCPStore target runs
// our client over TCP loopback; the abstract-Unix-socket fast path appears in Ember-only rows.
// Each point runs --rounds times interleaved (ember tcp, tcpstore, ember unix, ember tcp, ...) and
// reports the medians, so both sides see the same machine load. Round trips per op are stated per
// row: TCPStore's get is wait + get (2); `add` is one on both (the headline); the barrier is add +
// wait on both (2, the last arrival also sets the done key).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/base/json.h"
#include "runtime/base/status_macros.h"
#include "runtime/store/client.h"
#include "runtime/store/etcd_backend.h"
#include "runtime/store/server.h"
#include "runtime/store/store_bench_util.h"

ABSL_FLAG(std::string, only, "", "run one part: 'ops' or 'barrier' (default: both)");
ABSL_FLAG(std::vector<std::string>, ops, {},
          "ops rows to run (default all): add,add_pipelined,get,set,set_pipelined");
ABSL_FLAG(std::string, server, "", "benchmark this running ember-store (host:port) instead of an "
          "in-process one");
ABSL_FLAG(std::string, backend, "memory",
          "backend of the in-process server: 'memory' or 'etcd' (needs --etcd_endpoints)");
ABSL_FLAG(std::string, etcd_endpoints, "", "with --backend etcd: host:port,... of a running etcd");

namespace ember::store {
namespace {

using namespace bench_util;  // NOLINT: the shared bench helpers

int Parent(int argc, char** argv) {
  bench::Report report("store_bench", argc, argv);
  const bool quick = bench::Quick();
  if (quick) absl::SetFlag(&FLAGS_seconds, std::min(absl::GetFlag(FLAGS_seconds), 0.2));
  const int rounds = quick ? 1 : std::max(1, absl::GetFlag(FLAGS_rounds));
  char tmpl[] = "/tmp/store-bench-XXXXXX";
  std::string tmpdir = mkdtemp(tmpl);
  std::unique_ptr<StoreServer> server;
  std::string addr = absl::GetFlag(FLAGS_server);
  if (addr.empty()) {
    StoreServerOptions opts{.address = "127.0.0.1:0"};
    if (absl::GetFlag(FLAGS_backend) == "etcd") {
      EtcdOptions e;
      e.endpoints = absl::StrSplit(absl::GetFlag(FLAGS_etcd_endpoints), ',', absl::SkipEmpty());
      if (e.endpoints.empty()) {
        return report.Fail(absl::InvalidArgumentError("--backend etcd needs --etcd_endpoints"));
      }
      e.prefix = absl::StrCat("/ember-bench/", getpid(), "/");
      opts.make_backend = [e](const BackendOptions& b, base::Clock*) {
        return NewEtcdBackend(e, b);
      };
    } else if (absl::GetFlag(FLAGS_backend) != "memory") {
      return report.Fail(absl::InvalidArgumentError("--backend is 'memory' or 'etcd'"));
    }
    report.SetMeta("backend", json::Value::Str(absl::GetFlag(FLAGS_backend)));
    auto started = StoreServer::Start(std::move(opts));
    if (!started.ok()) return report.Fail(started.status());
    server = std::move(*started);
    addr = server->address();
  }
  report.SetMeta("seconds_per_point", json::Value::Double(absl::GetFlag(FLAGS_seconds)));
  report.SetMeta("rounds", json::Value::Int(rounds));
  report.SetMeta("peer", json::Value::Str(absl::StrCat("PyTorch TCPStore, ", PeerTorchLabel(), ", tcpstore_peer.py")));

  bench::Table& table = report.AddTable(
      absl::StrCat("ops: ", absl::GetFlag(FLAGS_seconds), " s per point, median of ", rounds,
                   " interleaved rounds (ember tcp, tcpstore, ember unix)"),
      {"op", "transport", "clients", "RTT/op ember", "ember ops/s", "p50 us", "p99 us",
       "RTT/op tcpstore", "tcpstore ops/s", "p50 us", "p99 us", "ratio"});
  table.AddNote("transport: tcp = TCP loopback (the TCPStore comparison); unix = our abstract "
                "Unix socket fast path (Ember only, no target)");
  table.AddNote("RTT/op: round trips per call. TCPStore get = wait + get (2); its set is not "
                "acknowledged (0: no reply awaited); add is 1 on both, one op in flight per client "
                "on both (the headline)");
  table.AddNote(absl::StrCat(
      "add (pipelined): the same adds over TCP, ", absl::GetFlag(FLAGS_add_window),
      " in flight per client (store::Pipeline, --add_window; sent in frames of up to that many; "
      "p50/p99 from Add() to its answer, time queued in the window included); informational: "
      "TCPStore's client has no pipelined add (it waits for each answer), so its tcpstore column "
      "is TCPStore's one-at-a-time add, shown for scale, not a like-for-like comparison"));
  table.AddNote("set (acked, pipelined): --window acknowledged sets in flight per client; its "
                "tcpstore column is TCPStore's own (unacknowledged) set");
  std::vector<int> client_counts = quick ? std::vector<int>{1, 4} : std::vector<int>{1, 4, 16};
  std::vector<std::string> ops = {"add", "add_pipelined", "get", "set", "set_pipelined"};
  if (!absl::GetFlag(FLAGS_ops).empty()) {
    for (const std::string& op : absl::GetFlag(FLAGS_ops)) {
      if (std::find(ops.begin(), ops.end(), op) == ops.end()) {
        return report.Fail(absl::InvalidArgumentError(absl::StrCat(
            "--ops: unknown op '", op, "'; choose from add,add_pipelined,get,set,set_pipelined")));
      }
    }
    ops = absl::GetFlag(FLAGS_ops);
  }
  if (absl::GetFlag(FLAGS_only) == "barrier") ops.clear();
  auto rtt = [](const std::string& op, bool tcpstore) -> std::string {
    if (op == "add_pipelined") {
      return tcpstore ? "1" : absl::StrCat("1, pipelined (", absl::GetFlag(FLAGS_add_window),
                                           " in flight)");
    }
    if (op == "get") return tcpstore ? "2" : "1";
    if (op == "set") return tcpstore ? "0 (no reply)" : "1";
    if (op == "set_pipelined") return tcpstore ? "0 (no reply)" : "1, pipelined";
    return "1";
  };
  for (const std::string& op : ops) {
    for (int n : client_counts) {
      std::vector<OpsResult> tcp, uds, peer;
      std::string peer_error;
      std::string peer_op = op == "set_pipelined" ? "set" : op == "add_pipelined" ? "add" : op;
      for (int r = 0; r < rounds; ++r) {
        auto e = RunEmberOps(addr, "tcp", op, n, tmpdir);
        if (!e.ok()) return report.Fail(e.status());
        tcp.push_back(*e);
        auto pj = RunPeer(absl::StrCat("ops --op ", peer_op, " --clients ", n, " --seconds ",
                                       absl::GetFlag(FLAGS_seconds)),
                          tmpdir);
        if (pj.ok() && Num(*pj, "ops_per_s") > 0) {
          peer.push_back({Num(*pj, "ops_per_s"), Num(*pj, "p50_us"), Num(*pj, "p99_us")});
        } else {
          peer_error = pj.ok() ? "peer printed no ops_per_s" : std::string(pj.status().message());
          std::fprintf(stderr, "store_bench: %s\n", peer_error.c_str());
        }
        auto u = RunEmberOps(addr, "unix", op, n, tmpdir);
        if (!u.ok()) return report.Fail(u.status());
        uds.push_back(*u);
      }
      auto med = [](const std::vector<OpsResult>& v, double OpsResult::*f) -> std::optional<double> {
        if (v.empty()) return std::nullopt;
        std::vector<double> x;
        for (const auto& r : v) x.push_back(r.*f);
        return bench::Median(x);
      };
      const std::string label = op == "set_pipelined"   ? "set (acked, pipelined)"
                                : op == "add_pipelined" ? "add (pipelined)"
                                                        : op;
      std::optional<double> e_ops = med(tcp, &OpsResult::ops_per_s);
      std::optional<double> p_ops = med(peer, &OpsResult::ops_per_s);
      std::optional<double> ratio;
      if (p_ops) ratio = *e_ops / *p_ops;
      table.AddRow({label, "tcp", n, rtt(op, false), e_ops, med(tcp, &OpsResult::p50_us),
                    med(tcp, &OpsResult::p99_us), rtt(op, true), p_ops,
                    med(peer, &OpsResult::p50_us), med(peer, &OpsResult::p99_us), ratio});
      table.AddRow({label, "unix", n, rtt(op, false), med(uds, &OpsResult::ops_per_s),
                    med(uds, &OpsResult::p50_us), med(uds, &OpsResult::p99_us), bench::Cell(),
                    bench::Cell(), bench::Cell(), bench::Cell(), bench::Cell()});
      // Targets at every client count measured (1 client too, not only where the ratio is best).
      if (op == "get" || op == "add") {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat(op, "_ops_per_s_", n, "_clients_tcp"), *e_ops, p_ops, 2.0,
            bench::kHigherIsBetter, "ops/s", peer_error,
            absl::StrCat(
                op == "add"
                    ? "headline. compared: TCP loopback on both; 1 round trip per add and one add "
                      "in flight per client on both (no pipelining); "
                    : "compared: TCP loopback on both; one get in flight per client on both; "
                      "ember get 1 round trip, TCPStore get 2 (wait + get); ",
                n, " client processes on both, each timed ", absl::GetFlag(FLAGS_seconds),
                " s, one server (ember-store in the benchmark's process, TCPStore(is_master) in "
                "the peer's)")));
      }
      if (op == "add_pipelined") {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat("add_pipelined_ops_per_s_", n, "_clients_tcp"), *e_ops, p_ops, 2.0,
            bench::kHigherIsBetter, "ops/s", peer_error,
            absl::StrCat("informational: TCPStore has no equivalent (its client cannot pipeline: "
                         "it waits for each answer), so this compares ember with ",
                         absl::GetFlag(FLAGS_add_window), " adds in flight per client against "
                         "TCPStore's one-at-a-time add; TCP loopback on both; the like-for-like "
                         "figure is add_ops_per_s_", n, "_clients_tcp")));
      }
      if (op == "set_pipelined") {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat("acked_pipelined_set_vs_unacked_tcpstore_set_", n, "_clients_tcp"),
            *e_ops, p_ops, 1.0, bench::kHigherIsBetter, "ops/s", peer_error,
            absl::StrCat("compared: TCP loopback on both, ", n, " client processes; ours "
                         "acknowledged with ", absl::GetFlag(FLAGS_window),
                         " sets in flight per client, TCPStore's set "
                         "awaits no reply (so any number in flight)")));
      }
    }
  }
  int procs = quick ? 16 : 256;
  if (absl::GetFlag(FLAGS_only) != "ops") {
    bench::Table& bt = report.AddTable(
        absl::StrCat("connect + barrier over TCP loopback: median of ", rounds,
                     " interleaved rounds (ember, tcpstore)"),
        {"who", "processes x connections", "RTT/barrier", "connect s", "barrier s", "total s"});
    bt.AddNote("RTT/barrier: the same barrier on both: add (its answer counts the arrivals) + "
               "wait on a done key that the last arrival sets first (ember Client::Barrier; "
               "tcpstore_peer.py with TCPStore's add and wait; TCPStore's set awaits no reply)");
    std::vector<double> ec, eb, pc, pbar;
    std::string peer_error;
    for (int r = 0; r < rounds; ++r) {
      auto e = RunEmberBarrier(addr, procs, 1, tmpdir);
      if (!e.ok()) return report.Fail(e.status());
      ec.push_back(e->connect_s);
      eb.push_back(e->barrier_s);
      auto pj = RunPeer(absl::StrCat("barrier --clients ", procs), tmpdir);
      if (pj.ok() && Num(*pj, "connect_s") > 0) {
        pc.push_back(Num(*pj, "connect_s"));
        pbar.push_back(Num(*pj, "barrier_s"));
      } else {
        peer_error = pj.ok() ? "peer printed no connect_s" : std::string(pj.status().message());
        std::fprintf(stderr, "store_bench: %s\n", peer_error.c_str());
      }
    }
    const double e_total = bench::Median(ec) + bench::Median(eb);
    bt.AddRow({"ember", absl::StrCat(procs, " x 1"), "2 (+1 last)", bench::Median(ec),
               bench::Median(eb), e_total});
    std::optional<double> p_total;
    if (!pc.empty()) p_total = bench::Median(pc) + bench::Median(pbar);
    bt.AddRow({"tcpstore", absl::StrCat(procs, " x 1"), "2 (+ unacked set, last)",
               pc.empty() ? bench::Cell() : bench::Cell(bench::Median(pc)),
               pbar.empty() ? bench::Cell() : bench::Cell(bench::Median(pbar)), p_total});
    report.AddTarget(bench::Target::VsPeer(
        absl::StrCat("connect_plus_barrier_", procs, "_processes_tcp"), e_total, p_total, 0.5,
        bench::kLowerIsBetter, "s", peer_error,
        absl::StrCat("compared: TCP loopback on both; ", procs, " client processes with one "
                     "connection each on both; the same barrier on both: add + wait (2 round "
                     "trips; the last arrival sets the done key first)")));
    if (!quick) {
      auto e1k = RunEmberBarrier(addr, 64, 16, tmpdir);
      if (!e1k.ok()) return report.Fail(e1k.status());
      bt.AddRow({"ember", "64 x 16 (1024 ranks)", "2 (+1 last)", e1k->connect_s, e1k->barrier_s,
                 e1k->total()});
      report.AddTarget(bench::Target::Absolute("connect_plus_barrier_1024_simulated_ranks_tcp",
                                               e1k->total(), 1.0, bench::kLowerIsBetter, "s",
                                               "informational: no peer, goal of 1 s set by "
                                               "us; one run, TCP loopback"));
    }
  }
  rmdir(tmpdir.c_str());
  return report.Finish();
}

}  // namespace
}  // namespace ember::store

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "store_bench");
  signal(SIGPIPE, SIG_IGN);
  if (int rc = ember::store::bench_util::RunChildRole(); rc >= 0) return rc;
  return ember::store::Parent(argc, argv);
}
