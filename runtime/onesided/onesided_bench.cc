// onesided_bench: put and get bandwidth of onesided::Agent between two processes on this host, 4 KiB
// to 64 MiB, against UCX's own ucx_perftest (ucp_put_bw, ucp_get) run as a server/client pair with
// the same UCX_TLS, in interleaved rounds (median per point); a single-thread memcpy as the
// reference row; and 8-byte notification latency against ucx_perftest's ucp_am_lat.
//
//   onesided_bench [--json] [--quick] [--tls=,tcp] [--max_bytes=N] [--rounds=R] [--no_peer]
//
// Ours: this process (rank 0) starts an in-process store server and re-executes itself as rank 1
// (--role=target), which registers a buffer and serves. A bandwidth sample posts `iters` transfers
// of one size back to back and waits for all (puts end with a Notify, whose flush makes them
// remotely complete, as ucx_perftest's flush does). Latency: half the round trip of a Notify answered
// by a Notify. ucx_perftest reports MB/s with MB = 2^20 bytes: MiB/s here too.
//
// Threads per side (like for like): ucx_perftest runs one thread per process (-T 1). Our agent
// copies a transfer of at least --parallel_copy_min_bytes to mapped peer memory with two threads
// (the caller and a helper). So where that applies (a transport without tcp in UCX_TLS) rank 0
// also runs a second agent ("rank0_1t", parallel_copy_min_bytes = 0: UCX's own copy, one thread)
// against the same target, and the bandwidth targets compare that one-thread figure with
// ucx_perftest's; the two-thread figures appear in the table only. Over TCP our copies are one
// thread anyway.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/report.h"
#include "runtime/base/flags.h"
#include "runtime/base/status_macros.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/store_rendezvous.h"
#include "runtime/onesided/agent.h"
#include "runtime/onesided/bench_vs_comm.h"
#include "runtime/store/client.h"
#include "runtime/store/server.h"

ABSL_FLAG(std::string, tls, ",tcp",
          "comma-separated UCX_TLS settings, each measured for ours and ucx_perftest alike (an "
          "empty item: UCX's own choice)");
ABSL_FLAG(int64_t, min_bytes, 4096, "smallest transfer");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "largest transfer (--quick: 1 MiB)");
ABSL_FLAG(int, rounds, 3, "interleaved rounds per point (median reported); --quick: 1");
ABSL_FLAG(int64_t, bytes_per_sample, 256 << 20,
          "bytes moved per sample, within 8-256 transfers (--quick: 8 MiB); a non-empty --tls item "
          "moves 1/8 of it, within 4-256 transfers");
ABSL_FLAG(int64_t, forced_tls_max_bytes, 16 << 20,
          "largest transfer for a non-empty --tls item (ucx_perftest's TCP put runs at tens of MiB/s)");
ABSL_FLAG(int, lat_iters, 2000,
          "round trips per latency sample x 1/10 (ours and ucp_am_lat: 10x this; the comm "
          "comparison: this; --quick: 200)");
ABSL_FLAG(bool, no_peer, false, "skip ucx_perftest");
ABSL_FLAG(int, settle_ms, 300,
          "pause after each ucx_perftest run (its exit, freeing its shared memory, slowed the next "
          "sample)");
ABSL_FLAG(bool, detect_peer_failure, false,
          "AgentOptions.detect_peer_failure (false, like ucx_perftest: every transport usable)");
ABSL_FLAG(bool, ucx_memory, true,
          "buffers from Agent::AllocateMemory (shared-memory mappable, like ucx_perftest's); "
          "false: RegisterMemory of ordinary heap memory");
ABSL_FLAG(bool, vs_comm, true,
          "also compare with the comm layer's send/recv (cpu backend) over the same transport "
          "(bench_vs_comm.h): TCP for a --tls item naming tcp, shared memory otherwise");
ABSL_FLAG(int64_t, parallel_copy_min_bytes, 4 << 20,
          "AgentOptions.parallel_copy_min_bytes (0: every copy on one core, by UCX)");
ABSL_FLAG(bool, put_over_am, true,
          "AgentOptions.put_over_am (puts and gets as the agent's own messages where UCX has no RMA lane)");
