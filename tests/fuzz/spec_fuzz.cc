// libFuzzer target: the job spec parser, validator and resolver (runtime/jobspec/spec.h,
// resolve.h), YAML and JSON (a JSON document is YAML; the corpora differ:
// tests/fuzz/corpus/spec_yaml/ and spec_json/). A spec that parses must validate; one that
// resolves must resolve to itself again (idempotent) and read back from its job.yaml text
// (spec::ResolvedYaml, what emberd writes) to the same proto, marker included, without defaults.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "google/protobuf/util/message_differencer.h"
#include "runtime/jobspec/resolve.h"
#include "runtime/jobspec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;  // the daemon refuses specs over 1 MiB before parsing
  std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = ember::spec::ParseJobSpec(text);
  if (!spec.ok()) return 0;
  if (!ember::spec::ValidateJobSpec(*spec).ok()) std::abort();  // Parse promised a valid spec
  // The world from the input's first byte (1..8) when the spec leaves it open.
  ember::spec::Facts facts;
  facts.devices["cpu"] = 1 + (size > 0 ? data[0] % 8 : 0);
  facts.devices["cuda"] = 1;
  auto resolved = ember::spec::ResolveFields(*spec, facts);
  if (!resolved.ok()) return 0;
  using google::protobuf::util::MessageDifferencer;
  auto again = ember::spec::ResolveFields(*resolved, facts);
  if (!again.ok() || !MessageDifferencer::Equals(*again, *resolved)) std::abort();  // idempotent
  bool here = true;
  auto back = ember::spec::ParseWorkerSpec(ember::spec::ResolvedYaml(*resolved), facts, &here);
  if (!back.ok() || here || !MessageDifferencer::Equals(*back, *resolved)) std::abort();  // job.yaml round trip
  return 0;
}
