// Hugging Face Llama interop, part 2: how Ember's Llama parameters map to LlamaForCausalLM's
// tensors, the export of an Ember checkpoint to a Hugging Face directory and the import of one.
// Names, shapes and the rotary permutation are in docs/formats.md ("Hugging Face Llama").
//
// Ember fuses q/k/v (blocks.{l}.attn.qkv.weight, rows q heads, k heads, v heads) and gate/up
// (blocks.{l}.mlp.fc1.weight, gate rows then up rows); Hugging Face keeps them apart. Ember's RoPE
// rotates interleaved pairs (2i, 2i+1) of each head (Meta's reference); Hugging Face rotates
// halves (i, i + hd/2), so q and k rows are permuted within each head on the way out
// (transformers' convert_llama_weights_to_hf.py `permute`) and back on the way in:
//   Hugging Face row h*hd + a*hd/2 + i  <->  Ember row h*hd + 2i + a     (a in {0,1}, i < hd/2)
//
// Thread-safety: pure functions are thread-safe; HfCheckpoint is immutable after Open.
#ifndef EMBER_CHECKPOINT_HF_LAYOUT_H_
#define EMBER_CHECKPOINT_HF_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"

namespace ember::ckpt {

// The checkpoint `extra` keys the worker writes so export needs no job spec: the architecture
// ("gpt" | "llama") and, for llama, the config.json text (HfConfigJson).
inline constexpr char kExtraModelArch[] = "model.arch";
inline constexpr char kExtraHfConfig[] = "hf.config";

// A run of consecutive rows of an Ember parameter that is one Hugging Face tensor.
struct HfPiece {
  std::string hf_name;
  int64_t rows = 0;
  int64_t rope_heads = 0;  // > 0: the rows are this many heads of head_dim rows, rotary-permuted
};

struct HfParam {
  std::string name;              // Ember's name
  std::vector<int64_t> shape;    // Ember's shape
  std::vector<HfPiece> pieces;   // cover the rows in order
  int64_t cols() const { return shape.size() > 1 ? shape[1] : 1; }
  std::vector<int64_t> HfShape(const HfPiece& p) const {  // 1-D parameters stay 1-D
    return shape.size() > 1 ? std::vector<int64_t>{p.rows, shape[1]} : std::vector<int64_t>{p.rows};
  }
};

// Every Ember parameter of the Llama `c` describes, in Ember's order (wte, blocks, ln_f, lm_head
// when untied), with its Hugging Face pieces.
std::vector<HfParam> LlamaHfLayout(const HfLlamaConfig& c);

// Row r of a rotary-permuted piece (head_dim hd): Ember -> Hugging Face, and back.
int64_t EmberToHfRow(int64_t r, int64_t hd);
int64_t HfToEmberRow(int64_t r, int64_t hd);

struct HfExportOptions {
  DType dtype = DType::kF32;     // F32, BF16 (round to nearest even) or F16
  uint64_t max_shard_bytes = 0;  // 0: one model.safetensors; else sharded + index
  // The model; unset = the checkpoint's own record (kExtraHfConfig). A checkpoint of model.arch
  // gpt is refused either way (see ExportHf).
  std::optional<HfLlamaConfig> config;
};

// Writes `out_dir` (created; must not hold a config.json yet) with config.json and
// model.safetensors, or model-0000k-of-0000n.safetensors plus model.safetensors.index.json,
// `format: pt` in every file's metadata. The checkpoint must hold exactly the layout's parameters
// (optimizer state is skipped) with their shapes; anything else is an error naming the tensor.
// GPT checkpoints (learned positions, tied head, no Hugging Face class with its layout) are
// FAILED_PRECONDITION: export them with the plain safetensors format. Memory: one row block of at
// most ~4 MiB (a whole head for permuted rows) at a time. Returns the tensor bytes written.
absl::StatusOr<uint64_t> ExportHf(const std::string& ckpt, const std::string& out_dir,
                                  const HfExportOptions& opts);

// A Hugging Face Llama directory opened for import (checkpoint.init_from).
class HfCheckpoint {
 public:
  // Reads dir/config.json and checks it against `expected` (CheckHfConfig: a mismatch names the
  // field and both values), opens model.safetensors.index.json or model.safetensors (headers and
  // index validated: safetensors.h), and checks the tensor set: each layout tensor present with
  // its shape and dtype F32, BF16 or F16 (NOT_FOUND / FAILED_PRECONDITION naming it), no other
  // tensor (INVALID_ARGUMENT listing them; lm_head.weight is tolerated, unused, when tied).
  static absl::StatusOr<std::unique_ptr<HfCheckpoint>> Open(const std::string& dir,
                                                            const HfLlamaConfig& expected);

  const HfLlamaConfig& config() const { return config_; }
  const std::vector<HfParam>& layout() const { return layout_; }
  // Rows [row_begin, row_begin + rows) of Ember parameter `name` as float32 (dst holds rows *
  // cols floats), gathered from the Hugging Face pieces and un-permuted.
  absl::Status ReadEmberRows(const std::string& name, int64_t row_begin, int64_t rows, float* dst) const;

 private:
  HfCheckpoint() = default;
  std::string dir_;
  HfLlamaConfig config_;
  std::vector<HfParam> layout_;
  std::unique_ptr<SafetensorsSet> set_;
};

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_HF_LAYOUT_H_