ABSL_FLAG(bool, gets, true, "measure gets too (false: puts only, e.g. to profile the put path)");
ABSL_FLAG(bool, puts, true, "measure puts too (false: gets only, e.g. to profile the get path)");
ABSL_FLAG(std::string, perftest, "/usr/bin/ucx_perftest", "ucx_perftest binary");
ABSL_FLAG(std::string, role, "", "internal: target");
ABSL_FLAG(bool, one_thread_agent, false, "internal: the target also serves rank0_1t");
ABSL_FLAG(std::string, store, "", "internal");
ABSL_FLAG(std::string, prefix, "bench/", "internal");

namespace ember::onesided {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

// The comm group of the two processes (bench_vs_comm.h): shared memory off when UCX is forced to
// TCP, so both layers move bytes over the same transport.
absl::StatusOr<std::unique_ptr<comm::ProcessGroup>> CommGroup(const store::Client& s, int rank) {
  const std::string tls = absl::GetFlag(FLAGS_tls);
  return comm::ProcessGroup::Create(
      comm::MakeStoreRendezvous(s), rank, 2,
      {.name = "bench", .enable_shm = tls.find("tcp") == std::string::npos});
}

// A registered buffer of `bytes`: UCX-allocated (--ucx_memory) or in `heap`.
absl::StatusOr<Registration> Buffer(Agent* agent, int64_t bytes, std::vector<char>* heap) {
  if (absl::GetFlag(FLAGS_ucx_memory)) {
    ASSIGN_OR_RETURN(Registration r, agent->AllocateMemory(bytes));
    memset(r.base, 1, bytes);
    return r;
  }
  heap->assign(bytes, 1);
  return agent->RegisterMemory(heap->data(), heap->size());
}

// --- rank 1: registers a buffer, answers pings, exits on "done" --------------------------------
int RunTarget() {
  auto c = store::Client::Connect({.address = absl::GetFlag(FLAGS_store)});
  if (!c.ok()) return 1;
  store::Client s = c->WithPrefix(absl::GetFlag(FLAGS_prefix));
  auto agent = Agent::Create({.store = &s, .rank = 1,
                              .detect_peer_failure = absl::GetFlag(FLAGS_detect_peer_failure),
                              .parallel_copy_min_bytes = static_cast<uint64_t>(
                                  absl::GetFlag(FLAGS_parallel_copy_min_bytes))});
  if (!agent.ok()) {
    fprintf(stderr, "target: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  std::vector<char> heap;
  auto reg = Buffer(agent->get(), absl::GetFlag(FLAGS_max_bytes), &heap);
  auto conn = (*agent)->Connect("rank0");
  if (!reg.ok() || !conn.ok() || !s.Set("desc/1", reg->descriptor).ok()) return 1;
  // Rank 0's one-thread agent (threads like ucx_perftest's): it only puts, gets and flushes.
  if (absl::GetFlag(FLAGS_one_thread_agent) && !(*agent)->Connect("rank0_1t").ok()) return 1;
  std::unique_ptr<comm::ProcessGroup> pg;
  if (absl::GetFlag(FLAGS_vs_comm)) {
    auto g = CommGroup(s, 1);
    if (!g.ok()) {
      fprintf(stderr, "target: %s\n", g.status().ToString().c_str());
      return 1;
    }
    pg = std::move(*g);
  }
  const bench_comm::Side side{agent->get(), *conn, {}, *reg, pg.get()};
  while (true) {
    auto n = (*agent)->WaitNotification(absl::Seconds(300));
    if (!n.ok() || n->message == "done") return n.ok() ? 0 : 1;
    if (n->message[0] == 'c') {
      if (absl::Status st = bench_comm::Serve(side, n->message); !st.ok()) {
        fprintf(stderr, "target: %s\n", st.ToString().c_str());
        return 1;
      }
      continue;
    }
    if (n->message[0] == 'p' && !(*agent)->Notify(*conn, n->message).Wait(kTimeout).ok()) return 1;
  }
}

// --- ucx_perftest --------------------------------------------------------------------------------
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// Starts `args` with UCX_TLS set as asked; the child's stdout goes to `out_fd` (-1: /dev/null).
pid_t Spawn(const std::vector<std::string>& args, int out_fd) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  const std::string tls = absl::GetFlag(FLAGS_tls);
  if (!tls.empty()) setenv("UCX_TLS", tls.c_str(), 1);
  // Like for like: the Agent raises UCX's TCP segments to 1 MiB unless the user set them
  // (agent.h); ucx_perftest gets the same settings (no effect on transports other than tcp).
  if (getenv("UCX_TCP_TX_SEG_SIZE") == nullptr && getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) {
    const std::string bytes = absl::StrCat(kTcpSegmentBytes);
    setenv("UCX_TCP_TX_SEG_SIZE", bytes.c_str(), 1);
    setenv("UCX_TCP_RX_SEG_SIZE", bytes.c_str(), 1);
  }
  int null = open("/dev/null", O_WRONLY);
  dup2(out_fd >= 0 ? out_fd : null, 1);
  dup2(null, 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

// Waits for `pid` up to `timeout`, then kills it. True when it exited 0.
bool Reap(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return false;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// One ucx_perftest run; returns the numbers of its "Final:" line: iterations, latency 50%ile,
// average and overall (us), bandwidth average and overall (MiB/s), message rate average and overall.
absl::StatusOr<std::vector<double>> PerftestOnce(const std::string& test, int64_t bytes, int64_t iters,
                                                 absl::Duration listen_wait) {
  const std::string bin = absl::GetFlag(FLAGS_perftest);
  if (access(bin.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(bin, " not found (apt-get install ucx-utils)"));
  }
  const std::string port = absl::StrCat(FreePort());
  const std::vector<std::string> common = {"-t", test, "-s", absl::StrCat(bytes), "-n",
                                           absl::StrCat(iters), "-w", absl::StrCat(iters / 10 + 1),
                                           "-p", port};
  std::vector<std::string> server = {bin};
  server.insert(server.end(), common.begin(), common.end());
  pid_t spid = Spawn(server, -1);
  absl::SleepFor(listen_wait);  // until it listens
  int p[2];
  if (pipe(p) != 0) return absl::InternalError("pipe");
  std::vector<std::string> client = {bin, "127.0.0.1"};
  client.insert(client.end(), common.begin(), common.end());
  pid_t cpid = Spawn(client, p[1]);
  close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t k; (k = read(p[0], buf, sizeof(buf))) > 0;) out.append(buf, k);
  close(p[0]);
  const bool cok = Reap(cpid, absl::Seconds(30));
  Reap(spid, absl::Seconds(5));
  const size_t at = out.find("Final:");
  if (!cok || at == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("ucx_perftest -t ", test, " -s ", bytes,
                                               " failed or printed no Final: line"));
  }
  std::vector<std::string> f = absl::StrSplit(out.substr(at, out.find('\n', at) - at), ' ', absl::SkipEmpty());
  std::vector<double> v(8);
  for (size_t i = 0; i < v.size(); ++i) {
    if (f.size() < 9 || !absl::SimpleAtod(f[i + 1], &v[i])) {
      return absl::InternalError(absl::StrCat("cannot parse ucx_perftest output: ", out.substr(at, 200)));
    }
  }
  return v;
}

absl::StatusOr<std::vector<double>> Perftest(const std::string& test, int64_t bytes, int64_t iters) {
  auto v = PerftestOnce(test, bytes, iters, absl::Milliseconds(150));
  if (v.ok() || v.status().code() == absl::StatusCode::kNotFound) return v;
  return PerftestOnce(test, bytes, iters, absl::Milliseconds(600));  // slow server start
}
constexpr int kPerftestLat50 = 1, kPerftestLatOverall = 3, kPerftestBwOverall = 5;

// --- rank 0 ----------------------------------------------------------------------------------------
struct Ours {
  Agent* agent;
  Connection* conn;
  RemoteRegion remote;
  Registration local;
};

struct Bandwidth {
  double overall = 0;  // MiB/s: bytes of every transfer / the time from the first post to the last completion
  double typical = 0;  // MiB/s: bytes / the median time of one transfer posted and waited alone
};

absl::StatusOr<Bandwidth> OursBandwidth(const Ours& o, bool put, int64_t bytes, int64_t iters) {
  const uint64_t n = static_cast<uint64_t>(bytes);
  auto post = [&] {
    return put ? o.agent->Put(o.conn, {{o.local.id, 0, n}}, {{o.remote, 0, n}})
               : o.agent->Get(o.conn, {{o.local.id, 0, n}}, {{o.remote, 0, n}});
  };
  // Warm-up (untimed, like ucx_perftest's -w): the first access maps and faults in the pages.
  RETURN_IF_ERROR(post().Wait(kTimeout));
  std::vector<Work> works;
  works.reserve(iters + 1);
  const absl::Time t0 = absl::Now();
  for (int64_t i = 0; i < iters; ++i) works.push_back(post());
  if (put) works.push_back(o.agent->Notify(o.conn, "f"));  // flush: the puts are remotely complete
  for (const Work& w : works) RETURN_IF_ERROR(w.Wait(kTimeout));
  Bandwidth out;
  out.overall = static_cast<double>(bytes) * iters / absl::ToDoubleSeconds(absl::Now() - t0) / (1 << 20);
  // One at a time, like one ucx_perftest iteration (local completion), for the median.
  std::vector<double> us;
  for (int64_t i = 0; i < std::min<int64_t>(iters, 32); ++i) {
    const absl::Time t = absl::Now();
    RETURN_IF_ERROR(post().Wait(kTimeout));
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
  }
  if (put) RETURN_IF_ERROR(o.agent->Notify(o.conn, "f").Wait(kTimeout));
  out.typical = static_cast<double>(bytes) / bench::Median(us) / (1 << 20) * 1e6;
  return out;
}

double Memcpy(int64_t bytes, int64_t iters, std::vector<char>& a, std::vector<char>& b) {
  const absl::Time t0 = absl::Now();
  for (int64_t i = 0; i < iters; ++i) {
    memcpy(b.data(), a.data(), bytes);
    a[i % bytes] ^= b[(i * 7) % bytes];  // keep the copies observable
  }
  return static_cast<double>(bytes) * iters / absl::ToDoubleSeconds(absl::Now() - t0) / (1 << 20);
}

std::string SizeName(int64_t b) {
  return b >= (1 << 20) ? absl::StrCat(b >> 20, "MiB") : absl::StrCat(b >> 10, "KiB");
}

struct Settings {
  int64_t max_bytes = 0, per_sample = 0;
  int rounds = 1, lat_iters = 1;
};

// Where our agent would copy with two threads (parallel_copy_min_bytes, mapped peer memory: a
// transport without tcp), the bandwidth targets use a second, one-thread agent.
bool OneThreadAgentApplies(const std::string& tls) {
  return absl::GetFlag(FLAGS_parallel_copy_min_bytes) > 0 && tls.find("tcp") == std::string::npos;
}

// Measures one transport configuration (`tls`, "" = UCX's choice): a fresh target process and
// agent (UCX reads UCX_TLS when it starts), then tables and targets named after the transport.
absl::Status MeasureTransport(bench::Report& report, const std::string& store_addr,
                              const std::string& tls, const Settings& cfg) {
  absl::SetFlag(&FLAGS_tls, tls);  // Spawn() passes it to ucx_perftest
  if (tls.empty()) {
    unsetenv("UCX_TLS");
  } else {
    setenv("UCX_TLS", tls.c_str(), 1);
  }
  const std::string tls_name = tls.empty() ? "UCX default" : tls;
  const std::string suffix = tls.empty() ? "" : absl::StrCat("_", tls);
  const std::string prefix = absl::StrCat("bench/", tls.empty() ? "default" : tls, "/");
  const pid_t target = fork();
  if (target == 0) {
    std::vector<std::string> a = {
        "/proc/self/exe", "--role=target", "--store=" + store_addr, "--prefix=" + prefix,
        absl::StrCat("--max_bytes=", cfg.max_bytes),
        absl::StrCat("--detect_peer_failure=", absl::GetFlag(FLAGS_detect_peer_failure)),
        absl::StrCat("--vs_comm=", absl::GetFlag(FLAGS_vs_comm)), "--tls=" + tls,
        absl::StrCat("--ucx_memory=", absl::GetFlag(FLAGS_ucx_memory)),
        absl::StrCat("--one_thread_agent=", OneThreadAgentApplies(tls))};
    std::vector<char*> av;
    for (auto& x : a) av.push_back(x.data());
    av.push_back(nullptr);
    execv(av[0], av.data());
    _exit(127);
  }
  ASSIGN_OR_RETURN(store::Client client, store::Client::Connect({.address = store_addr}));
  store::Client s = client.WithPrefix(prefix);
  ASSIGN_OR_RETURN(std::unique_ptr<Agent> agent,
                   Agent::Create({.store = &s, .rank = 0,
                                  .detect_peer_failure = absl::GetFlag(FLAGS_detect_peer_failure),
                                  .parallel_copy_min_bytes = static_cast<uint64_t>(
                                      absl::GetFlag(FLAGS_parallel_copy_min_bytes)),
                                  .put_over_am = absl::GetFlag(FLAGS_put_over_am)}));
  std::vector<char> heap, a(cfg.max_bytes, 3), b(cfg.max_bytes, 4);
  ASSIGN_OR_RETURN(Registration reg, Buffer(agent.get(), cfg.max_bytes, &heap));
  ASSIGN_OR_RETURN(Connection* conn, agent->Connect("rank1"));
  ASSIGN_OR_RETURN(std::string desc, s.Get("desc/1", {.wait = true, .timeout = kTimeout}));
  ASSIGN_OR_RETURN(RemoteRegion remote, conn->ImportRegion(desc));
  Ours o{agent.get(), conn, remote, reg};
  // The one-thread agent (see the file comment): UCX copies on one core, as in ucx_perftest.
  std::unique_ptr<Agent> agent1;
  std::vector<char> heap1;
  std::optional<Ours> o1;
  if (OneThreadAgentApplies(tls)) {
    ASSIGN_OR_RETURN(agent1, Agent::Create({.store = &s, .name = "rank0_1t", .rank = 0,
                                            .detect_peer_failure =
                                                absl::GetFlag(FLAGS_detect_peer_failure),
                                            .parallel_copy_min_bytes = 0,
                                            .put_over_am = absl::GetFlag(FLAGS_put_over_am)}));
    ASSIGN_OR_RETURN(Registration reg1, Buffer(agent1.get(), cfg.max_bytes, &heap1));
    ASSIGN_OR_RETURN(Connection* conn1, agent1->Connect("rank1"));
    ASSIGN_OR_RETURN(RemoteRegion remote1, conn1->ImportRegion(desc));
    o1 = Ours{agent1.get(), conn1, remote1, reg1};
  }
  const int64_t two_threads_from = absl::GetFlag(FLAGS_parallel_copy_min_bytes);
  std::unique_ptr<comm::ProcessGroup> pg;
  if (absl::GetFlag(FLAGS_vs_comm)) {
    ASSIGN_OR_RETURN(pg, CommGroup(s, 0));
  }

  const int64_t max_bytes =
      tls.empty() ? cfg.max_bytes : std::min(cfg.max_bytes, absl::GetFlag(FLAGS_forced_tls_max_bytes));
  std::vector<int64_t> sizes;
  for (int64_t sz = absl::GetFlag(FLAGS_min_bytes); sz <= max_bytes; sz *= 4) sizes.push_back(sz);
  const size_t P = sizes.size();
  // samples[kind][size]: kind 0 ours put, 1 perftest put, 2 ours get, 3 perftest get (overall
  // bandwidth), 4 memcpy; kind + 5 for kinds 0-3: the typical bandwidth (median transfer).
  // Kinds 9-12: the one-thread agent's put, get (overall), put, get (typical), measured where the
  // default agent copies with two threads (size >= two_threads_from).
  constexpr int kTypical = 5, kOne = 9;
  std::vector<std::vector<std::vector<double>>> samples(13, std::vector<std::vector<double>>(P));
  auto two_threads = [&](size_t i) { return o1.has_value() && sizes[i] >= two_threads_from; };
  std::string peer_error;
  if (absl::GetFlag(FLAGS_no_peer)) peer_error = "skipped (--no_peer)";
  bench::LoadAverage load0 = bench::ReadLoadAverage();
  for (int r = 0; r < cfg.rounds; ++r) {
    for (size_t i = 0; i < P; ++i) {
      const int64_t iters = tls.empty() ? std::clamp<int64_t>(cfg.per_sample / sizes[i], 8, 256)
                                        : std::clamp<int64_t>(cfg.per_sample / 8 / sizes[i], 4, 256);
      for (int kind = 0; kind < 5; ++kind) {
        if (!absl::GetFlag(FLAGS_gets) && (kind == 2 || kind == 3)) continue;
        if (!absl::GetFlag(FLAGS_puts) && (kind == 0 || kind == 1)) continue;
        absl::StatusOr<double> v;
        if (kind == 0 || kind == 2) {
          ASSIGN_OR_RETURN(Bandwidth bw, OursBandwidth(o, kind == 0, sizes[i], iters));
          v = bw.overall;
          samples[kind + kTypical][i].push_back(bw.typical);
          if (two_threads(i)) {
            ASSIGN_OR_RETURN(Bandwidth b1, OursBandwidth(*o1, kind == 0, sizes[i], iters));
            samples[kOne + kind / 2][i].push_back(b1.overall);
            samples[kOne + 2 + kind / 2][i].push_back(b1.typical);
          }
        } else if (kind == 4) {
          v = Memcpy(sizes[i], iters, a, b);
        } else {
          if (!peer_error.empty()) continue;
          auto pv = Perftest(kind == 1 ? "ucp_put_bw" : "ucp_get", sizes[i], iters);
          absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_settle_ms)));
          if (!pv.ok()) {
            peer_error = std::string(pv.status().message());
            continue;
          }
          v = (*pv)[kPerftestBwOverall];
          // ucp_put_bw puts once more than it counts (its last put marks the end for the target)
          // inside the timed span: count the bytes it really moved, as ours are.
          if (kind == 1) *v *= static_cast<double>(iters + 1) / iters;
          // Its 50%ile is the time of a whole transfer only where a transfer completes while it is
          // posted (shared memory: the copy runs in the call); over TCP it is the time to post.
          if (tls.empty()) {
            samples[kind + kTypical][i].push_back(sizes[i] / (*pv)[kPerftestLat50] / (1 << 20) * 1e6);
          }
        }
        samples[kind][i].push_back(*v);
      }
    }
  }
  bench::LoadAverage load1 = bench::ReadLoadAverage();
  auto med = [&](int kind, size_t i) -> std::optional<double> {
    if (samples[kind][i].empty()) return std::nullopt;
    return bench::Median(samples[kind][i]);
  };
  bench::Table& t = report.AddTable(
      absl::StrCat("bandwidth, 2 processes, UCX_TLS=", tls_name, " (MiB/s, median of ", cfg.rounds, ")"),
      {"bytes", "ember put", "perftest ucp_put_bw", "ember get", "perftest ucp_get", "memcpy 1 thread",
       "ember put typ", "perftest put typ", "ember get typ", "perftest get typ",
       "ember put 2 threads", "ember get 2 threads", "ember put typ 2 threads",
       "ember get typ 2 threads"});
  // Ours with one copying thread (ucx_perftest's count): kinds 0, 2 (overall), 5, 7 (typical);
  // from the one-thread agent where the default one copies with two.
  auto one = [&](int kind, size_t i) {
    if (!two_threads(i)) return med(kind, i);
    return med(kind == 0 ? kOne : kind == 2 ? kOne + 1 : kind == 5 ? kOne + 2 : kOne + 3, i);
  };
  auto two = [&](int kind, size_t i) -> std::optional<double> {
    return two_threads(i) ? med(kind, i) : std::nullopt;
  };
  for (size_t i = 0; i < P; ++i) {
    t.AddRow({sizes[i], bench::Cell(one(0, i)), bench::Cell(med(1, i)), bench::Cell(one(2, i)),
              bench::Cell(med(3, i)), bench::Cell(med(4, i)), bench::Cell(one(5, i)),
              bench::Cell(med(6, i)), bench::Cell(one(7, i)), bench::Cell(med(8, i)),
              bench::Cell(two(0, i)), bench::Cell(two(2, i)), bench::Cell(two(5, i)),
              bench::Cell(two(7, i))});
  }
  t.SetLoad(load0, load1);
  const std::string threads =
      o1.has_value()
          ? absl::StrCat("threads per side: 1 on both (ucx_perftest -T 1; ours: an agent with "
                         "parallel copy off, UCX copying on the calling thread); the default agent "
                         "copies transfers of at least ", two_threads_from, " bytes with 2 threads "
                         "(caller + helper): its figures are the '2 threads' columns, no target")
          : "threads per side: 1 on both (ucx_perftest -T 1; ours: UCX's copy on the calling "
            "thread, parallel copy does not apply here)";
  t.AddNote(threads);
  t.AddNote("overall: ember: back-to-back Put/Get Works of one size, then Wait on all (puts end with "
            "a Notify, whose endpoint flush makes them remotely complete); perftest: its overall "
            "bandwidth (its own window of 32 and flush; ucp_put_bw's figure x (n+1)/n: it moves "
            "n+1 puts in the timed span and counts n). typ (typical): bytes / the median time of one "
            "transfer (ember: up to 32 posted and waited one at a time; perftest: its 50%ile "
            "latency; shown for UCX's own transport choice only: over TCP its per-iteration time is the "
            "time to post), robust to a process descheduled mid-sample on a loaded machine");
  for (size_t i = 0; i < P; ++i) {
    if (sizes[i] < (1 << 20)) continue;
    for (int put = 1; put >= 0; --put) {
      if (!absl::GetFlag(put ? FLAGS_puts : FLAGS_gets)) continue;
      const int ours = put ? 0 : 2, peer = put ? 1 : 3;
      const std::string name = absl::StrCat(put ? "put" : "get", "_bw_", SizeName(sizes[i]), suffix);
      const std::string note = absl::StrCat(
          "compared: UCX_TLS=", tls_name, " on both; 2 processes on one host; 1 thread per side "
          "(ucx_perftest -T 1; ours ",
          two_threads(i) ? "from an agent with parallel copy off" : "copying on the calling thread",
          "); the same transfer size and count (", sizes[i], " bytes) on both; memcpy ",
          static_cast<int64_t>(*med(4, i)), " MiB/s");
      if (tls.empty()) {
        report.AddTarget(bench::Target::VsPeer(
            absl::StrCat(name, "_vs_ucx_perftest"), *one(ours + kTypical, i), med(peer + kTypical, i),
            0.9, bench::kHigherIsBetter, "MiB/s", peer_error,
            absl::StrCat(note, "; typical: bytes / median transfer time")));
      }
      report.AddTarget(bench::Target::VsPeer(
          absl::StrCat(name, "_overall_vs_ucx_perftest"), *one(ours, i), med(peer, i), 0.9,
          bench::kHigherIsBetter, "MiB/s", peer_error,
          absl::StrCat(note, "; overall: total bytes / total time")));
    }
  }
  // Notification latency: medians (typical round trip) compared; means shown and compared too.
  std::vector<double> ours_p50, ours_mean, ours_p99, ours_max, peer_p50, peer_mean;
  std::string lat_error = peer_error;
  for (int r = 0; r < cfg.rounds; ++r) {
    ASSIGN_OR_RETURN(bench_comm::Latency v,
                     bench_comm::PingPong([&] { return bench_comm::NotifyRoundTrip(o.agent, o.conn); },
                                          cfg.lat_iters * 10));  // as many as ucp_am_lat's
    ours_p50.push_back(v.median_us);
    ours_mean.push_back(v.mean_us);
    ours_p99.push_back(v.p99_us);
    ours_max.push_back(v.max_us);
    if (!lat_error.empty()) continue;
    auto p = Perftest("ucp_am_lat", 8, cfg.lat_iters * 10);  // same round trips as ours
    if (p.ok()) {
      peer_p50.push_back((*p)[kPerftestLat50]);
      peer_mean.push_back((*p)[kPerftestLatOverall]);
    } else {
      lat_error = std::string(p.status().message());
    }
  }
  auto med_or_none = [](const std::vector<double>& v) {
    return v.empty() ? std::nullopt : std::optional<double>(bench::Median(v));
  };
  bench::Table& lt = report.AddTable(
      absl::StrCat("8-byte notification latency, UCX_TLS=", tls_name, " (us, one way)"),
      {"ember Notify p50", "perftest ucp_am_lat p50", "ember mean", "perftest overall", "ember p99",
       "ember max"});
  lt.AddRow({bench::Median(ours_p50), bench::Cell(med_or_none(peer_p50)), bench::Median(ours_mean),
             bench::Cell(med_or_none(peer_mean)), bench::Median(ours_p99), bench::Median(ours_max)});
  lt.AddNote("same number of round trips on both sides. ember: half of each round trip of Notify "
             "answered by a Notify, the waiting thread "
             "driving progress (work.h); p50 = median round trip, mean = total time / iterations "
             "(counts every stall of a descheduled process). perftest: busy-polling ping-pong, its "
             "50%ile and overall columns. ember p99 / max: the 99th percentile and slowest round trip / 2 "
             "(medians over rounds)");
  report.AddTarget(bench::Target::VsPeer(absl::StrCat("notify_latency_8B", suffix, "_vs_ucp_am_lat"),
                                         bench::Median(ours_p50), med_or_none(peer_p50), 2.0,
                                         bench::kLowerIsBetter, "us", lat_error,
                                         absl::StrCat("compared: UCX_TLS=", tls_name, " on both; ",
                                                      cfg.lat_iters * 10, " round trips per sample "
                                                      "on both; one waiting thread per side; "
                                                      "medians")));
  report.AddTarget(bench::Target::VsPeer(
      absl::StrCat("notify_latency_8B_mean", suffix, "_vs_ucp_am_lat"), bench::Median(ours_mean),
      med_or_none(peer_mean), 2.0, bench::kLowerIsBetter, "us", lat_error,
      absl::StrCat("compared: UCX_TLS=", tls_name, " on both; ", cfg.lat_iters * 10,
                   " round trips per sample on both; one waiting thread per side; means (total "
                   "time / iterations)")));
  if (pg != nullptr) {
    RETURN_IF_ERROR(bench_comm::Measure(
        report, {agent.get(), conn, remote, reg, pg.get()},
        {.tls_label = tls_name, .suffix = suffix, .sizes = sizes, .rounds = cfg.rounds,
         .bytes_per_sample = tls.empty() ? cfg.per_sample : cfg.per_sample / 8,
         .lat_iters = cfg.lat_iters}));
  }
  agent1.reset();
  agent->Notify(conn, "done").Wait(kTimeout).IgnoreError();
  agent.reset();
  Reap(target, absl::Seconds(10));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  bench::Report report("onesided_bench", argc, argv);
  const bool quick = bench::Quick();
  Settings cfg;
  cfg.max_bytes = quick ? std::min<int64_t>(absl::GetFlag(FLAGS_max_bytes), 1 << 20)
                        : absl::GetFlag(FLAGS_max_bytes);
  cfg.rounds = quick ? 1 : absl::GetFlag(FLAGS_rounds);
  cfg.per_sample = quick ? (8 << 20) : absl::GetFlag(FLAGS_bytes_per_sample);
  cfg.lat_iters = quick ? 200 : absl::GetFlag(FLAGS_lat_iters);
  auto server = store::StoreServer::Start({.address = "127.0.0.1:0"});
  if (!server.ok()) return report.Fail(server.status());
  std::vector<std::string> transports = absl::StrSplit(absl::GetFlag(FLAGS_tls), ',');
  for (const std::string& tls : transports) {
    absl::Status st = MeasureTransport(report, (*server)->address(), tls, cfg);
    if (!st.ok()) return report.Fail(st);
  }
  report.SetMeta("ucx_tls", json::Value::Str(absl::StrJoin(transports, ",")));
  report.SetMeta("detect_peer_failure", json::Value::Bool(absl::GetFlag(FLAGS_detect_peer_failure)));
  report.SetMeta("ucx_memory", json::Value::Bool(absl::GetFlag(FLAGS_ucx_memory)));
  report.SetMeta("put_over_am", json::Value::Bool(absl::GetFlag(FLAGS_put_over_am)));
  report.SetMeta("parallel_copy_min_bytes",
                 json::Value::Int(absl::GetFlag(FLAGS_parallel_copy_min_bytes)));
  return report.Finish();
}

}  // namespace
}  // namespace ember::onesided

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "onesided_bench");
  if (absl::GetFlag(FLAGS_role) == "target") return ember::onesided::RunTarget();
  return ember::onesided::Main(argc, argv);
}
