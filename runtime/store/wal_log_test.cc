// The write-ahead log through the backend, in process (no server): what is acknowledged comes back
// after a restart, with and without compaction into a snapshot; damage is refused or repaired.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "runtime/base/files.h"
#include "runtime/store/backend.h"
#include "runtime/store/wal.h"

namespace ember::store {
namespace {

using v1::Request;
using v1::Response;

std::string TempDir() {
  const char* t = getenv("TEST_TMPDIR");
  std::string d = std::string(t ? t : "/tmp") + "/walXXXXXX";
  REQUIRE(mkdtemp(d.data()) != nullptr);
  return d + "/data";  // created by the backend
}

Response Exec(Backend* b, const Request& req) {
  Response out;
  bool got = false;
  b->Execute({&req}, [&](Response r) { out = std::move(r); got = true; }, /*owner=*/1);
  REQUIRE(got);  // none of these requests blocks
  return out;
}
Response Set(Backend* b, const std::string& k, const std::string& v, int64_t lease = 0) {
  Request q;
  q.mutable_set()->set_key(k);
  q.mutable_set()->set_value(v);
  q.mutable_set()->set_lease_id(lease);
  return Exec(b, q);
}
std::string Get(Backend* b, const std::string& k) {
  Request q;
  q.mutable_get()->set_key(k);
  Response r = Exec(b, q);
  return r.get().found() ? r.get().value() : "<absent>";
}

// Writes a known history: 40 sets of k<i> (i % 10, so each key 4 times), an add, a lease with one
// key, a delete. Returns the revision.
int64_t WriteHistory(Backend* b) {
  for (int i = 0; i < 40; ++i) {
    REQUIRE(Set(b, absl::StrCat("k", i % 10), absl::StrCat(i)).code() == 0);
  }
  Request add;
  add.mutable_add()->set_key("n");
  add.mutable_add()->set_delta(7);
  REQUIRE(Exec(b, add).add().value() == 7);
  Request grant;
  grant.mutable_lease_grant()->set_ttl_ms(3600 * 1000);
  int64_t lease = Exec(b, grant).lease_grant().lease_id();
  REQUIRE(Set(b, "leased", "x", lease).code() == 0);
  Request del;
  del.mutable_delete_()->set_key("k0");
  REQUIRE(Exec(b, del).delete_().deleted());
  return b->revision();
}

void CheckHistory(Backend* b, int64_t revision) {
  CHECK(b->revision() == revision);
  CHECK(revision == 40 + 1 + 1 + 1 + 1);  // sets, add, grant, set with lease, delete
  CHECK(Get(b, "k0") == "<absent>");
  for (int i = 1; i < 10; ++i) CHECK(Get(b, absl::StrCat("k", i)) == absl::StrCat(30 + i));
  CHECK(Get(b, "n") == "7");
  CHECK(Get(b, "leased") == "x");
}

TEST_CASE("Acknowledged writes come back after a restart, from the log or from a snapshot") {
  for (bool compact : {false, true}) {
    for (FsyncPolicy fsync : {FsyncPolicy::kNever, FsyncPolicy::kAlways}) {
      INFO("compact=" << compact << " fsync=" << static_cast<int>(fsync));
      base::FakeClock clock;
      BackendOptions o;
      o.data_dir = TempDir();
      o.fsync = fsync;
      o.compact_after_bytes = compact ? 200 : int64_t{64} << 20;
      int64_t rev = 0;
      {
        auto b = NewMemoryBackend(o, &clock);
        REQUIRE(b.ok());
        rev = WriteHistory(b->get());
      }
      struct stat st;
      const bool has_snapshot = stat((o.data_dir + "/snapshot").c_str(), &st) == 0;
      CHECK(has_snapshot == compact);
      if (has_snapshot) CHECK((st.st_mode & 0777) == 0600);
      REQUIRE(stat((o.data_dir + "/wal.log").c_str(), &st) == 0);
      CHECK((st.st_mode & 0777) == 0600);
      if (compact) CHECK(st.st_size < 400);  // truncated at each compaction
      auto b = NewMemoryBackend(o, &clock);
      REQUIRE(b.ok());
      CheckHistory(b->get(), rev);
      // Writes after a recovery go on from the recovered revision.
      CHECK(Set(b->get(), "after", "1").set().revision() == rev + 1);
    }
  }
}

TEST_CASE("A damaged log is DATA_LOSS and untouched; with repair_wal a copy is kept") {
  base::FakeClock clock;
  BackendOptions o;
  o.data_dir = TempDir();
  {
    auto b = NewMemoryBackend(o, &clock);
    REQUIRE(b.ok());
    for (int i = 0; i < 10; ++i) REQUIRE(Set(b->get(), absl::StrCat("k", i), "v").code() == 0);
  }
  const std::string wal = o.data_dir + "/wal.log";
  auto framed = ReadFramedFile(wal);
  REQUIRE(framed.ok());
  REQUIRE(framed->records.size() == 10);
  std::string bytes = base::ReadRegularFile(wal, 1 << 20).value();
  const int64_t bad = framed->offsets[4];
  bytes[bad + 9] ^= 0x40;  // a payload byte of the 5th record
  REQUIRE(base::WriteFileAtomic(wal, bytes, 0600).ok());

  auto refused = NewMemoryBackend(o, &clock);
  CHECK(absl::IsDataLoss(refused.status()));
  CHECK(refused.status().message().find(absl::StrCat("record at offset ", bad, " of ", wal)) !=
        std::string::npos);
  CHECK(base::ReadRegularFile(wal, 1 << 20).value() == bytes);

  o.repair_wal = true;
  auto repaired = NewMemoryBackend(o, &clock);
  REQUIRE(repaired.ok());
  CHECK((*repaired)->revision() == 4);
  CHECK(Get(repaired->get(), "k3") == "v");
  CHECK(Get(repaired->get(), "k4") == "<absent>");
  struct stat st;
  REQUIRE(stat(wal.c_str(), &st) == 0);
  CHECK(st.st_size == bad);
  CHECK(std::system(("ls " + wal + ".damaged-* >/dev/null").c_str()) == 0);
}

}  // namespace
}  // namespace ember::store
