#include "tests/toy_arch/toy_model.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/model/registry.h"

namespace ember::toy {
namespace {

using model::ParamSpec;
using model::UnitState;
using model::UnitStatePtr;

struct BlockState : UnitState {
  std::vector<float> x, a;  // input and tanh output [N, C]
};

class Toy final : public model::Model {
 public:
  explicit Toy(const ToyConfig& c) : c_(c) {
    specs_.push_back({"embed.weight", {c.vocab, c.width}, c.init_std});
    for (int64_t b = 0; b < c.blocks; ++b) {
      specs_.push_back({absl::StrCat("blocks.", b, ".w"), {c.width, c.width}, c.init_std});
      specs_.push_back({absl::StrCat("blocks.", b, ".b"), {c.width}, c.init_std});
    }
  }
  std::string arch() const override { return "toy"; }
  const std::vector<ParamSpec>& ParamSpecs() const override { return specs_; }
  int NumBlocks() const override { return static_cast<int>(c_.blocks); }
  int64_t Width() const override { return c_.width; }
  int64_t Context() const override { return c_.context; }
  std::vector<int> UnitParams(int unit) const override {
    if (unit == 0 || unit == NumBlocks() + 1) return {0};  // the head is tied to the embedding
    return {1 + 2 * (unit - 1), 2 + 2 * (unit - 1)};
  }

  absl::Status EmbedForward(const kernels::ExecContext&, absl::Span<const float* const> w, const int32_t* tok,
                            int64_t B, int64_t T, float* x) const override {
    const int64_t C = c_.width;
    for (int64_t n = 0; n < B * T; ++n) {
      if (tok[n] < 0 || tok[n] >= c_.vocab) return absl::InvalidArgumentError(absl::StrCat("token ", tok[n]));
      std::memcpy(x + n * C, w[0] + tok[n] * C, C * sizeof(float));
    }
    return absl::OkStatus();
  }
  void EmbedBackward(const kernels::ExecContext&, absl::Span<float* const> g, const int32_t* tok, int64_t B, int64_t T,
                     const float* dx) const override {
    const int64_t C = c_.width;
    for (int64_t n = 0; n < B * T; ++n)
      for (int64_t i = 0; i < C; ++i) g[0][tok[n] * C + i] += dx[n * C + i];
  }

  absl::StatusOr<UnitStatePtr> BlockForward(const kernels::ExecContext&, int, absl::Span<const float* const> w,
                                            const float* x, float* y, int64_t B, int64_t T) const override {
    const int64_t N = B * T, C = c_.width;
    auto st = std::make_unique<BlockState>();
    st->x.assign(x, x + N * C);
    st->a.resize(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < C; ++o) {
        float z = w[1][o];
        for (int64_t i = 0; i < C; ++i) z += st->x[n * C + i] * w[0][o * C + i];
        st->a[n * C + o] = std::tanh(z);
      }
    for (int64_t k = 0; k < N * C; ++k) y[k] = st->x[k] + st->a[k];
    return UnitStatePtr(std::move(st));
  }
  absl::Status BlockBackward(const kernels::ExecContext&, int, absl::Span<const float* const> w,
                             absl::Span<float* const> g, UnitStatePtr state, const float* dy,
                             float* dx) const override {
    auto* s = dynamic_cast<BlockState*>(state.get());
    if (s == nullptr) return absl::InternalError("toy block: no state");
    const int64_t C = c_.width, N = static_cast<int64_t>(s->x.size()) / C;
    std::vector<float> dz(N * C), out(N * C);
    for (int64_t k = 0; k < N * C; ++k) dz[k] = dy[k] * (1 - s->a[k] * s->a[k]);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < C; ++i) {
        float v = dy[n * C + i];
        for (int64_t o = 0; o < C; ++o) v += dz[n * C + o] * w[0][o * C + i];
        out[n * C + i] = v;
      }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < C; ++o) {
        g[1][o] += dz[n * C + o];
        for (int64_t i = 0; i < C; ++i) g[0][o * C + i] += dz[n * C + o] * s->x[n * C + i];
      }
    std::memcpy(dx, out.data(), out.size() * sizeof(float));
    return absl::OkStatus();
  }

  absl::StatusOr<float> HeadLoss(const kernels::ExecContext&, absl::Span<const float* const> w, const float* x,
                                 const int32_t* targets, int64_t B, int64_t T, float dloss, kernels::Tensor* dx,
                                 absl::Span<float* const> g) const override {
    const int64_t N = B * T, C = c_.width, V = c_.vocab;
    std::vector<double> p(V);
    double loss = 0;
    if (dx != nullptr) *dx = kernels::Tensor::Zeros(kernels::DType::kF32, {N, C});
    for (int64_t n = 0; n < N; ++n) {
      double mx = -1e300;
      for (int64_t v = 0; v < V; ++v) {
        double z = 0;
        for (int64_t i = 0; i < C; ++i) z += static_cast<double>(x[n * C + i]) * w[0][v * C + i];
        p[v] = z;
        mx = std::max(mx, z);
      }
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += (p[v] = std::exp(p[v] - mx));
      loss += -std::log(p[targets[n]] / sum);
      if (dx == nullptr) continue;
      for (int64_t v = 0; v < V; ++v) {
        const float d = static_cast<float>((p[v] / sum - (v == targets[n] ? 1.0 : 0.0)) / N * dloss);
        for (int64_t i = 0; i < C; ++i) {
          dx->data<float>()[n * C + i] += d * w[0][v * C + i];
          g[0][v * C + i] += d * x[n * C + i];
        }
      }
    }
    return static_cast<float>(loss / N);
  }

 private:
  const ToyConfig c_;
  std::vector<ParamSpec> specs_;
};

absl::StatusOr<std::shared_ptr<const model::Model>> FromSpec(const spec::v1::JobSpec& s) {
  ToyConfig c;
  const auto& m = s.model();
  if (m.has_vocab_size()) c.vocab = m.vocab_size();
  if (m.has_d_model()) c.width = m.d_model();
  if (m.has_n_layers()) c.blocks = m.n_layers();
  if (m.has_context_length()) c.context = m.context_length();
  if (m.has_init_std()) c.init_std = m.init_std();
  if (c.vocab <= 0 || c.width <= 0 || c.blocks <= 0 || c.context <= 0)
    return absl::InvalidArgumentError("model: the toy architecture needs positive vocab_size, d_model, n_layers, context_length");
  return MakeToy(c);
}

const bool kRegistered = model::RegisterArchitecture("toy", &FromSpec);

}  // namespace

std::shared_ptr<const model::Model> MakeToy(const ToyConfig& cfg) { return std::make_shared<const Toy>(cfg); }

}  // namespace ember::toy
