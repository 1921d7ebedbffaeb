#include "runtime/onesided/bench_vs_comm.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"

namespace ember::onesided::bench_comm {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr int kDataTag = 0, kCtlTag = 1, kPingTag = 2;
using comm::DataType;

absl::Status WaitAll(const std::vector<std::shared_ptr<comm::Work>>& works) {
  for (const auto& w : works) RETURN_IF_ERROR(w->Wait(kTimeout));
  return absl::OkStatus();
}

// Sends a control message to the target and waits for its "k" (its receives are posted).
absl::Status Control(const Side& s, const std::string& msg) {
  RETURN_IF_ERROR(s.agent->Notify(s.conn, msg).Wait(kTimeout));
  ASSIGN_OR_RETURN(Notification n, s.agent->WaitNotification(kTimeout));
  if (n.message != "k") return absl::InternalError(absl::StrCat("target answered '", n.message, "' to ", msg));
  return absl::OkStatus();
}

double MiBps(int64_t bytes, int64_t iters, absl::Time t0) {
  return static_cast<double>(bytes) * iters / absl::ToDoubleSeconds(absl::Now() - t0) / (1 << 20);
}

absl::StatusOr<double> OursPut(const Side& s, int64_t bytes, int64_t iters) {
  const uint64_t n = bytes;
  const absl::Time t0 = absl::Now();
  std::vector<Work> works;
  for (int64_t i = 0; i < iters; ++i) works.push_back(s.agent->Put(s.conn, {{s.local.id, 0, n}}, {{s.remote, 0, n}}));
  works.push_back(s.agent->Notify(s.conn, "p"));  // after the puts; the target answers it
  for (const Work& w : works) RETURN_IF_ERROR(w.Wait(kTimeout));
  RETURN_IF_ERROR(s.agent->WaitNotification(kTimeout).status());
  return MiBps(bytes, iters, t0);
}

absl::StatusOr<double> OursGet(const Side& s, int64_t bytes, int64_t iters) {
  const uint64_t n = bytes;
  const absl::Time t0 = absl::Now();
  std::vector<Work> works;
  for (int64_t i = 0; i < iters; ++i) works.push_back(s.agent->Get(s.conn, {{s.local.id, 0, n}}, {{s.remote, 0, n}}));
  for (const Work& w : works) RETURN_IF_ERROR(w.Wait(kTimeout));
  return MiBps(bytes, iters, t0);
}

absl::StatusOr<double> CommBw(const Side& s, bool put, int64_t bytes, int64_t iters) {
  RETURN_IF_ERROR(Control(s, absl::StrCat(put ? "cP " : "cG ", bytes, " ", iters)));
  char* buf = static_cast<char*>(s.local.base);
  uint64_t word = 0;
  std::vector<std::shared_ptr<comm::Work>> works;
  const absl::Time t0 = absl::Now();
  if (put) {
    for (int64_t i = 0; i < iters; ++i) works.push_back(s.pg->Send(buf, bytes, DataType::kU8, 1, kDataTag));
    works.push_back(s.pg->Recv(&word, 8, DataType::kU8, 1, kCtlTag));
  } else {
    for (int64_t i = 0; i < iters; ++i) works.push_back(s.pg->Recv(buf, bytes, DataType::kU8, 1, kDataTag));
    works.push_back(s.pg->Send(&word, 8, DataType::kU8, 1, kCtlTag));
  }
  RETURN_IF_ERROR(WaitAll(works));
  return MiBps(bytes, iters, t0);
}

absl::Status CommRoundTrip(const Side& s) {
  uint64_t word = 0;
  RETURN_IF_ERROR(s.pg->Send(&word, 8, DataType::kU8, 1, kPingTag)->Wait(kTimeout));
  return s.pg->Recv(&word, 8, DataType::kU8, 1, kPingTag)->Wait(kTimeout);
}

std::string SizeName(int64_t b) {
  return b >= (1 << 20) ? absl::StrCat(b >> 20, "MiB") : absl::StrCat(b >> 10, "KiB");
}

}  // namespace

