#include "bench/kernel_bench_util.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/report.h"
#include "deploy/peers_venv.h"

namespace ember::bench {

const char kTorchRmsNorm[] = R"PY(class RMSNorm(nn.Module):
    def __init__(s, c): super().__init__(); s.weight = nn.Parameter(torch.ones(c))
    def forward(s, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * s.weight
)PY";

const char kTorchTrainLoop[] = R"PY(opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01)
idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T)); times = []
for i in range(steps + 2):
    t = time.perf_counter(); opt.zero_grad(set_to_none=True)
    loss = m(idx, tgt); loss.backward(); opt.step(); times.append(time.perf_counter() - t)
times = sorted(times[2:]); print(B * T / times[len(times) // 2])
)PY";

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double TimeMedian(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double s = Now();
    fn();
    t.push_back(Now() - s);
  }
  return Median(t);
}

std::vector<float> Rand(int64_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (auto& x : v) x = d(rng);
  return v;
}

double TrainStep(const kernels::ExecContext& ctx, const model::GptConfig& c, int64_t B, int steps,
                 int64_t* peak_bytes) {
  auto m = *model::Gpt::Create(c, 1);
  model::AdamW opt(kernels::AdamWOptions{1e-4f}, m->num_params());
  std::vector<int32_t> tok(B * c.context), tgt(B * c.context);
  std::mt19937 rng(7);
  for (auto& t : tok) t = rng() % c.vocab_size;
  for (auto& t : tgt) t = rng() % c.vocab_size;
  std::vector<double> times;
  for (int i = 0; i < steps + 2; ++i) {
    double s = Now();
    m->ZeroGrad();
    auto loss = m->ForwardBackward(ctx, tok.data(), tgt.data(), B, c.context);
    opt.Step(ctx, *m);
    if (i >= 2) times.push_back(Now() - s);
    if (!loss.ok()) {
      std::fprintf(stderr, "training step failed: %s\n", loss.status().ToString().c_str());
      std::exit(1);
    }
  }
  *peak_bytes = m->peak_activation_bytes();
  return B * c.context / Median(times);
}

TorchPeer TorchPeer::Resolve(bool enabled, const std::string& python_flag, int threads) {
  TorchPeer p;
  p.threads = threads;
  if (!enabled) {
    p.missing = "peer skipped (--peer=false)";
    return p;
  }
  p.python = python_flag.empty() ? deploy::CurrentTorchPeerPython(&p.missing) : python_flag;
  if (p.python.empty()) return p;
  const std::string version = deploy::PeerTorchVersion(p.python);
  if (version.empty()) {
    p.missing = absl::StrCat("the PyTorch peer's interpreter ", p.python,
                             " cannot import torch; run deploy/peers-venv.sh, or fix "
                             "the interpreter that --python or EMBER_PEER_PYTHON names");
    p.python.clear();
    return p;
  }
  p.label = absl::StrCat("torch ", version, " (", p.python, ")");
  return p;
}

std::string TorchPeer::ThreadsText() const {
  return absl::StrFormat("threads %d on both (ours: a pool of %d; peer: torch.set_num_threads(%d), "
                         "OMP_NUM_THREADS=%d, checked after its run)",
                         threads, threads, threads, threads);
}

absl::StatusOr<double> RunTorchPeer(const std::string& python, const std::string& script,
                                    const std::string& args, int threads) {
  static int counter = 0;
  const std::string path = absl::StrCat("/tmp/kernel_bench_peer_", getpid(), "_", counter++, ".py");
  // The threads check runs after the figure is printed (the figure stays the last line).
  std::ofstream(path) << script << absl::StrFormat(R"PY(
if torch.get_num_threads() != %d:
    sys.exit("peer ran with torch.get_num_threads() = %%d, not %d" %% torch.get_num_threads())
)PY", threads, threads);
  const std::string cmd = absl::StrCat("OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=", threads, " ",
                                       python, " ", path, " ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return absl::InternalError("popen failed");
  std::string text;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) text += buf;
  int rc = pclose(p);
  std::remove(path.c_str());
  if (rc != 0) {
    std::fprintf(stderr, "peer failed: %s\n", text.c_str());
    if (text.size() > 300) text = "..." + text.substr(text.size() - 300);
    return absl::UnavailableError(
        absl::StrCat("PyTorch peer (", python, ") exited with wait status ", rc, ": ", text));
  }
  const size_t nl = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
  double v = std::strtod(text.c_str() + (nl == std::string::npos ? 0 : nl + 1), nullptr);
  if (!(v > 0)) return absl::UnavailableError("PyTorch peer printed no figure: " + text);
  return v;
}

}  // namespace ember::bench
