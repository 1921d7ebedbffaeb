#include "checkpoint/fuzz_targets.h"

#include <cstdlib>
#include <string>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"

namespace ember::ckpt {

int FuzzSafetensors(const uint8_t* data, size_t size) {
  // Copy into an exactly sized heap buffer so ASan sees any over-read.
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto f = SafetensorsFile::FromBytes(bytes, "fuzz");
  if (!f.ok()) return 0;
  uint64_t sum = 0;
  for (const TensorInfo& t : (*f)->tensors()) {
    absl::string_view d = (*f)->Data(t);
    if (d.data() < bytes.data() || d.data() + d.size() > bytes.data() + bytes.size()) std::abort();
    for (char c : d) sum += static_cast<unsigned char>(c);
  }
  return sum == 0xFFFFFFFFFFFFFFFFull ? 1 : 0;
}

}  // namespace ember::ckpt

namespace ember::ckpt {
int FuzzCheckpointMetadata(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto m = ParseMetadata(text, /*complete=*/true);
  if (m.ok()) (void)SerializeMetadata(*m);
  return 0;
}
}  // namespace ember::ckpt
