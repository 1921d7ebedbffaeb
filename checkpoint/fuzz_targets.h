// Fuzz entry points, shared by fuzz_test (bounded, seeded mutations in CI) and a libFuzzer build
// (docs/checkpoint-format.md, "Fuzzing"). Each returns 0 and must never crash or over-read,
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
