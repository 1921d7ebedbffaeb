// Hugging Face Llama interop, part 1: `config.json` (LlamaForCausalLM) <-> HfLlamaConfig, and the
// check of a file's config against the one a job spec implies. Layout of the tensors: hf_layout.h.
// docs/formats.md ("Hugging Face Llama") lists every field written and how each maps to the spec.
//
//   std::string text = HfConfigJson(cfg);                         // what export writes
//   ASSIGN_OR_RETURN(HfLlamaConfig file, ParseHfConfig(text, "x/config.json"));
//   RETURN_IF_ERROR(CheckHfConfig(/*expected=*/spec_cfg, file, "x/config.json"));
//
// Plain data and pure functions: thread-safe.
#ifndef EMBER_CHECKPOINT_HF_CONFIG_H_
#define EMBER_CHECKPOINT_HF_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/dtype.h"

namespace ember::ckpt {

struct HfRopeScaling {
  std::string type;  // "" = none (rope_scaling: null); "llama3"
  float factor = 8.f;
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int64_t original_max_position_embeddings = 8192;
};

struct HfLlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // C
  int64_t intermediate_size = 0;    // F (SwiGLU hidden)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // KV (GQA); H divisible by KV
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  bool tie_word_embeddings = false;
  HfRopeScaling rope_scaling;
  DType torch_dtype = DType::kF32;  // the dtype the tensors are written in (informational)

  int64_t head_dim() const { return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0; }
  // INVALID_ARGUMENT naming the field: non-positive sizes, C not a multiple of H, H not a multiple
  // of KV, an odd head_dim (RoPE rotates pairs), an unknown rope_scaling type.
  absl::Status Validate() const;
};

// config.json text (pretty-printed, LlamaForCausalLM fields; see docs/formats.md).
std::string HfConfigJson(const HfLlamaConfig& c);

// Parses config.json. Accepts what transformers writes for Llama 1-3.x: architectures holding
// LlamaForCausalLM (or model_type "llama"), rope_scaling null or {rope_type|type: "llama3", ...}.
// Missing optional fields take transformers' LlamaConfig defaults (num_key_value_heads =
// num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false,
// max_position_embeddings 2048). What Ember cannot represent (attention_bias, mlp_bias,
// hidden_act other than silu, head_dim != hidden_size / num_attention_heads, another rope_scaling
// type) is INVALID_ARGUMENT naming the field and value; `what` (the path) prefixes every error.
absl::StatusOr<HfLlamaConfig> ParseHfConfig(absl::string_view text, absl::string_view what);

// Checks a file's config (`found`) against the one the job spec implies (`expected`): every shape
// field, rms_norm_eps and rope_theta (as float32), tie_word_embeddings and rope_scaling must be
// equal; max_position_embeddings may exceed the spec's context (a run may use a shorter context).
// The first mismatch is FAILED_PRECONDITION naming the config.json field, the spec field and both
// values, e.g. "x/config.json: num_key_value_heads is 8, the job spec has 4 (model.n_kv_heads)".
absl::Status CheckHfConfig(const HfLlamaConfig& expected, const HfLlamaConfig& found,
                           absl::string_view what);

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_HF_CONFIG_H_
