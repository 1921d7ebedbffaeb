#include "checkpoint/hf_layout.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "runtime/base/files.h"
#include "runtime/base/status_macros.h"

namespace ember::ckpt {
namespace {

constexpr uint64_t kBlockBytes = 4 << 20;  // rows read and converted at a time on export

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

// Permutes `rows` rows of `row_bytes` (a whole number of heads of hd rows) from Ember's order to
// Hugging Face's: out row f = in row HfToEmberRow(f).
void PermuteToHf(const char* in, char* out, int64_t rows, int64_t hd, size_t row_bytes) {
  for (int64_t f = 0; f < rows; ++f) {
    std::memcpy(out + f * row_bytes, in + HfToEmberRow(f, hd) * row_bytes, row_bytes);
  }
}

// The Llama config an export uses: the caller's, or the checkpoint's record; GPT is refused.
absl::StatusOr<HfLlamaConfig> ExportConfig(const CheckpointReader& r, const HfExportOptions& opts) {
  const auto& extra = r.metadata().extra;
  auto arch = extra.find(kExtraModelArch);
  if (arch != extra.end() && arch->second != "llama") {
    return absl::FailedPreconditionError(absl::StrCat(
        r.dir(), ": model.arch is '", arch->second, "'; only llama checkpoints export as Hugging "
        "Face LlamaForCausalLM (GPT's learned positions and layout match no transformers class). "
        "Export the Ember names with plain `emberctl ckpt export CKPT OUT.safetensors`"));
  }
  if (opts.config) return *opts.config;
  auto it = extra.find(kExtraHfConfig);
  if (it == extra.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        r.dir(), ": the checkpoint records no model config (saved by an older Ember or not by a "
        "llama job); pass --spec JOB.yaml to take the model from the job spec"));
  }
  return ParseHfConfig(it->second, absl::StrCat(r.dir(), " extra '", kExtraHfConfig, "'"));
}

}  // namespace

int64_t EmberToHfRow(int64_t r, int64_t hd) {
  const int64_t h = r / hd, j = r % hd;
  return h * hd + (j % 2) * (hd / 2) + j / 2;
}

int64_t HfToEmberRow(int64_t r, int64_t hd) {
  const int64_t h = r / hd, j = r % hd;
  return h * hd + 2 * (j % (hd / 2)) + j / (hd / 2);
}

