// One rank of the multi-process comm tests (launched by comm_multiprocess_test). Exit code 0 =
// every check passed; messages go to stderr prefixed with the rank.
//
//   comm_worker --scenario=correctness --rank=0 --size=4 --rdzv_dir=/tmp/x [--dump_dir=...]
//   comm_worker --scenario=store_ops --rank=0 --size=4 --store=127.0.0.1:PORT \
//               --store_prefix=jobs/test/attempt/0/      (rendezvous through the real store)
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/store_rendezvous.h"
#include "tests/comm/worker_rendezvous.h"
#include "runtime/store/client.h"
#include "runtime/flight/recorder.h"
#include "runtime/job/keys.h"

ABSL_FLAG(std::string, scenario, "correctness",
          "correctness|numerics|big|subgroups|p2p|mismatch|kill|hang|store_ops");
ABSL_FLAG(bool, expect_direct, false,
          "numerics: the group must use the direct shm path (else: the channel/ring path)");
ABSL_FLAG(int, rank, 0, "");
ABSL_FLAG(int, size, 2, "");
ABSL_FLAG(std::string, rdzv_dir, "", "file rendezvous directory");
ABSL_FLAG(std::string, dump_dir, "", "flight recorder dump directory");
ABSL_FLAG(std::string, store, "", "store address host:port; if set, rendezvous through the store");
ABSL_FLAG(std::string, store_prefix, ember::job::keys::AttemptPrefix("test", 0),
          "job/attempt key prefix in the store");

namespace ember::comm {
namespace {

int g_rank = 0, g_size = 1, g_failures = 0;

#define CHECK_OR_FAIL(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "[rank %d] CHECK failed %s:%d: %s %s\n", g_rank, __FILE__,    \
                   __LINE__, #cond, absl::StrCat(__VA_ARGS__).c_str());                  \
      if (++g_failures > 20) std::exit(3);                                               \
    }                                                                                    \
  } while (0)

// Exact small values so every reduction (even bf16 products) is exact and bitwise comparable.
double Value(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 3) % 5) - 2.0; }

void Fill(std::vector<char>* buf, DataType t, int rank, size_t count, size_t offset = 0) {
  buf->resize(count * DTypeSize(t));
  for (size_t i = 0; i < count; ++i) {
    double v = Value(rank, i + offset);
    char* p = buf->data() + i * DTypeSize(t);
    switch (t) {
      case DataType::kF32: { float f = v; std::memcpy(p, &f, 4); break; }
      case DataType::kF64: std::memcpy(p, &v, 8); break;
      case DataType::kBF16: { uint16_t h = base::F32ToBf16(v); std::memcpy(p, &h, 2); break; }
      case DataType::kF16: { uint16_t h = base::F32ToF16(v); std::memcpy(p, &h, 2); break; }
      case DataType::kI32: { int32_t x = v; std::memcpy(p, &x, 4); break; }
      case DataType::kI64: { int64_t x = v; std::memcpy(p, &x, 8); break; }
      case DataType::kU8: { uint8_t x = static_cast<uint8_t>(v + 2); std::memcpy(p, &x, 1); break; }
      default: break;  // not a reducible type: the caller only passes kAllDataTypes
    }
  }
}

// Serial reference: rank 0's data op rank 1's ... in order, then the avg division.
std::vector<char> Reference(DataType t, ReduceOp op, size_t count, size_t offset = 0) {
  std::vector<char> acc, tmp;
  Fill(&acc, t, 0, count, offset);
  for (int r = 1; r < g_size; ++r) {
    Fill(&tmp, t, r, count, offset);
    Reduce(acc.data(), tmp.data(), count, t, op);
  }
  if (op == ReduceOp::kAvg) FinishAvg(acc.data(), count, t, g_size);
  return acc;
}

std::string Name(const char* op, DataType t, size_t n, const char* rop = "") {
  return absl::StrCat(op, " ", DTypeName(t), " ", rop, " n=", n);
}

