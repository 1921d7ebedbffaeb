// libFuzzer target: the checkpoint manifest (metadata.json) parser and validator
// (checkpoint/format.h). Corpus in tests/fuzz/corpus/checkpoint_metadata/.
#include <cstddef>
#include <cstdint>

#include "checkpoint/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ember::ckpt::FuzzCheckpointMetadata(data, size);
}
