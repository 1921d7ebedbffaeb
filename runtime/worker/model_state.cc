#include "runtime/model/from_spec.h"
#include "runtime/worker/model_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/dtype.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/safetensors.h"
#include "kernels/cast.h"
#include "runtime/base/status_macros.h"
#include "runtime/worker/trainer.h"
#include "spdlog/spdlog.h"

namespace ember::worker {

namespace {

// ", pipeline stages=...": how a checkpoint's run was laid out, for the resume log line.
std::string SavedLayout(const ckpt::Metadata& meta) {
  std::string out;
  for (const auto& [k, v] : meta.parallelism) absl::StrAppend(&out, ", ", k, " ", v);
  return out;
}

}  // namespace

absl::StatusOr<int64_t> Restore(const std::string& dir, TrainState& m, data::TokenLoader& loader) {
  ASSIGN_OR_RETURN(auto reader, ckpt::CheckpointReader::Open(dir));
  const ckpt::Metadata& meta = reader->metadata();
  // Every copy (primary or not) reads this rank's rows of the parameter and its AdamW state.
  for (const fsdp::ShardView& v : m.Shards()) {
    const std::pair<std::string, float*> parts[] = {{v.name, v.param},
                                                    {absl::StrCat("optim.", v.name, ".exp_avg"), v.exp_avg},
                                                    {absl::StrCat("optim.", v.name, ".exp_avg_sq"), v.exp_avg_sq}};
    for (const auto& [name, dst] : parts) {
      const ckpt::TensorMeta* t = meta.Find(name);
      if (t == nullptr) return absl::NotFoundError(absl::StrCat(reader->dir(), ": no tensor ", name));
      if (t->shape != v.global_shape) {
        return absl::FailedPreconditionError(absl::StrCat(reader->dir(), ": ", name, " has another shape than the model"));
      }
      if (v.rows == 0) continue;
      ASSIGN_OR_RETURN(std::string rows, reader->ReadRows(name, v.row_begin, v.row_begin + v.rows, ckpt::DType::kF32));
      if (static_cast<int64_t>(rows.size()) != v.rows * v.row_numel * 4) {
        return absl::DataLossError(absl::StrCat(name, ": rows of ", rows.size(), " bytes, want ", v.rows * v.row_numel * 4));
      }
      std::memcpy(dst, rows.data(), rows.size());
    }
  }
  ASSIGN_OR_RETURN(std::string ds, reader->ReadBlob(0, "data_loader"));
  RETURN_IF_ERROR(loader.RestoreState(ds));
  auto it = meta.extra.find("optimizer_step");
  m.set_optimizer_step(it != meta.extra.end() ? std::stoll(it->second) : meta.step);
  const auto [key, value] = m.Layout();
  auto saved = meta.parallelism.find(key);
  spdlog::info("resumed from {} (step {}, saved by {} ranks{}, now {} {}{})", reader->dir(), meta.step,
               meta.world_size, SavedLayout(meta), key, value,
               saved != meta.parallelism.end() && saved->second == value ? "" : ": resharded");
  return meta.step;
}

absl::Status InitFromSafetensors(const std::string& path, TrainState& m) {
  ASSIGN_OR_RETURN(auto set, ckpt::SafetensorsSet::Open(path));
  size_t used = 0;
  for (const fsdp::ShardView& v : m.Shards()) {
    auto found = set->Find(v.name);
    if (!found.ok()) {
      return absl::NotFoundError(absl::StrCat(path, ": no tensor '", v.name,
                                              "' (checkpoint.init_from_safetensors needs every "
                                              "model parameter; see docs/model.md for names)"));
    }
    const auto [file, info] = *found;
    if (info->shape != v.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": tensor '", v.name, "' has shape [", absl::StrJoin(info->shape, ","),
          "], the model wants [", absl::StrJoin(v.global_shape, ","), "]"));
    }
    const size_t elem = ckpt::DTypeSize(info->dtype);
    absl::string_view bytes = file->Data(*info);
    const int64_t n = v.rows * v.row_numel;
    absl::string_view rows = bytes.substr(static_cast<size_t>(v.row_begin * v.row_numel) * elem,
                                          static_cast<size_t>(n) * elem);
    if (info->dtype == ckpt::DType::kF16) {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, rows.data() + i * 2, 2);
        v.param[i] = kernels::F16ToF32(h);
      }
    } else {
      absl::Status st = ckpt::ConvertDType(info->dtype, rows.data(), ckpt::DType::kF32, v.param,
                                           static_cast<size_t>(n));
      if (!st.ok()) return base::Annotate(st, absl::StrCat(path, ": tensor '", v.name, "'"));
    }
    ++used;
  }
  spdlog::info("initialised {} parameters from {} ({} tensors in the file{})", used, path,
               set->names().size(), set->names().size() > used ? "; extra tensors ignored" : "");
  return absl::OkStatus();
}