absl::Status Correctness(ProcessGroup& pg) {
  const size_t counts[] = {0, 1, 3, 1000, 16411, 262147};
  for (DataType t : kAllDataTypes) {
    size_t es = DTypeSize(t);
    for (size_t n : counts) {
      for (ReduceOp op : kAllReduceOps) {
        std::vector<char> buf;
        Fill(&buf, t, g_rank, n);
        absl::Status st = pg.AllReduce(buf.data(), n, t, op)->Wait(absl::Seconds(60));
        if (!st.ok()) return st;
        CHECK_OR_FAIL(buf == Reference(t, op, n), Name("all_reduce", t, n, ReduceOpName(op)));
        // reduce_scatter: block b of rank r's input is Value(r, b*n + i).
        std::vector<char> in, out(n * es);
        Fill(&in, t, g_rank, n * g_size);
        st = pg.ReduceScatterSingle(in.data(), out.data(), n, t, op)->Wait(absl::Seconds(60));
        if (!st.ok()) return st;
        CHECK_OR_FAIL(out == Reference(t, op, n, g_rank * n), Name("reduce_scatter", t, n, ReduceOpName(op)));
      }
      // all_gather
      std::vector<char> in, out(n * es * g_size), want;
      Fill(&in, t, g_rank, n);
      absl::Status st = pg.AllGatherSingle(in.data(), out.data(), n, t)->Wait(absl::Seconds(60));
      if (!st.ok()) return st;
      for (int r = 0; r < g_size; ++r) {
        Fill(&want, t, r, n);
        CHECK_OR_FAIL(std::memcmp(out.data() + r * n * es, want.data(), n * es) == 0,
                      Name("all_gather", t, n), " block ", r);
      }
      // broadcast from every root
      for (int root = 0; root < g_size; ++root) {
        std::vector<char> b;
        Fill(&b, t, g_rank == root ? 100 + root : g_rank, n);
        st = pg.Broadcast(b.data(), n, t, root)->Wait(absl::Seconds(60));
        if (!st.ok()) return st;
        Fill(&want, t, 100 + root, n);
        CHECK_OR_FAIL(b == want, Name("broadcast", t, n), " root ", root);
      }
      // all_to_all: rank r's block j = Value(r, j*n + i); out block j must be rank j's block r.
      std::vector<char> a_in, a_out(n * es * g_size);
      Fill(&a_in, t, g_rank, n * g_size);
      st = pg.AllToAllSingle(a_in.data(), a_out.data(), n, t)->Wait(absl::Seconds(60));
      if (!st.ok()) return st;
      for (int j = 0; j < g_size; ++j) {
        Fill(&want, t, j, n, g_rank * n);
        CHECK_OR_FAIL(std::memcmp(a_out.data() + j * n * es, want.data(), n * es) == 0,
                      Name("all_to_all", t, n), " block ", j);
      }
    }
  }
  return pg.Barrier()->Wait(absl::Seconds(60));
}

// A 16-bit float with a random sign, exponent in [-3, 2] and random significand: sums of up to 4
// of them need up to ~17 significant bits (so a 16-bit result must round) but are exact in f32.
uint16_t Random16(DataType t, int rank, size_t i) {
  uint64_t z = (static_cast<uint64_t>(rank) << 40) + i + 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const uint32_t sign = (z >> 63) & 1, e = (z >> 32) % 6;  // exponent -3 .. 2
  if (t == DataType::kBF16) return static_cast<uint16_t>(sign << 15 | (124 + e) << 7 | (z & 0x7f));
  return static_cast<uint16_t>(sign << 15 | (12 + e) << 10 | (z & 0x3ff));
}

double Decode16(DataType t, uint16_t h) { return t == DataType::kBF16 ? base::Bf16ToF32(h) : base::F16ToF32(h); }
uint16_t Round16(DataType t, float f) { return t == DataType::kBF16 ? base::F32ToBf16(f) : base::F32ToF16(f); }