std::vector<HfParam> LlamaHfLayout(const HfLlamaConfig& c) {
  const int64_t C = c.hidden_size, H = c.num_attention_heads, KV = c.num_key_value_heads,
                hd = c.head_dim(), F = c.intermediate_size, V = c.vocab_size;
  std::vector<HfParam> out;
  out.push_back({"wte.weight", {V, C}, {{"model.embed_tokens.weight", V, 0}}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string e = absl::StrCat("blocks.", l, "."), h = absl::StrCat("model.layers.", l, ".");
    out.push_back({e + "ln1.weight", {C}, {{h + "input_layernorm.weight", C, 0}}});
    out.push_back({e + "attn.qkv.weight",
                   {(H + 2 * KV) * hd, C},
                   {{h + "self_attn.q_proj.weight", H * hd, H},
                    {h + "self_attn.k_proj.weight", KV * hd, KV},
                    {h + "self_attn.v_proj.weight", KV * hd, 0}}});
    out.push_back({e + "attn.proj.weight", {C, H * hd}, {{h + "self_attn.o_proj.weight", C, 0}}});
    out.push_back({e + "ln2.weight", {C}, {{h + "post_attention_layernorm.weight", C, 0}}});
    out.push_back({e + "mlp.fc1.weight",
                   {2 * F, C},
                   {{h + "mlp.gate_proj.weight", F, 0}, {h + "mlp.up_proj.weight", F, 0}}});
    out.push_back({e + "mlp.fc2.weight", {C, F}, {{h + "mlp.down_proj.weight", C, 0}}});
  }
  out.push_back({"ln_f.weight", {C}, {{"model.norm.weight", C, 0}}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {V, C}, {{"lm_head.weight", V, 0}}});
  return out;
}

absl::StatusOr<uint64_t> ExportHf(const std::string& ckpt, const std::string& out_dir,
                                  const HfExportOptions& opts) {
  if (opts.dtype != DType::kF32 && opts.dtype != DType::kBF16 && opts.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat("export dtype ", SafetensorsDTypeName(opts.dtype),
                                                   ": use F32, BF16 or F16"));
  }
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(ckpt));
  ASSIGN_OR_RETURN(HfLlamaConfig cfg, ExportConfig(*reader, opts));
  RETURN_IF_ERROR(cfg.Validate());
  cfg.torch_dtype = opts.dtype;
  const std::vector<HfParam> layout = LlamaHfLayout(cfg);

  // The checkpoint must hold exactly the layout's parameters, with their shapes.
  std::set<std::string> wanted;
  for (const HfParam& p : layout) {
    wanted.insert(p.name);
    const TensorMeta* t = reader->metadata().Find(p.name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(reader->dir(), ": no tensor '", p.name, "' (the Llama config "
                                              "wants it; is the config the checkpoint's model?)"));
    }
    if (t->shape != p.shape) {
      return absl::FailedPreconditionError(absl::StrCat(reader->dir(), ": tensor '", p.name, "' has shape ",
                                                        Shape(t->shape), ", the Llama config wants ", Shape(p.shape)));
    }
  }
  for (const TensorMeta& t : reader->metadata().tensors) {
    if (!absl::StartsWith(t.name, "optim.") && wanted.count(t.name) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(reader->dir(), ": tensor '", t.name,
                                                        "' has no Hugging Face Llama name (MoE or another architecture?)"));
    }
  }

  struct Out {
    const HfParam* param;
    const HfPiece* piece;
    int64_t row_offset;  // first Ember row of the piece
  };
  std::vector<TensorSpec> specs;
  std::vector<Out> outs;
  for (const HfParam& p : layout) {
    int64_t off = 0;
    for (const HfPiece& piece : p.pieces) {
      specs.push_back({piece.hf_name, opts.dtype, p.HfShape(piece)});
      outs.push_back({&p, &piece, off});
      off += piece.rows;
    }
  }
  const int64_t hd = cfg.head_dim();
  uint64_t written = 0;
  auto produce = [&](size_t i, const AppendFn& append) -> absl::Status {
    const Out& o = outs[i];
    const int64_t cols = o.param->cols();
    const size_t in_row = static_cast<size_t>(cols) * 4, out_row = cols * DTypeSize(opts.dtype);
    const int64_t unit = o.piece->rope_heads > 0 ? hd : 1;  // never split a head
    const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(kBlockBytes / (in_row * unit))) * unit;
    std::string perm, converted;
    for (int64_t b = 0; b < o.piece->rows; b += block) {
      const int64_t e = std::min(o.piece->rows, b + block);
      ASSIGN_OR_RETURN(std::string rows, reader->ReadRows(o.param->name, o.row_offset + b,
                                                          o.row_offset + e, DType::kF32));
      const char* src = rows.data();
      if (o.piece->rope_heads > 0) {
        perm.resize(rows.size());
        PermuteToHf(rows.data(), perm.data(), e - b, hd, in_row);
        src = perm.data();
      }
      converted.resize(static_cast<size_t>(e - b) * out_row);
      RETURN_IF_ERROR(ConvertDType(DType::kF32, src, opts.dtype, converted.data(), static_cast<size_t>((e - b) * cols)));
      written += converted.size();
      RETURN_IF_ERROR(append(converted));
    }
    return absl::OkStatus();
  };

  const std::string config_path = JoinPath(out_dir, "config.json");
  if (PathExists(config_path)) {
    return absl::AlreadyExistsError(absl::StrCat(config_path, " exists; export into a new or empty directory"));
  }
  RETURN_IF_ERROR(base::MakeDirs(out_dir, kDirMode));
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"ember.step", absl::StrCat(reader->metadata().step)}};
  if (opts.max_shard_bytes > 0) {
    RETURN_IF_ERROR(WriteShardedSafetensors(out_dir, specs, opts.max_shard_bytes, meta, produce));
  } else {
    RETURN_IF_ERROR(WriteSafetensorsAtomic(JoinPath(out_dir, "model.safetensors"), specs, meta, produce));
  }
  // config.json last: a directory with a config.json is a complete export.
  RETURN_IF_ERROR(base::WriteFileAtomic(config_path, HfConfigJson(cfg), kFileMode));
  return written;
}

