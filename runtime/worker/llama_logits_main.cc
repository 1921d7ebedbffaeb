// llama_logits (test tool, hf_interop_test): Ember's logits and loss for one batch of a model
// loaded from an Ember checkpoint or a Hugging Face Llama directory, for comparison with an
// independent implementation (hf_llama_reference.py).
//
//   llama_logits --spec=job.yaml (--ckpt=CHECKPOINT | --hf=DIR | --init_seed=S) --batch=BATCH --out=OUT
//                [--params_out=FILE] [--rope_out=FILE]
//
// --init_seed: no weights loaded; the model's own initialisation from seed S (model_doc_check).
// --params_out: the parameters used, float32 little-endian, concatenated in ParamSpecs order.
// --rope_out: float32 inv_freq[hd/2], then the cos and sin tables [context, hd/2] (llama only).
// BATCH: little-endian int32 B, T, then tokens[B*T], targets[B*T]. OUT: float32 loss (Gpt::Loss,
// the training path), then logits[B*T, V] (the model's blocks, ln_f and the LM head on the CPU
// kernels; the training path never materialises logits). Exit 0 ok, 1 failure.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_layout.h"
#include "kernels/ops.h"
#include "kernels/rope.h"
#include "runtime/model/from_spec.h"
#include "runtime/base/flags.h"
#include "runtime/base/status_macros.h"
#include "runtime/model/gpt.h"
#include "runtime/worker/model_state.h"
#include "runtime/worker/trainer.h"

ABSL_FLAG(std::string, spec, "", "job spec (the model)");
ABSL_FLAG(std::string, ckpt, "", "Ember checkpoint (root or step directory)");
ABSL_FLAG(std::string, hf, "", "Hugging Face Llama directory");
ABSL_FLAG(std::string, batch, "", "int32 B, T, tokens[B*T], targets[B*T]");
ABSL_FLAG(std::string, out, "", "float32 loss, logits[B*T, V]");
ABSL_FLAG(int64_t, init_seed, -1, "without --ckpt/--hf: Ember's initialisation from this seed");
ABSL_FLAG(std::string, params_out, "", "optional: write the parameters (float32, ParamSpecs order)");
ABSL_FLAG(std::string, rope_out, "", "optional: write float32 inv_freq, cos, sin tables (llama)");