// bf16/f16 sum and average against a float64 reference (docs/comm.md, "Precision"):
// - direct shm path: one rounding. The f32 sum of these inputs is exact, so the sum must equal
//   RNE16(exact sum) bit for bit; the average is within half an ulp plus the f32 division error.
// - ring/tree (channel) path: every 2-input hop rounds to 16 bits, so the error is bounded by
//   gamma_(N-1) * sum|x_i| with gamma_k = k*u' / (1 - k*u'), u' = u16 + 2^-23.
absl::Status Numerics(ProcessGroup& pg) {
  const bool direct = pg.Describe().find(", direct") != std::string::npos;
  CHECK_OR_FAIL(direct == absl::GetFlag(FLAGS_expect_direct), "path: ", pg.Describe());
  const int n = g_size;
  for (DataType t : {DataType::kBF16, DataType::kF16}) {
    const double u = t == DataType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const int mant_bits = t == DataType::kBF16 ? 7 : 10;
    const double up = u + std::ldexp(1.0, -23);
    const double gamma = (n - 1) * up / (1 - (n - 1) * up);
    for (size_t count : {size_t{1000}, size_t{40000}, size_t{262147}}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        if (op == ReduceOp::kAvg && !direct) continue;  // the ring bound is stated for sums
        for (bool scatter : {false, true}) {
          // all_reduce: element i of rank r is Random16(r, i); reduce_scatter: block b of rank r
          // holds Random16(r, b * count + i), and this rank gets block g_rank.
          std::vector<uint16_t> in(scatter ? count * n : count), out(count);
          for (size_t i = 0; i < in.size(); ++i) in[i] = Random16(t, g_rank, i);
          absl::Status st;
          if (scatter) {
            st = pg.ReduceScatterSingle(in.data(), out.data(), count, t, op)->Wait(absl::Seconds(60));
          } else {
            out = in;
            st = pg.AllReduce(out.data(), count, t, op)->Wait(absl::Seconds(60));
          }
          if (!st.ok()) return st;
          const size_t base = scatter ? g_rank * count : 0;
          size_t bad = 0, rounded = 0;
          double max_err_ulps = 0, max_err_u = 0;  // in ulps of the result; in u * sum|x_i|
          for (size_t i = 0; i < count; ++i) {
            double sum = 0, abs_sum = 0;
            for (int r = 0; r < n; ++r) {
              double x = Decode16(t, Random16(t, r, base + i));
              sum += x;
              abs_sum += std::fabs(x);
            }
            const double exact = op == ReduceOp::kAvg ? sum / n : sum;
            const double got = Decode16(t, out[i]);
            const double err = std::fabs(got - exact);
            // Spacing of 16-bit values at `exact` (f16 subnormals below 2^-14: fixed 2^-24).
            const double ulp = exact == 0 ? 0
                               : std::max(std::ldexp(1.0, std::ilogb(exact) - mant_bits),
                                          t == DataType::kF16 ? std::ldexp(1.0, -24) : 0.0);
            if (ulp > 0) max_err_ulps = std::max(max_err_ulps, err / ulp);
            max_err_u = std::max(max_err_u, err / (u * abs_sum));
            rounded += Decode16(t, Round16(t, static_cast<float>(exact))) != exact;
            bool ok;
            if (direct && op == ReduceOp::kSum) {
              ok = out[i] == Round16(t, static_cast<float>(exact));
            } else if (direct) {
              ok = err <= 0.5 * ulp + std::ldexp(std::fabs(exact), -23);
            } else {
              ok = err <= gamma * (abs_sum / (op == ReduceOp::kAvg ? n : 1));
            }
            if (!ok && ++bad <= 3) {
              CHECK_OR_FAIL(false, scatter ? "reduce_scatter " : "all_reduce ", DTypeName(t), " ",
                            ReduceOpName(op), " n=", count, " element ", i, ": got ", got,
                            " exact ", exact, direct ? " (want one rounding)" : " (ring bound)");
            }
          }
          if (g_rank == 0) {
            std::fprintf(stderr, "[rank 0] %s %s %s count %zu: max error %.3f ulp = %.3f u*sum|x| "
                         "(bound %.3f), %zu/%zu inexact sums\n",
                         scatter ? "reduce_scatter" : "all_reduce", DTypeName(t),
                         ReduceOpName(op), count, max_err_ulps, max_err_u,
                         direct ? 1.0 : gamma / u, rounded, count);
          }
          // Inputs where rounding matters: most sums are not representable in 16 bits.
          CHECK_OR_FAIL(rounded > count / 4, "too few inexact sums: ", rounded);
        }
      }
    }
  }
  return pg.Barrier()->Wait(absl::Seconds(60));
}