absl::StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir,
                                                                 const HfLlamaConfig& expected) {
  std::unique_ptr<HfCheckpoint> h(new HfCheckpoint());
  h->dir_ = dir;
  const std::string config_path = JoinPath(dir, "config.json");
  ASSIGN_OR_RETURN(std::string text, ReadFile(config_path, 16 << 20));
  ASSIGN_OR_RETURN(h->config_, ParseHfConfig(text, config_path));
  RETURN_IF_ERROR(CheckHfConfig(expected, h->config_, config_path));
  h->layout_ = LlamaHfLayout(h->config_);
  const std::string index = JoinPath(dir, "model.safetensors.index.json");
  const std::string single = JoinPath(dir, "model.safetensors");
  if (!PathExists(index) && !PathExists(single)) {
    return absl::NotFoundError(absl::StrCat(dir, ": neither model.safetensors.index.json nor model.safetensors"));
  }
  ASSIGN_OR_RETURN(h->set_, SafetensorsSet::Open(PathExists(index) ? index : single));
  std::set<std::string> known;
  for (const HfParam& p : h->layout_) {
    for (const HfPiece& piece : p.pieces) {
      known.insert(piece.hf_name);
      auto found = h->set_->Find(piece.hf_name);
      if (!found.ok()) {
        return absl::NotFoundError(absl::StrCat(dir, ": no tensor '", piece.hf_name, "' (a LlamaForCausalLM with this "
                                                "config.json has it; a truncated or partial download?)"));
      }
      const TensorInfo* t = found->second;
      if (t->shape != p.HfShape(piece)) {
        return absl::FailedPreconditionError(absl::StrCat(dir, ": tensor '", piece.hf_name, "' has shape ", Shape(t->shape),
                                                          ", config.json implies ", Shape(p.HfShape(piece))));
      }
      if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
        return absl::FailedPreconditionError(absl::StrCat(dir, ": tensor '", piece.hf_name, "' is ",
                                                          SafetensorsDTypeName(t->dtype), "; Ember reads F32, BF16 or F16"));
      }
    }
  }
  if (h->config_.tie_word_embeddings) known.insert("lm_head.weight");  // some writers keep the tied copy
  std::vector<std::string> extra;
  for (const std::string& n : h->set_->names()) {
    if (known.count(n) == 0) extra.push_back(n);
  }
  if (!extra.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", extra.size(), " tensor(s) Ember's Llama has no place for: ",
                                                   absl::StrJoin(extra.begin(), extra.begin() + std::min<size_t>(extra.size(), 8), ", "),
                                                   extra.size() > 8 ? ", ..." : ""));
  }
  return h;
}

absl::Status HfCheckpoint::ReadEmberRows(const std::string& name, int64_t row_begin, int64_t rows, float* dst) const {
  const HfParam* p = nullptr;
  for (const HfParam& q : layout_) {
    if (q.name == name) p = &q;
  }
  if (p == nullptr) return absl::NotFoundError(absl::StrCat(dir_, ": the Llama layout has no parameter '", name, "'"));
  if (row_begin < 0 || rows < 0 || row_begin + rows > p->shape[0]) {
    return absl::OutOfRangeError(absl::StrCat(name, ": rows [", row_begin, ", ", row_begin + rows, ") outside ", Shape(p->shape)));
  }
  const int64_t cols = p->cols(), hd = config_.head_dim();
  int64_t off = 0;  // first Ember row of the current piece
  size_t k = 0;
  for (int64_t r = row_begin; r < row_begin + rows; ++r) {
    while (r >= off + p->pieces[k].rows) off += p->pieces[k++].rows;
    const HfPiece& piece = p->pieces[k];
    const int64_t local = r - off;
    const int64_t hf_row = piece.rope_heads > 0 ? EmberToHfRow(local, hd) : local;
    auto [file, info] = *set_->Find(piece.hf_name);
    const size_t elem = DTypeSize(info->dtype);
    absl::string_view bytes = file->Data(*info).substr(static_cast<size_t>(hf_row * cols) * elem,
                                                       static_cast<size_t>(cols) * elem);
    RETURN_IF_ERROR(ConvertDType(info->dtype, bytes.data(), DType::kF32, dst + (r - row_begin) * cols,
                                 static_cast<size_t>(cols)));
  }
  return absl::OkStatus();
}

}  // namespace ember::ckpt
