// libFuzzer target: the safetensors header parser (checkpoint/safetensors.h) on arbitrary bytes.
// Built by tools/fuzz.sh; corpus in tests/fuzz/corpus/safetensors/.
#include <cstddef>
#include <cstdint>

#include "checkpoint/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ember::ckpt::FuzzSafetensors(data, size);
}