absl::Status Big(ProcessGroup& pg) {
  // 64 MiB all_reduce (ring, streamed) and broadcast (pipelined chain); async ops in flight together.
  const size_t n = (64 << 20) / 4 + 3;
  std::vector<char> a, b;
  Fill(&a, DataType::kF32, g_rank, n);
  Fill(&b, DataType::kF32, g_rank == 1 ? 50 : g_rank, n);
  auto w1 = pg.AllReduce(a.data(), n, DataType::kF32, ReduceOp::kSum);
  auto w2 = pg.Broadcast(b.data(), n, DataType::kF32, 1);
  if (absl::Status s = w1->Wait(absl::Seconds(120)); !s.ok()) return s;
  if (absl::Status s = w2->Wait(absl::Seconds(120)); !s.ok()) return s;
  CHECK_OR_FAIL(a == Reference(DataType::kF32, ReduceOp::kSum, n), "64 MiB all_reduce");
  std::vector<char> want;
  Fill(&want, DataType::kF32, 50, n);
  CHECK_OR_FAIL(b == want, "64 MiB broadcast");
  return absl::OkStatus();
}

absl::Status Subgroups(ProcessGroup& pg) {
  std::vector<int> evens;
  for (int r = 0; r < g_size; r += 2) evens.push_back(r);
  auto sub = pg.NewGroup(evens);
  if (!sub.ok()) return sub.status();
  if (g_rank % 2 == 0) {
    CHECK_OR_FAIL(*sub != nullptr, "member got no group");
    int32_t v = g_rank;
    absl::Status s = (*sub)->AllReduce(&v, 1, DataType::kI32, ReduceOp::kSum)->Wait(absl::Seconds(30));
    if (!s.ok()) return s;
    int32_t want = 0;
    for (int r : evens) want += r;
    CHECK_OR_FAIL(v == want, "new_group sum ", v, " want ", want);
  } else {
    CHECK_OR_FAIL(*sub == nullptr, "non-member got a group");
  }
  // split by parity, ordered by descending rank (key = -rank).
  auto half = pg.Split(g_rank % 2, -g_rank);
  if (!half.ok()) return half.status();
  ProcessGroup& h = **half;
  int members = (g_size - g_rank % 2 + 1) / 2;
  CHECK_OR_FAIL(h.size() == members, "split size ", h.size());
  int32_t mine = g_rank, gathered[8] = {};
  absl::Status s = h.AllGatherSingle(&mine, gathered, 1, DataType::kI32)->Wait(absl::Seconds(30));
  if (!s.ok()) return s;
  for (int i = 0; i + 1 < h.size(); ++i) CHECK_OR_FAIL(gathered[i] > gathered[i + 1], "split order");
  // The parent still works after children exist.
  return pg.Barrier()->Wait(absl::Seconds(30));
}

absl::Status P2P(ProcessGroup& pg) {
  int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  // Three messages to next: tag 1 (a), tag 2 (b), tag 1 (c). The receiver posts tag 2 first.
  std::vector<int64_t> a(100, g_rank * 10 + 1), b(7, g_rank * 10 + 2), c(100, g_rank * 10 + 3);
  auto s1 = pg.Send(a.data(), a.size(), DataType::kI64, next, 1);
  auto s2 = pg.Send(b.data(), b.size(), DataType::kI64, next, 2);
  auto s3 = pg.Send(c.data(), c.size(), DataType::kI64, next, 1);
  std::vector<int64_t> rb(7), ra(100), rc(100);
  auto r2 = pg.Recv(rb.data(), rb.size(), DataType::kI64, prev, 2);
  auto r1 = pg.Recv(ra.data(), ra.size(), DataType::kI64, prev, 1);
  auto r3 = pg.Recv(rc.data(), rc.size(), DataType::kI64, prev, 1);
  for (auto& w : {s1, s2, s3, r1, r2, r3})
    if (absl::Status s = w->Wait(absl::Seconds(30)); !s.ok()) return s;
  CHECK_OR_FAIL(rb[0] == prev * 10 + 2 && ra[99] == prev * 10 + 1 && rc[0] == prev * 10 + 3,
                "tag order: ", rb[0], " ", ra[99], " ", rc[0]);
  // Large messages both ways at once (no deadlock), overlapping a collective.
  std::vector<char> big(8 << 20, static_cast<char>(g_rank)), in1(8 << 20), in2(8 << 20);
  auto x1 = pg.Send(big.data(), big.size(), DataType::kU8, next, 9);
  auto x2 = pg.Send(big.data(), big.size(), DataType::kU8, prev, 9);
  auto y1 = pg.Recv(in1.data(), in1.size(), DataType::kU8, prev, 9);
  auto y2 = pg.Recv(in2.data(), in2.size(), DataType::kU8, next, 9);
  float f = 1;
  auto ar = pg.AllReduce(&f, 1, DataType::kF32, ReduceOp::kSum);
  for (auto& w : {x1, x2, y1, y2, ar})
    if (absl::Status s = w->Wait(absl::Seconds(30)); !s.ok()) return s;
  CHECK_OR_FAIL(in1[12345] == static_cast<char>(prev) && in2[8 << 19] == static_cast<char>(next), "big p2p");
  CHECK_OR_FAIL(f == g_size, "all_reduce during p2p");
  // Size mismatch on a recv is an error, not corruption.
  if (g_size >= 2) {
    if (g_rank == 0) {
      std::vector<int32_t> m(10, 1);
      if (absl::Status s = pg.Send(m.data(), 10, DataType::kI32, 1, 77)->Wait(absl::Seconds(30)); !s.ok()) return s;
    } else if (g_rank == 1) {
      std::vector<int32_t> m(5, 0);
      absl::Status s = pg.Recv(m.data(), 5, DataType::kI32, 0, 77)->Wait(absl::Seconds(30));
      CHECK_OR_FAIL(absl::IsInvalidArgument(s), "p2p size mismatch: ", s.ToString());
      CHECK_OR_FAIL(m[0] == 0, "recv buffer written on mismatch");
    }
  }
  return pg.Barrier()->Wait(absl::Seconds(30));
}

