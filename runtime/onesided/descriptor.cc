#include "runtime/onesided/descriptor.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/little_endian.h"

namespace ember::onesided {
namespace {

constexpr char kMagic[] = "EOD2";
constexpr char kMagicBeforeToken[] = "EOD1";

void AppendU64(uint64_t v, std::string* out) {
  base::AppendU32LE(static_cast<uint32_t>(v), out);
  base::AppendU32LE(static_cast<uint32_t>(v >> 32), out);
}

// Reads fields front to back; `ok` turns false on the first short read.
struct Reader {
  absl::string_view in;
  bool ok = true;
  uint64_t U64() { return U32() | uint64_t{U32()} << 32; }
  uint32_t U32() {
    if (in.size() < 4) { ok = false; return 0; }
    uint32_t v = base::LoadU32LE(in.data());
    in.remove_prefix(4);
    return v;
  }
  std::string Bytes() {
    uint32_t n = U32();
    if (!ok || in.size() < n) { ok = false; return ""; }
    std::string s(in.substr(0, n));
    in.remove_prefix(n);
    return s;
  }
};

}  // namespace

std::string PackDescriptor(const RegionDescriptor& d) {
  std::string raw(kMagic, 4);
  base::AppendU32LE(static_cast<uint32_t>(d.owner.size()), &raw);
  raw += d.owner;
  AppendU64(d.base, &raw);
  AppendU64(d.length, &raw);
  AppendU64(d.token, &raw);
  base::AppendU32LE(static_cast<uint32_t>(d.rkey.size()), &raw);
  raw += d.rkey;
  return absl::Base64Escape(raw);
}

absl::StatusOr<RegionDescriptor> UnpackDescriptor(absl::string_view packed) {
  std::string raw;
  if (!absl::Base64Unescape(packed, &raw)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region descriptor is not base64 (", packed.size(),
        " bytes); pass Registration::descriptor unchanged"));
  }
  if (raw.size() >= 4 && raw.compare(0, 4, kMagicBeforeToken) == 0) {
    return absl::InvalidArgumentError(
        "region descriptor is of version EOD1, made by an Ember agent from before region tokens: "
        "run the same Ember version on both sides");
  }
  if (raw.size() < 4 || raw.compare(0, 4, kMagic) != 0) {
    return absl::InvalidArgumentError(
        "region descriptor has no EOD2 magic: not made by onesided::Agent::RegisterMemory");
  }
  Reader r{absl::string_view(raw).substr(4)};
  RegionDescriptor d;
  d.owner = r.Bytes();
  d.base = r.U64();
  d.length = r.U64();
  d.token = r.U64();
  d.rkey = r.Bytes();
  if (!r.ok) return absl::InvalidArgumentError("region descriptor is truncated");
  if (!r.in.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("region descriptor has ", r.in.size(), " trailing bytes"));
  }
  if (d.length > 0 && d.rkey.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region descriptor of ", d.length, " bytes from ", d.owner, " carries no remote key"));
  }
  return d;
}

absl::StatusOr<uint64_t> NewRegionToken() {
  uint64_t token = 0;
  while (token == 0) {
    const ssize_t n = getrandom(&token, sizeof(token), 0);
    if (n == static_cast<ssize_t>(sizeof(token))) continue;
    if (n < 0 && errno == EINTR) continue;
    return absl::InternalError(absl::StrCat(
        "drawing a region token: getrandom returned ", n, " (", n < 0 ? strerror(errno) : "short read",
        "); the kernel's random source is needed to register memory"));
  }
  return token;
}

}  // namespace ember::onesided