absl::StatusOr<Latency> PingPong(const std::function<absl::Status()>& round_trip, int iters) {
  std::vector<double> us;
  us.reserve(iters);
  absl::Time t0;
  for (int i = -iters / 10 - 1; i < iters; ++i) {
    const absl::Time t = absl::Now();
    if (i == 0) t0 = t;
    RETURN_IF_ERROR(round_trip());
    if (i >= 0) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t) / 2);
  }
  const double mean = absl::ToDoubleMicroseconds(absl::Now() - t0) / iters / 2;
  const double median = bench::Median(us);
  std::sort(us.begin(), us.end());
  return Latency{median, mean, us[std::min(us.size() - 1, us.size() * 99 / 100)], us.back()};
}

absl::Status NotifyRoundTrip(Agent* agent, Connection* conn) {
  RETURN_IF_ERROR(agent->Notify(conn, "p0000000").Wait(kTimeout));
  return agent->WaitNotification(kTimeout).status();
}

absl::Status Serve(const Side& s, absl::string_view message) {
  std::vector<std::string> f = absl::StrSplit(message, ' ');
  int64_t bytes = 0, iters = 0;
  const bool bw = f[0] == "cP" || f[0] == "cG";
  if ((bw && (f.size() != 3 || !absl::SimpleAtoi(f[1], &bytes) || !absl::SimpleAtoi(f[2], &iters))) ||
      (f[0] == "cL" && (f.size() != 2 || !absl::SimpleAtoi(f[1], &iters))) || (!bw && f[0] != "cL") ||
      bytes > static_cast<int64_t>(s.local.bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("bad control message '", message, "'"));
  }
  char* buf = static_cast<char*>(s.local.base);
  uint64_t word = 0;
  std::vector<std::shared_ptr<comm::Work>> works;
  if (f[0] == "cP") {
    for (int64_t i = 0; i < iters; ++i) works.push_back(s.pg->Recv(buf, bytes, DataType::kU8, 0, kDataTag));
  }
  RETURN_IF_ERROR(s.agent->Notify(s.conn, "k").Wait(kTimeout));
  if (f[0] == "cP") {
    RETURN_IF_ERROR(WaitAll(works));
    return s.pg->Send(&word, 8, DataType::kU8, 0, kCtlTag)->Wait(kTimeout);
  }
  if (f[0] == "cG") {
    RETURN_IF_ERROR(s.pg->Recv(&word, 8, DataType::kU8, 0, kCtlTag)->Wait(kTimeout));
    for (int64_t i = 0; i < iters; ++i) works.push_back(s.pg->Send(buf, bytes, DataType::kU8, 0, kDataTag));
    return WaitAll(works);
  }
  for (int64_t i = 0; i < iters; ++i) {
    RETURN_IF_ERROR(s.pg->Recv(&word, 8, DataType::kU8, 0, kPingTag)->Wait(kTimeout));
    RETURN_IF_ERROR(s.pg->Send(&word, 8, DataType::kU8, 0, kPingTag)->Wait(kTimeout));
  }
  return absl::OkStatus();
}