absl::Status Mismatch(ProcessGroup& pg) {
  size_t n = g_rank == 0 ? 100 : 200;
  std::vector<float> buf(200, 1.0f), guard(64, 7.0f);
  absl::Status s = pg.AllReduce(buf.data(), n, DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(30));
  std::fprintf(stderr, "[rank %d] mismatch status: %s\n", g_rank, s.ToString().c_str());
  CHECK_OR_FAIL(!s.ok(), "mismatched all_reduce succeeded");
  CHECK_OR_FAIL(!absl::IsDeadlineExceeded(s), "mismatch should fail fast: ", s.ToString());
  if (g_rank <= 1 || g_rank == g_size - 1)  // ranks next to rank 0 see the descriptor
    CHECK_OR_FAIL(s.message().find("mismatch") != std::string::npos ||
                      absl::IsUnavailable(s) || absl::IsAborted(s), s.ToString());
  // Rank 0 passed 100 elements: nothing past them may be written.
  if (g_rank == 0)
    for (size_t i = 100; i < 200; ++i) CHECK_OR_FAIL(buf[i] == 1.0f, "out-of-bounds write at ", i);
  // Later ops fail cleanly (group aborted).
  CHECK_OR_FAIL(!pg.Barrier()->Wait(absl::Seconds(30)).ok(), "barrier after abort");
  return absl::OkStatus();
}

absl::Status Kill(ProcessGroup& pg) {
  float f = 1;
  if (absl::Status s = pg.AllReduce(&f, 1, DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(30)); !s.ok()) return s;
  if (g_rank == g_size - 1) raise(SIGKILL);
  absl::SleepFor(absl::Milliseconds(200));
  std::vector<float> buf(1 << 20, 1.0f);
  absl::Time t0 = absl::Now();
  absl::Status s = pg.AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(60));
  absl::Duration took = absl::Now() - t0;
  std::fprintf(stderr, "[rank %d] after peer death: %s (%s)\n", g_rank, s.ToString().c_str(),
               absl::FormatDuration(took).c_str());
  CHECK_OR_FAIL(!s.ok(), "all_reduce with a dead peer succeeded");
  CHECK_OR_FAIL(took < absl::Seconds(5), "dead peer detected too slowly: ", absl::FormatDuration(took));
  return absl::OkStatus();
}

// A few ops over a store-bootstrapped group: all_reduce, all_gather, broadcast, then subgroups.
absl::Status StoreOps(ProcessGroup& pg) {
  std::vector<char> buf;
  const size_t n = 70001;  // odd, > one chunk
  Fill(&buf, DataType::kF32, g_rank, n);
  if (absl::Status s = pg.AllReduce(buf.data(), n, DataType::kF32, ReduceOp::kSum)->Wait(absl::Seconds(30)); !s.ok()) return s;
  CHECK_OR_FAIL(buf == Reference(DataType::kF32, ReduceOp::kSum, n), "store all_reduce");
  int64_t mine = 1000 + g_rank, all[8] = {};
  if (absl::Status s = pg.AllGatherSingle(&mine, all, 1, DataType::kI64)->Wait(absl::Seconds(30)); !s.ok()) return s;
  for (int r = 0; r < g_size; ++r) CHECK_OR_FAIL(all[r] == 1000 + r, "store all_gather block ", r);
  int64_t b = g_rank == g_size - 1 ? 4242 : -1;
  if (absl::Status s = pg.Broadcast(&b, 1, DataType::kI64, g_size - 1)->Wait(absl::Seconds(30)); !s.ok()) return s;
  CHECK_OR_FAIL(b == 4242, "store broadcast");
  return Subgroups(pg);
}

