// Fuzz entry points, shared by the Bazel tests' seeded mutations (tag [fuzz]) and the libFuzzer
// targets in tests/fuzz/ (tools/fuzz.sh, docs/fuzzing.md). Each returns 0 and must never crash or over-read,
// whatever the input.
#ifndef EMBER_CHECKPOINT_FUZZ_TARGETS_H_
#define EMBER_CHECKPOINT_FUZZ_TARGETS_H_

#include <cstddef>
#include <cstdint>

namespace ember::ckpt {
int FuzzSafetensors(const uint8_t* data, size_t size);
int FuzzCheckpointMetadata(const uint8_t* data, size_t size);
}  // namespace ember::ckpt

#endif  // EMBER_CHECKPOINT_FUZZ_TARGETS_H_
