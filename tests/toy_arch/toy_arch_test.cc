// The toy architecture (toy_model.h), registered from this folder only, trained by the unchanged
// runtime: FSDP over 2 ranks, HSDP 2x2 and PP=2 x FSDP=2 must give the losses of a serial run of
// the same model (the one driver with dense parameters and AdamW) within 1e-5 over 10 steps; the
// toy's own backward is checked against finite differences first, so the serial reference is right.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "kernels/ops.h"
#include "runtime/comm/process_group.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/fsdp/fsdp.h"
#include "runtime/model/driver.h"
#include "runtime/model/registry.h"
#include "runtime/pipeline/schedule.h"
#include "runtime/pipeline/stage.h"
#include "tests/toy_arch/toy_model.h"

namespace ember::toy {
namespace {

constexpr int kSteps = 10, kRows = 8, kT = 6;
constexpr uint64_t kSeed = 5;

std::shared_ptr<const model::Model> Toy() {
  spec::v1::JobSpec s;
  s.mutable_model()->set_arch("toy");
  s.mutable_model()->set_vocab_size(11);
  s.mutable_model()->set_d_model(8);
  s.mutable_model()->set_n_layers(2);
  s.mutable_model()->set_context_length(16);
  auto m = model::MakeModel(s);
  REQUIRE(m.ok());
  return *m;
}

kernels::AdamWOptions Adam() {
  kernels::AdamWOptions o;
  o.lr = 2e-2f;
  o.weight_decay = 0.01f;
  return o;
}

// Step s's batch: kRows sequences of kT tokens with a learnable successor pattern.
void Batch(int s, std::vector<int32_t>* tok, std::vector<int32_t>* tgt) {
  tok->resize(kRows * kT);
  tgt->resize(kRows * kT);
  for (int r = 0; r < kRows; ++r) {
    int32_t t = (s * 7 + r * 3) % 11;
    for (int i = 0; i < kT; ++i) {
      (*tok)[r * kT + i] = t;
      t = (t * 3 + 1) % 11;
      (*tgt)[r * kT + i] = t;
    }
  }
}

// The serial reference: the driver over the whole model, dense parameters, AdamW.
struct Dense {
  std::shared_ptr<const model::Model> m;
  std::vector<float> p, g, mo, v;
  std::vector<int64_t> off;
  explicit Dense(std::shared_ptr<const model::Model> model) : m(std::move(model)) {
    int64_t total = 0;
    for (const auto& s : m->ParamSpecs()) {
      off.push_back(total);
      total += s.numel();
    }
    p.resize(total);
    g.assign(total, 0);
    mo.assign(total, 0);
    v.assign(total, 0);
    for (size_t i = 0; i < off.size(); ++i) {
      const auto& s = m->ParamSpecs()[i];
      model::InitParam(s, kSeed, 0, s.numel(), p.data() + off[i]);
    }
  }
  float LossAndGrad(const kernels::ExecContext& ctx, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt) {
    std::fill(g.begin(), g.end(), 0.0f);
    model::DenseParams dp(p.data(), g.data(), off);
    model::Driver d(m, model::Part::Whole(*m));
    model::MicroBatch mb;
    auto loss = d.Forward(ctx, dp, {.tokens = tok.data(), .targets = tgt.data(), .B = kRows, .T = kT}, &mb, nullptr);
    REQUIRE(loss.ok());
    REQUIRE(d.Backward(ctx, dp, &mb, nullptr, nullptr).ok());
    return *loss;
  }
};

std::vector<double> Serial() {
  Dense d(Toy());
  kernels::ThreadPool pool(1);
  kernels::ExecContext ctx{&pool, true};
  std::vector<double> losses;
  std::vector<int32_t> tok, tgt;
  for (int s = 0; s < kSteps; ++s) {
    Batch(s, &tok, &tgt);
    losses.push_back(d.LossAndGrad(ctx, tok, tgt));
    kernels::AdamWStep(ctx, Adam(), s + 1, d.p.data(), d.g.data(), d.mo.data(), d.v.data(),
                       static_cast<int64_t>(d.p.size()));
  }
  return losses;
}

std::string FreshDir() {
  static int n = 0;
  const char* d = getenv("TEST_TMPDIR");
  return absl::StrCat(d ? d : "/tmp", "/toy-rdzv-", getpid(), "-", n++);
}

// Runs fn(rank, world group) on `world` thread-ranks; errors come back as strings.
std::vector<std::string> RunRanks(int world, const std::function<std::string(int, comm::ProcessGroup*)>& fn) {
  const std::string dir = FreshDir();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::GroupOptions go;
      go.timeout = absl::Seconds(60);
      go.bootstrap_timeout = absl::Seconds(30);
      go.name = "world";
      auto pg = comm::ProcessGroup::Create(comm::MakeFileRendezvous(dir), r, world, go);
      errors[r] = pg.ok() ? fn(r, pg->get()) : pg.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void CheckClose(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
  }
}

TEST_CASE("the registry builds the toy from its spec and names the registered architectures otherwise") {
  CHECK(Toy()->arch() == "toy");
  spec::v1::JobSpec s;
  s.mutable_model()->set_arch("nope");
  auto m = model::MakeModel(s);
  REQUIRE(!m.ok());
  CHECK(absl::IsNotFound(m.status()));
  CHECK(std::string(m.status().message()).find("toy") != std::string::npos);
}

TEST_CASE("the toy's backward matches finite differences (so the serial reference is right)") {
  Dense d(Toy());
  kernels::ThreadPool pool(1);
  kernels::ExecContext ctx{&pool, true};
  std::vector<int32_t> tok, tgt;
  Batch(0, &tok, &tgt);
  d.LossAndGrad(ctx, tok, tgt);
  const std::vector<float> analytic = d.g;
  int checked = 0;
  for (size_t i = 0; i < d.p.size(); i += 7) {
    const float keep = d.p[i], h = 1e-2f;
    d.p[i] = keep + h;
    const double up = d.LossAndGrad(ctx, tok, tgt);
    d.p[i] = keep - h;
    const double down = d.LossAndGrad(ctx, tok, tgt);
    d.p[i] = keep;
    const double fd = (up - down) / (2 * h);
    INFO("parameter element " << i << ": analytic " << analytic[i] << " finite difference " << fd);
    CHECK(std::abs(analytic[i] - fd) <= 2e-3 + 2e-2 * std::abs(fd));
    ++checked;
  }
  CHECK(checked > 10);
}

TEST_CASE("FSDP over 2 ranks and HSDP 2x2 train the toy to the serial losses") {
  const std::vector<double> want = Serial();
  REQUIRE(want.back() < want.front());  // it learns
  for (int replicas : {1, 2}) {
    const int world = 2 * replicas;
    INFO("replicas " << replicas);
    std::vector<std::vector<double>> losses(world);
    auto errors = RunRanks(world, [&](int r, comm::ProcessGroup* pg) -> std::string {
      std::unique_ptr<comm::ProcessGroup> shard, replicate;
      if (replicas > 1) {
        auto s = pg->Split(r / 2, r % 2, absl::StrCat("shard", r / 2));
        auto p = pg->Split(r % 2, r / 2, absl::StrCat("replicate", r % 2));
        if (!s.ok() || !p.ok()) return "split failed";
        shard = std::move(*s);
        replicate = std::move(*p);
      }
      fsdp::FsdpOptions o;
      o.adamw = Adam();
      o.seed = kSeed;
      auto m = fsdp::FsdpGpt::Create(Toy(), {pg, nullptr, shard.get(), replicate.get()}, o);
      if (!m.ok()) return m.status().ToString();
      kernels::ThreadPool pool(1);
      kernels::ExecContext ctx{&pool, true};
      std::vector<int32_t> tok, tgt;
      const int rows = kRows / world;
      for (int s = 0; s < kSteps; ++s) {
        Batch(s, &tok, &tgt);
        auto l = (*m)->ForwardBackward(ctx, tok.data() + r * rows * kT, tgt.data() + r * rows * kT, rows, kT, true);
        if (!l.ok()) return l.status().ToString();
        auto mean = (*m)->AllReduceMean(*l);
        if (!mean.ok()) return mean.status().ToString();
        losses[r].push_back(*mean);
        auto n = (*m)->OptimizerStep(ctx, Adam().lr);
        if (!n.ok()) return n.status().ToString();
      }
      return "";
    });
    for (const auto& e : errors) REQUIRE(e == "");
    for (int r = 0; r < world; ++r) CheckClose(losses[r], want, 1e-5);
  }
}

TEST_CASE("PP=2 x FSDP=2 trains the toy to the serial losses (tied head across the stages)") {
  const std::vector<double> want = Serial();
  constexpr int kMicro = 2, kMbs = kRows / 2 / kMicro;  // per replica: 4 rows as 2 micro-batches
  std::vector<std::vector<double>> losses(4);
  auto errors = RunRanks(4, [&](int r, comm::ProcessGroup* pg) -> std::string {
    const int replica = r / 2, prank = r % 2;
    auto pipe = pg->Split(replica, prank, absl::StrCat("pipeline", replica));
    auto stage = pg->Split(prank, replica, absl::StrCat("stage", prank));
    if (!pipe.ok() || !stage.ok()) return "split failed";
    auto sched = pipeline::BuildSchedule({pipeline::ScheduleKind::k1F1B, 2, 2, kMicro});
    if (!sched.ok()) return sched.status().ToString();
    pipeline::PipelineOptions po;
    po.adamw = Adam();
    po.timeout = absl::Seconds(60);
    po.data = {stage->get(), /*shard=*/true};
    auto p = pipeline::PipelineGpt::Create(Toy(), kSeed, *sched, pipe->get(), kMbs, kT, po);
    if (!p.ok()) return p.status().ToString();
    kernels::ThreadPool pool(1);
    kernels::ExecContext ctx{&pool, true};
    std::vector<int32_t> tok, tgt;
    const int part = kRows / 2 * kT;
    for (int s = 0; s < kSteps; ++s) {
      Batch(s, &tok, &tgt);
      auto l = (*p)->Step(ctx, tok.data() + replica * part, tgt.data() + replica * part);
      if (!l.ok()) return l.status().ToString();
      losses[r].push_back(*l);
    }
    return "";
  });
  for (const auto& e : errors) REQUIRE(e == "");
  for (int r = 0; r < 4; ++r) CheckClose(losses[r], want, 1e-5);
}

}  // namespace
}  // namespace ember::toy
