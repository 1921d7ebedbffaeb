// GptConfig validation, parameter lists and initialisation (declared in gpt.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/model/gpt.h"

namespace ember::model {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

GptConfig LlamaConfig() {
  GptConfig c;
  c.arch = GptConfig::Arch::kLlama;
  c.mlp = GptConfig::Mlp::kSwiGlu;
  c.tie_embeddings = false;
  return c;
}

GptConfig BenchmarkConfig() {
  GptConfig c;
  c.vocab_size = 8192;
  c.context = 256;
  c.n_layer = 4;
  c.n_head = 4;
  c.d_model = 256;
  return c;
}

int64_t GptConfig::ff() const {
  if (d_ff > 0) return d_ff;
  if (mlp == Mlp::kSwiGlu) return (8 * d_model / 3 + 15) / 16 * 16;
  return 4 * d_model;
}

absl::Status GptConfig::Validate() const {
  auto bad = [](const char* what) { return absl::InvalidArgumentError(absl::StrCat("GptConfig: ", what)); };
  if (vocab_size <= 0) return bad("vocab_size must be > 0");
  if (context <= 0) return bad("context must be > 0");
  if (n_layer <= 0) return bad("n_layer must be > 0");
  if (n_head <= 0 || d_model % n_head != 0) return bad("d_model must be a multiple of n_head");
  if (window < 0) return bad("window must be >= 0");
  if (mlp == Mlp::kMoe && (n_expert <= 0 || top_k <= 0 || top_k > n_expert))
    return bad("MoE needs 0 < top_k <= n_expert");
  if (vocab_size > (int64_t{1} << 31) - 1) return bad("vocab_size must fit int32");
  auto badv = [](const char* field, auto value, const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("GptConfig: ", field, " = ", value, ": ", why));
  };
  if (n_kv_head < 0 || (n_kv_head > 0 && n_head % n_kv_head != 0))
    return badv("n_kv_head", n_kv_head, "must divide n_head (or be 0: n_head)");
  if (arch == Arch::kGpt) {
    if (kv_heads() != n_head) return badv("n_kv_head", n_kv_head, "grouped-query attention needs arch llama");
    if (!tie_embeddings) return badv("tie_embeddings", "false", "the gpt arch always ties the LM head to wte");
    if (rope_scaling.llama3) return badv("rope_scaling", "llama3", "RoPE needs arch llama");
    return absl::OkStatus();
  }
  if (head_dim() % 2 != 0) return badv("head_dim", head_dim(), "RoPE needs an even head width (d_model / n_head)");
  if (!(rope_theta > 1.0f) || !std::isfinite(rope_theta)) return badv("rope_theta", rope_theta, "must be a finite number > 1");
  if (rope_scaling.llama3) {
    const auto& r = rope_scaling;
    if (!(r.factor >= 1.0f) || !std::isfinite(r.factor)) return badv("rope_scaling.factor", r.factor, "must be >= 1");
    if (!(r.low_freq_factor > 0.0f)) return badv("rope_scaling.low_freq_factor", r.low_freq_factor, "must be > 0");
    if (!(r.high_freq_factor > r.low_freq_factor))
      return badv("rope_scaling.high_freq_factor", r.high_freq_factor, "must be > low_freq_factor");
    if (r.original_max_position <= 0)
      return badv("rope_scaling.original_max_position", r.original_max_position, "must be > 0");
  }
  return absl::OkStatus();
}

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamSpec> BlockParamSpecs(const GptConfig& cfg, int64_t layer) {
  const int64_t C = cfg.d_model, F = cfg.ff();
  const float std_w = cfg.init_std;
  const float std_out = cfg.init_std / std::sqrt(2.0f * cfg.n_layer);  // residual projections
  const std::string p = absl::StrCat("blocks.", layer, ".");
  std::vector<ParamSpec> s = {
      {p + "ln1.weight", {C}, 0.0f},
      {p + "attn.qkv.weight", {cfg.qkv_width(), C}, std_w},
      {p + "attn.proj.weight", {C, C}, std_out},
      {p + "ln2.weight", {C}, 0.0f},
  };
  switch (cfg.mlp) {
    case GptConfig::Mlp::kGelu:
      s.push_back({p + "mlp.fc1.weight", {F, C}, std_w});
      s.push_back({p + "mlp.fc2.weight", {C, F}, std_out});
      break;
    case GptConfig::Mlp::kSwiGlu:
      s.push_back({p + "mlp.fc1.weight", {2 * F, C}, std_w});
      s.push_back({p + "mlp.fc2.weight", {C, F}, std_out});
      break;
    case GptConfig::Mlp::kMoe:
      s.push_back({p + "moe.gate.weight", {cfg.n_expert, C}, std_w});
      for (int64_t e = 0; e < cfg.n_expert; ++e) {
        const std::string q = absl::StrCat(p, "moe.experts.", e, ".");
        s.push_back({q + "fc1.weight", {F, C}, std_w});
        s.push_back({q + "fc2.weight", {C, F}, std_out});
      }
      break;
  }
  return s;
}

std::vector<ParamSpec> ParamSpecs(const GptConfig& cfg) {
  std::vector<ParamSpec> s = {{"wte.weight", {cfg.vocab_size, cfg.d_model}, cfg.init_std}};
  if (cfg.arch == GptConfig::Arch::kGpt) s.push_back({"wpe.weight", {cfg.context, cfg.d_model}, cfg.init_std});
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    auto b = BlockParamSpecs(cfg, l);
    s.insert(s.end(), b.begin(), b.end());
  }
  s.push_back({"ln_f.weight", {cfg.d_model}, 0.0f});
  if (!cfg.tie_embeddings) s.push_back({"lm_head.weight", {cfg.vocab_size, cfg.d_model}, cfg.init_std});
  return s;
}

std::vector<std::string> RootParamNames(const GptConfig& cfg) {
  std::vector<std::string> n = {"wte.weight"};
  if (cfg.arch == GptConfig::Arch::kGpt) n.push_back("wpe.weight");
  n.push_back("ln_f.weight");
  if (!cfg.tie_embeddings) n.push_back("lm_head.weight");
  return n;
}

void InitParam(const ParamSpec& spec, uint64_t seed, int64_t offset, int64_t count, float* out) {
  if (spec.init_std == 0.0f) {
    std::fill(out, out + count, 1.0f);
    return;
  }
  const uint64_t key = SplitMix64(seed) ^ Fnv1a64(spec.name);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t idx = static_cast<uint64_t>(offset + i);
    const uint64_t a = SplitMix64(key + 2 * idx), b = SplitMix64(key + 2 * idx + 1);
    const double u1 = (static_cast<double>(a >> 11) + 0.5) * 0x1p-53;
    const double u2 = static_cast<double>(b >> 11) * 0x1p-53;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    out[i] = static_cast<float>(spec.init_std * z);
  }
}

}  // namespace ember::model
