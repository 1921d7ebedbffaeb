// Packed descriptors of registered regions: what one agent sends a peer (through the store or any
// channel) so that the peer can put into or get from the region. Printable text (base64 of
// "EOD2" | owner name | base address | length | token | UCX rkey), so it fits in store values, JSON
// and logs. Pure functions; thread-safe.
//
// The token is a 64-bit random number drawn at registration; a put sent as the agent's own active
// message (agent.h, AgentOptions::put_over_am) carries it, and the target writes only into the one
// region with that token, so a peer can write only into regions whose descriptor it was given.
// Versions: "EOD1" (before the token) is refused here with a message naming the version mismatch;
// an agent from before the token refuses an "EOD2" descriptor at ImportRegion ("no EOD1 magic"), so
// mixed versions fail when a region is imported, before any byte moves, never by silent drops.
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
  uint64_t token = 0;  // the region's random token (NewRegionToken); last, so {owner, base, length,
                       // rkey} initializers stay valid
};

// A fresh region token: 64 bits from the kernel's random source (getrandom), never 0. INTERNAL if
// that source fails (nothing predictable is returned instead).
absl::StatusOr<uint64_t> NewRegionToken();

std::string PackDescriptor(const RegionDescriptor& d);
// INVALID_ARGUMENT naming what is wrong (not base64, bad magic, truncated, trailing bytes).
absl::StatusOr<RegionDescriptor> UnpackDescriptor(absl::string_view packed);

// Whether [offset, offset + length) lies inside a region of `region_bytes` (overflow-safe).
inline bool InBounds(uint64_t offset, uint64_t length, uint64_t region_bytes) {
  return offset <= region_bytes && length <= region_bytes - offset;
}

}  // namespace ember::onesided

#endif  // EMBER_RUNTIME_ONESIDED_DESCRIPTOR_H_