absl::Status Hang(ProcessGroup& pg) {
  float f = 1;
  for (int i = 0; i < 2; ++i)
    if (absl::Status s = pg.AllReduce(&f, 1, DataType::kF32, ReduceOp::kSum, {.tag = "warmup"})->Wait(); !s.ok()) return s;
  if (g_rank == 1) {
    // The injected hang: this rank never joins the third all_reduce.
    absl::SleepFor(absl::Seconds(12));
    return absl::OkStatus();
  }
  std::vector<float> buf(4096, 1.0f);
  absl::Status s = pg.AllReduce(buf.data(), buf.size(), DataType::kF32, ReduceOp::kSum, {.tag = "step 3 grads"})->Wait();
  std::fprintf(stderr, "[rank %d] hang status: %s\n", g_rank, s.ToString().c_str());
  CHECK_OR_FAIL(!s.ok(), "hung all_reduce succeeded");
  CHECK_OR_FAIL(s.message().find("all_reduce") != std::string::npos &&
                    s.message().find("seq 3") != std::string::npos || absl::IsUnavailable(s) ||
                    absl::IsAborted(s), s.ToString());
  absl::SleepFor(absl::Seconds(2));  // stay alive so the watchdog finishes the dump
  return absl::OkStatus();
}

}  // namespace
}  // namespace ember::comm

int main(int argc, char** argv) {
  using namespace ember::comm;
  absl::ParseCommandLine(argc, argv);
  alarm(200);  // every worker terminates on its own
  g_rank = absl::GetFlag(FLAGS_rank);
  g_size = absl::GetFlag(FLAGS_size);
  std::string scenario = absl::GetFlag(FLAGS_scenario);
  ember::flight::FlightRecorder recorder;
  ember::flight::InstallDumpSignalHandler(SIGUSR1);
  GroupOptions o;
  o.recorder = &recorder;
  o.dump_dir = absl::GetFlag(FLAGS_dump_dir);
  o.bootstrap_timeout = absl::Seconds(30);
  if (scenario == "hang") o.timeout = absl::Seconds(3);
  if (scenario == "mismatch" || scenario == "kill") o.timeout = absl::Seconds(60);
  auto rdzv = testing::WorkerRendezvous(absl::GetFlag(FLAGS_store), absl::GetFlag(FLAGS_store_prefix),
                                        absl::GetFlag(FLAGS_rdzv_dir));
  if (!rdzv.ok()) {
    std::fprintf(stderr, "[rank %d] store connect: %s\n", g_rank, rdzv.status().ToString().c_str());
    return 2;
  }
  auto pg = ProcessGroup::Create(*rdzv, g_rank, g_size, o);
  if (!pg.ok()) {
    std::fprintf(stderr, "[rank %d] create: %s\n", g_rank, pg.status().ToString().c_str());
    return 2;
  }
  absl::Status s;
  if (scenario == "correctness") s = Correctness(**pg);
  else if (scenario == "numerics") s = Numerics(**pg);
  else if (scenario == "big") s = Big(**pg);
  else if (scenario == "subgroups") s = Subgroups(**pg);
  else if (scenario == "p2p") s = P2P(**pg);
  else if (scenario == "mismatch") s = Mismatch(**pg);
  else if (scenario == "kill") s = Kill(**pg);
  else if (scenario == "hang") s = Hang(**pg);
  else if (scenario == "store_ops") s = StoreOps(**pg);
  else s = absl::InvalidArgumentError("unknown scenario " + scenario);
  if (!s.ok()) {
    std::fprintf(stderr, "[rank %d] %s: %s\n", g_rank, scenario.c_str(), s.ToString().c_str());
    return 1;
  }
  if (g_failures) return 1;
  std::fprintf(stderr, "[rank %d] %s ok (%s)\n", g_rank, scenario.c_str(), (*pg)->Describe().c_str());
  return 0;
}