namespace ember::worker {
namespace {

absl::Status Load(model::Gpt& m) {
  const std::string ckpt = absl::GetFlag(FLAGS_ckpt), hf = absl::GetFlag(FLAGS_hf);
  if (ckpt.empty() && hf.empty()) {
    if (absl::GetFlag(FLAGS_init_seed) < 0) return absl::InvalidArgumentError("give --ckpt, --hf or --init_seed");
    return absl::OkStatus();  // Create() already initialised from --init_seed
  }
  if (!ckpt.empty()) {
    ASSIGN_OR_RETURN(auto reader, ckpt::CheckpointReader::Open(ckpt));
    for (size_t i = 0; i < m.specs().size(); ++i) {
      ASSIGN_OR_RETURN(std::string b, reader->ReadFull(m.specs()[i].name, ckpt::DType::kF32));
      if (static_cast<int64_t>(b.size()) != m.specs()[i].numel() * 4) return absl::DataLossError(m.specs()[i].name);
      std::memcpy(m.param(i), b.data(), b.size());
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(auto h, ckpt::HfCheckpoint::Open(hf, HfConfigFor(m.config())));
  for (size_t i = 0; i < m.specs().size(); ++i) {
    RETURN_IF_ERROR(h->ReadEmberRows(m.specs()[i].name, 0, m.specs()[i].shape[0], m.param(i)));
  }
  return absl::OkStatus();
}

absl::Status Main() {
  ASSIGN_OR_RETURN(spec::JobSpec s, spec::LoadJobSpec(absl::GetFlag(FLAGS_spec)));
  ASSIGN_OR_RETURN(model::GptConfig cfg, model::ConfigFromSpec(s));
  ASSIGN_OR_RETURN(auto m, model::Gpt::Create(cfg, static_cast<uint64_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_init_seed)))));
  RETURN_IF_ERROR(Load(*m));
  if (const std::string po = absl::GetFlag(FLAGS_params_out); !po.empty()) {
    std::ofstream pf(po, std::ios::binary);
    for (size_t i = 0; i < m->specs().size(); ++i) {
      pf.write(reinterpret_cast<const char*>(m->param(i)), static_cast<std::streamsize>(m->specs()[i].numel() * 4));
    }
    if (!pf) return absl::InternalError(absl::StrCat("cannot write --params_out ", po));
  }
  if (const std::string ro = absl::GetFlag(FLAGS_rope_out); !ro.empty()) {
    const std::vector<float> inv = kernels::RopeInvFreq(cfg.head_dim(), cfg.rope_theta, cfg.rope_scaling);
    const kernels::RopeTable tb = kernels::MakeRopeTable(inv, cfg.context);
    std::ofstream rf(ro, std::ios::binary);
    for (const std::vector<float>* v : {&inv, &tb.cos, &tb.sin}) {
      rf.write(reinterpret_cast<const char*>(v->data()), static_cast<std::streamsize>(v->size() * 4));
    }
    if (!rf) return absl::InternalError(absl::StrCat("cannot write --rope_out ", ro));
  }
  std::ifstream bf(absl::GetFlag(FLAGS_batch), std::ios::binary);
  std::string batch((std::istreambuf_iterator<char>(bf)), std::istreambuf_iterator<char>());
  int32_t B = 0, T = 0;
  if (batch.size() < 8) return absl::InvalidArgumentError("--batch: too short");
  std::memcpy(&B, batch.data(), 4);
  std::memcpy(&T, batch.data() + 4, 4);
  const int64_t N = int64_t{B} * T, C = cfg.d_model, V = cfg.vocab_size;
  if (static_cast<int64_t>(batch.size()) != 8 + 8 * N) return absl::InvalidArgumentError("--batch: wrong size");
  std::vector<int32_t> tok(N), tgt(N);
  std::memcpy(tok.data(), batch.data() + 8, 4 * N);
  std::memcpy(tgt.data(), batch.data() + 8 + 4 * N, 4 * N);

  kernels::ThreadPool pool(1);
  const kernels::ExecContext ctx{&pool, true};
  ASSIGN_OR_RETURN(float loss, m->Loss(ctx, tok.data(), tgt.data(), B, T));

  auto p = [&](const std::string& name) { return m->param(static_cast<size_t>(m->FindParam(name))); };
  std::vector<float> x(N * C), y(N * C), rstd(N), logits(N * V);
  const bool llama = cfg.arch == model::GptConfig::Arch::kLlama;
  RETURN_IF_ERROR(model::EmbedForward(ctx, cfg, p("wte.weight"), llama ? nullptr : p("wpe.weight"), tok.data(), B, T, x.data()));
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    std::vector<const float*> w;
    for (const model::ParamSpec& ps : model::BlockParamSpecs(cfg, l)) w.push_back(p(ps.name));
    model::Block block(cfg, l);
    ASSIGN_OR_RETURN(auto acts, block.Forward(ctx, w, x.data(), x.data(), B, T));
  }
  kernels::RmsNormForward(ctx, x.data(), p("ln_f.weight"), N, C, cfg.norm_eps, y.data(), rstd.data());
  kernels::LinearForward(ctx, y.data(), cfg.tie_embeddings ? p("wte.weight") : p("lm_head.weight"), nullptr, N, C, V,
                         logits.data());
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary);
  out.write(reinterpret_cast<const char*>(&loss), 4);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  if (!out) return absl::InternalError("cannot write --out");
  std::printf("loss %.9g\n", loss);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ember::worker

int main(int argc, char** argv) {
  ember::base::ParseFlagsAndInitLogging(argc, argv, "llama_logits");
  absl::Status s = ember::worker::Main();
  if (!s.ok()) {
    std::fprintf(stderr, "llama_logits: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