ckpt::HfLlamaConfig HfConfigFor(const model::GptConfig& c) {
  ckpt::HfLlamaConfig h;
  h.vocab_size = c.vocab_size;
  h.hidden_size = c.d_model;
  h.intermediate_size = c.ff();
  h.num_hidden_layers = c.n_layer;
  h.num_attention_heads = c.n_head;
  h.num_key_value_heads = c.kv_heads();
  h.max_position_embeddings = c.context;
  h.rms_norm_eps = c.norm_eps;
  h.rope_theta = c.rope_theta;
  h.tie_word_embeddings = c.tie_embeddings;
  if (c.rope_scaling.llama3) {
    h.rope_scaling.type = "llama3";
    h.rope_scaling.factor = c.rope_scaling.factor;
    h.rope_scaling.low_freq_factor = c.rope_scaling.low_freq_factor;
    h.rope_scaling.high_freq_factor = c.rope_scaling.high_freq_factor;
    h.rope_scaling.original_max_position_embeddings = c.rope_scaling.original_max_position;
  }
  return h;
}

absl::StatusOr<ckpt::HfLlamaConfig> HfConfigForSpec(const spec::JobSpec& s) {
  ASSIGN_OR_RETURN(model::GptConfig c, model::ConfigFromSpec(s));
  if (c.arch != model::GptConfig::Arch::kLlama || c.mlp != model::GptConfig::Mlp::kSwiGlu) {
    return absl::FailedPreconditionError(
        "the spec's model is not model.arch: llama with mlp: swiglu; only those export as Hugging Face Llama");
  }
  return HfConfigFor(c);
}

void RecordModel(const std::string& arch, const model::GptConfig& c, ckpt::RankState* st) {
  st->extra[ckpt::kExtraModelArch] = arch;
  const bool llama = arch == "llama";
  if (llama && c.mlp == model::GptConfig::Mlp::kSwiGlu) st->extra[ckpt::kExtraHfConfig] = ckpt::HfConfigJson(HfConfigFor(c));
}

absl::Status InitFromHf(const std::string& dir, TrainState& m) {
  // The spec's checks (spec::ValidateJobSpec, at Submit and at load) refuse init_from on a model
  // other than llama/swiglu.
  const model::GptConfig& c = m.config();
  ASSIGN_OR_RETURN(auto hf, ckpt::HfCheckpoint::Open(dir, HfConfigFor(c)));
  for (const fsdp::ShardView& v : m.Shards()) {
    if (v.rows == 0) continue;
    absl::Status st = hf->ReadEmberRows(v.name, v.row_begin, v.rows, v.param);
    if (!st.ok()) return base::Annotate(st, "checkpoint.init_from");
  }
  spdlog::info("initialised {} parameters from the Hugging Face Llama directory {}", m.Shards().size(), dir);
  return absl::OkStatus();
}

ckpt::RankState Snapshot(TrainState& m, const data::TokenLoader& loader, int64_t step, uint64_t seed) {
  ckpt::RankState st;
  st.step = step;
  auto view = [](const float* p, int64_t n) {
    return absl::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n) * 4);
  };
  for (const fsdp::ShardView& v : m.Shards()) {
    if (!v.primary) continue;  // a copy another rank (or this rank's other stage) saves
    const int64_t n = v.rows * v.row_numel;
    st.tensors.push_back({v.name, ckpt::DType::kF32, v.global_shape, v.row_begin, view(v.param, n)});
    st.tensors.push_back({absl::StrCat("optim.", v.name, ".exp_avg"), ckpt::DType::kF32, v.global_shape,
                          v.row_begin, view(v.exp_avg, n)});
    st.tensors.push_back({absl::StrCat("optim.", v.name, ".exp_avg_sq"), ckpt::DType::kF32,
                          v.global_shape, v.row_begin, view(v.exp_avg_sq, n)});
  }
  // The only randomness of a step is the data order, which (seed, position) determines.
  st.rng_state = absl::StrCat("seed=", seed);
  st.data_loader_state = loader.SaveState();
  st.extra["optimizer_step"] = absl::StrCat(m.optimizer_step());
  const auto [key, value] = m.Layout();
  st.parallelism[key] = value;
  return st;
}

}  // namespace ember::worker