absl::Status Measure(bench::Report& report, const Side& s, const Config& cfg) {
  const size_t P = cfg.sizes.size();
  // samples[kind][size]: 0 ours put, 1 comm send (put direction), 2 ours get, 3 comm (get direction)
  std::vector<std::vector<std::vector<double>>> samples(4, std::vector<std::vector<double>>(P));
  std::vector<double> ours_lat, comm_lat, ours_mean, comm_mean;
  const bench::LoadAverage load0 = bench::ReadLoadAverage();
  for (int r = 0; r < cfg.rounds; ++r) {
    for (size_t i = 0; i < P; ++i) {
      const int64_t iters = std::clamp<int64_t>(cfg.bytes_per_sample / cfg.sizes[i], 2, 256);
      if (r == 0) {  // warm-up of every path at this size (untimed)
        RETURN_IF_ERROR(OursPut(s, cfg.sizes[i], 1).status());
        RETURN_IF_ERROR(CommBw(s, true, cfg.sizes[i], 1).status());
      }
      for (int kind = 0; kind < 4; ++kind) {
        absl::StatusOr<double> v = kind == 0   ? OursPut(s, cfg.sizes[i], iters)
                                   : kind == 2 ? OursGet(s, cfg.sizes[i], iters)
                                               : CommBw(s, kind == 1, cfg.sizes[i], iters);
        if (!v.ok()) return v.status();
        samples[kind][i].push_back(*v);
      }
    }
    ASSIGN_OR_RETURN(Latency ol, PingPong([&] { return NotifyRoundTrip(s.agent, s.conn); }, cfg.lat_iters));
    RETURN_IF_ERROR(Control(s, absl::StrCat("cL ", cfg.lat_iters + cfg.lat_iters / 10 + 1)));
    ASSIGN_OR_RETURN(Latency cl, PingPong([&] { return CommRoundTrip(s); }, cfg.lat_iters));
    ours_lat.push_back(ol.median_us);
    comm_lat.push_back(cl.median_us);
    ours_mean.push_back(ol.mean_us);
    comm_mean.push_back(cl.mean_us);
  }
  const bench::LoadAverage load1 = bench::ReadLoadAverage();
  const std::string comm_desc = s.pg->Describe();
  bench::Table& t = report.AddTable(
      absl::StrCat("onesided vs comm send/recv, 2 processes, UCX_TLS=", cfg.tls_label, ", comm ",
                   comm_desc, " (MiB/s, median of ", cfg.rounds, ")"),
      {"bytes", "ember put+notify", "comm send+ack", "ember get", "comm req+send"});
  for (size_t i = 0; i < P; ++i) {
    t.AddRow({cfg.sizes[i], bench::Median(samples[0][i]), bench::Median(samples[1][i]),
              bench::Median(samples[2][i]), bench::Median(samples[3][i])});
  }
  t.SetLoad(load0, load1);
  t.AddNote("put: n transfers to the target and an 8-byte reply once it has them (ember: Puts + "
            "Notify, answered by a Notify; comm: Sends to posted Recvs, answered by an 8-byte Send). "
            "get: an 8-byte request and n transfers back (ember: Gets; comm: Send, then the target's "
            "Sends). Same buffers, same process pair, interleaved rounds.");
  for (size_t i = 0; i < P; ++i) {
    if (cfg.sizes[i] < (1 << 20)) continue;
    for (int put = 1; put >= 0; --put) {
      report.AddTarget(bench::Target::VsPeer(
          absl::StrCat(put ? "put" : "get", "_bw_", SizeName(cfg.sizes[i]), cfg.suffix, "_vs_comm_send_recv"),
          bench::Median(samples[put ? 0 : 2][i]), bench::Median(samples[put ? 1 : 3][i]), 0.9,
          bench::kHigherIsBetter, "MiB/s", "",
          absl::StrCat("informational: the peer is our own comm layer, not an outside "
                       "implementation, and the goal was set by us; compared: UCX_TLS=",
                       cfg.tls_label, " vs comm ", comm_desc, ", the same process pair and buffers",
                       put ? "; put+notify+reply vs send+8-byte reply" : "; gets vs request+sends")));
    }
  }
  bench::Table& lt = report.AddTable(
      absl::StrCat("8-byte ping-pong, UCX_TLS=", cfg.tls_label, " vs comm ", comm_desc, " (us, one way)"),
      {"ember Notify p50", "comm Send/Recv p50", "ember mean", "comm mean"});
  lt.AddRow({bench::Median(ours_lat), bench::Median(comm_lat), bench::Median(ours_mean),
             bench::Median(comm_mean)});
  lt.AddNote("p50: the median round trip / 2; mean: total time / iterations / 2 (includes every "
             "stall of a descheduled process). Target on p50.");
  lt.SetLoad(load0, load1);
  report.AddTarget(bench::Target::VsPeer(
      absl::StrCat("notify_latency_8B", cfg.suffix, "_vs_comm_send_recv"), bench::Median(ours_lat),
      bench::Median(comm_lat), 2.0, bench::kLowerIsBetter, "us", "",
      absl::StrCat("informational: the peer is our own comm layer, not an outside "
                   "implementation, and the goal was set by us; compared: UCX_TLS=", cfg.tls_label,
                   " vs comm ", comm_desc, "; Notify/WaitNotification vs Send/Recv ping-pong")));
  return absl::OkStatus();
}

}  // namespace ember::onesided::bench_comm
