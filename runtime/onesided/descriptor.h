// Packed descriptors of registered regions: what one agent sends a peer (through the store or any
// channel) so that the peer can put into or get from the region. Printable text (base64 of
// "EOD1" | owner name | base address | length | UCX rkey), so it fits in store values, JSON and logs.
// Pure functions; thread-safe.
#ifndef EMBER_RUNTIME_ONESIDED_DESCRIPTOR_H_
#define EMBER_RUNTIME_ONESIDED_DESCRIPTOR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::onesided {

struct RegionDescriptor {
  std::string owner;   // the registering agent's name
  uint64_t base = 0;   // address in the owner's address space
  uint64_t length = 0;
  std::string rkey;    // packed UCX remote key (empty for a 0-byte region)
};

std::string PackDescriptor(const RegionDescriptor& d);
// INVALID_ARGUMENT naming what is wrong (not base64, bad magic, truncated, trailing bytes).
absl::StatusOr<RegionDescriptor> UnpackDescriptor(absl::string_view packed);

// Whether [offset, offset + length) lies inside a region of `region_bytes` (overflow-safe).
inline bool InBounds(uint64_t offset, uint64_t length, uint64_t region_bytes) {
  return offset <= region_bytes && length <= region_bytes - offset;
}

}  // namespace ember::onesided

#endif  // EMBER_RUNTIME_ONESIDED_DESCRIPTOR_H_
