// The library behind `emberctl ckpt inspect|export` (and //checkpoint:ember-ckpt today).
// Thread-safe (no shared state).
#ifndef EMBER_CHECKPOINT_TOOLS_H_
#define EMBER_CHECKPOINT_TOOLS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ember::ckpt {

struct InspectOptions {
  bool json = false;    // a JSON summary instead of text
  bool verify = false;  // checksum every chunk too
};

// Summarises a checkpoint (a step directory, or a root: follows `latest`, and lists the committed
// steps), a .safetensors file or a model.safetensors.index.json.
absl::StatusOr<std::string> InspectCheckpoint(const std::string& path, InspectOptions opts = {});

struct ExportOptions {
  uint64_t max_shard_bytes = 0;  // 0: one file at out_path; else a sharded set in directory out_path
  bool include_optimizer = false;  // "optim.*" tensors are skipped unless set
};

// Writes the full, unsharded tensors of checkpoint `ckpt` (step dir or root) with their parameter
// names as safetensors, streaming chunk by chunk (each verified). Returns the bytes written.
absl::StatusOr<uint64_t> ExportSafetensors(const std::string& ckpt, const std::string& out_path,
                                           ExportOptions opts = {});

}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_TOOLS_H_
