// The library behind `emberctl ckpt inspect|export`.
// Thread-safe (no shared state).
#ifndef EMBER_CHECKPOINT_TOOLS_H_
#define EMBER_CHECKPOINT_TOOLS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ember::ckpt {

struct InspectOptions {
  bool json = false;    // a JSON summary instead of text
  bool verify = false;  // checksum every chunk too
};

struct InspectReport {
  std::string text;     // the summary (JSON with InspectOptions::json)
  absl::Status checks;  // OK, or the first failed check (DATA_LOSS listing every bad chunk)
};

// Summarises a checkpoint (a step directory, or a root: follows `latest`, and lists the committed
// steps), a .safetensors file or a model.safetensors.index.json. An input that cannot be read at
// all is an error; a readable checkpoint whose --verify finds damage is a report with !checks.ok()
// (callers print the text and exit non-zero). Inputs must be regular files and directories (a
// FIFO or device is INVALID_ARGUMENT at once).
absl::StatusOr<InspectReport> InspectCheckpoint(const std::string& path, InspectOptions opts = {});

struct ExportOptions {
  uint64_t max_shard_bytes = 0;  // 0: one file at out_path; else a sharded set in directory out_path
  bool include_optimizer = false;  // "optim.*" tensors are skipped unless set
};

// Writes the full, unsharded tensors of checkpoint `ckpt` (step dir or root) with their parameter
// names as safetensors (`format: pt` and `ember.step` in every file's __metadata__), streaming each
// chunk in pieces of at most 4 MiB and checking its checksum, so memory stays bounded whatever
// the checkpoint claims; chunks are checked against the files' sizes on disk before any byte is
// read. With max_shard_bytes, out_path is a directory receiving model-0000k-of-0000n.safetensors
// and model.safetensors.index.json (as Hugging Face writes them: metadata.total_size and
// weight_map). Output is written to temporary names and renamed on success. Returns the tensor
// bytes written.
absl::StatusOr<uint64_t> ExportSafetensors(const std::string& ckpt, const std::string& out_path,
                                           ExportOptions opts = {});

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_TOOLS_H_
