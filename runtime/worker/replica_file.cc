#include "runtime/worker/replica_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ember::worker {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'R', 'E', 'P', 'L', '1'};
constexpr uint32_t kVersion = 1;
constexpr int64_t kPage = 4096;

int64_t RoundUp(int64_t n) { return (n + kPage - 1) / kPage * kPage; }
int SlotsOf(uint32_t field) { return field == 0 ? 2 : static_cast<int>(field); }

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

struct ReplicaFile::Record {
  uint64_t committed;  // 1: step and checksum describe the slot's bytes
  int64_t step;
  uint64_t checksum;
  uint64_t pad;
};


namespace {

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t slots;  // 0 (files before the field): 2
  int64_t payload_bytes;
  uint64_t fingerprint;
};
constexpr int64_t kRecordOffset = 64;

}  // namespace

uint64_t ReplicaChecksum(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 32);
}

absl::StatusOr<int> OpenReplicaDir(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("replica directory '", path, "' must be an absolute path"));
  }
  const uid_t me = geteuid();
  int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open /");
  std::string at = "";
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& c = parts[i];
    at = absl::StrCat(at, "/", c);
    if (c == "." || c == "..") {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat("replica directory '", path, "': no '.' or '..' components"));
    }
    const bool last = i + 1 == parts.size();
    if (mkdirat(fd, c.c_str(), 0700) != 0 && errno != EEXIST) {
      absl::Status st = Errno(absl::StrCat("replica directory: mkdir ", at));
      close(fd);
      return st;
    }
    int next = openat(fd, c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    if (next < 0) {
      return Errno(absl::StrCat("replica directory: ", at, " (a symlink or not a directory?)"));
    }
    fd = next;
    struct stat st;
    if (fstat(fd, &st) != 0) {
      absl::Status s = Errno(absl::StrCat("replica directory: stat ", at));
      close(fd);
      return s;
    }
    std::string bad;
    if (st.st_uid != me && !(st.st_uid == 0 && !last)) {
      bad = absl::StrCat("is owned by uid ", st.st_uid, ", not this user (", me, ")");
    } else if (last && (st.st_mode & 077)) {
      bad = "must be mode 0700 (no access for group or others)";
    } else if ((st.st_mode & 022) && !(st.st_mode & S_ISVTX)) {
      // Another user could rename our directory away and put theirs in its place; a sticky
      // directory (/dev/shm, /tmp) forbids that.
      bad = "is writable by group or others without the sticky bit";
    }
    if (!bad.empty()) {
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat("replica directory: ", at, " ", bad,
                                                        "; remove it or point EMBER_REPLICA_DIR elsewhere"));
    }
  }
  return fd;
}

std::string ReplicaFileName(int rank, int holder) {
  return holder < 0 ? absl::StrCat("rank-", rank, ".own") : absl::StrCat("rank-", rank, ".buddy-", holder);
}

ReplicaFile::ReplicaFile(std::string name, uint8_t* base, int64_t file_bytes, int64_t payload_bytes, int slots)
    : name_(std::move(name)), base_(base), file_bytes_(file_bytes), payload_bytes_(payload_bytes), slots_(slots) {}

ReplicaFile::~ReplicaFile() { munmap(base_, static_cast<size_t>(file_bytes_)); }

namespace {

// Opens `name` without following links; a regular file of this user, else FAILED_PRECONDITION.
absl::StatusOr<int> OpenChecked(int dirfd, const std::string& name, int flags) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("replica file name '", name, "' is not a plain name"));
  }
  int fd = openat(dirfd, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("replica file ", name, " does not exist"));
    return Errno(absl::StrCat("replica file ", name, " (a symlink?)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("replica file ", name,
                                                      " is not a regular 0600 file of this user; remove it"));
  }
  return fd;
}

bool HeaderMatches(const uint8_t* base, int64_t payload_bytes, uint64_t fingerprint, int slots) {
  Header h;
  std::memcpy(&h, base, sizeof h);
  return std::memcmp(h.magic, kMagic, 8) == 0 && h.version == kVersion && h.payload_bytes == payload_bytes &&
         h.fingerprint == fingerprint && SlotsOf(h.slots) == slots;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicaFile>> ReplicaFile::Open(int dirfd, const std::string& name,
                                                               int64_t payload_bytes, uint64_t fingerprint,
                                                               bool* reset, int slots) {
  if (payload_bytes <= 0) return absl::InvalidArgumentError("replica payload must be > 0 bytes");
  if (slots < 2 || slots > kMaxSlots) return absl::InvalidArgumentError("a replica file has 2 or 3 slots");
  const int64_t size = kPage + slots * RoundUp(payload_bytes);
  auto fd = OpenChecked(dirfd, name, O_RDWR | O_CREAT);
  if (!fd.ok()) return fd.status();
  struct stat st;
  fstat(*fd, &st);
  bool fresh = st.st_size != size;
  if (fresh) {
    // Another size: not ours to keep (another layout, a partial create). Start over empty.
    if (ftruncate(*fd, 0) != 0 || ftruncate(*fd, size) != 0) {
      absl::Status s = Errno(absl::StrCat("replica file ", name, ": resize to ", size, " bytes"));
      close(*fd);
      return s;
    }
  }
  void* m = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  close(*fd);
  if (m == MAP_FAILED) return Errno(absl::StrCat("replica file ", name, ": mmap ", size, " bytes"));
  auto* base = static_cast<uint8_t*>(m);
  if (!fresh && !HeaderMatches(base, payload_bytes, fingerprint, slots)) fresh = true;
  if (fresh) {
    std::memset(base, 0, kPage);
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kVersion;
    h.slots = static_cast<uint32_t>(slots);
    h.payload_bytes = payload_bytes;
    h.fingerprint = fingerprint;
    std::memcpy(base, &h, sizeof h);
  }
  if (reset != nullptr) *reset = fresh;
  return std::unique_ptr<ReplicaFile>(new ReplicaFile(name, base, size, payload_bytes, slots));
}

absl::StatusOr<std::unique_ptr<ReplicaFile>> ReplicaFile::OpenExisting(int dirfd, const std::string& name,
                                                                       int64_t payload_bytes, uint64_t fingerprint) {
  auto fd = OpenChecked(dirfd, name, O_RDONLY);
  if (!fd.ok()) return fd.status();
  struct stat st;
  fstat(*fd, &st);
  Header h{};
  const bool read_ok = st.st_size >= kPage && pread(*fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h);
  const int slots = SlotsOf(h.slots);
  const int64_t size = kPage + slots * RoundUp(payload_bytes);
  if (!read_ok || slots > kMaxSlots || st.st_size != size) {
    close(*fd);
    return absl::FailedPreconditionError(absl::StrCat("replica file ", name, " has ", st.st_size, " bytes, want ", size));
  }
  void* m = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, *fd, 0);
  close(*fd);
  if (m == MAP_FAILED) return Errno(absl::StrCat("replica file ", name, ": mmap"));
  auto* base = static_cast<uint8_t*>(m);
  if (!HeaderMatches(base, payload_bytes, fingerprint, slots)) {
    munmap(m, static_cast<size_t>(size));
    return absl::FailedPreconditionError(absl::StrCat("replica file ", name, " holds another layout (world size or shards)"));
  }
  return std::unique_ptr<ReplicaFile>(new ReplicaFile(name, base, size, payload_bytes, slots));
}

absl::StatusOr<std::unique_ptr<ReplicaFile>> ReplicaFile::OpenHeld(int dirfd, const std::string& name) {
  auto fd = OpenChecked(dirfd, name, O_RDWR);
  if (!fd.ok()) return fd.status();
  struct stat st;
  fstat(*fd, &st);
  Header h{};
  const bool read_ok = st.st_size >= kPage && pread(*fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h);
  const int slots = SlotsOf(h.slots);
  const int64_t size = kPage + slots * RoundUp(h.payload_bytes);
  if (!read_ok || std::memcmp(h.magic, kMagic, 8) != 0 || h.version != kVersion || h.payload_bytes <= 0 ||
      slots > kMaxSlots || st.st_size != size) {
    close(*fd);
    return absl::FailedPreconditionError(absl::StrCat("replica file ", name, " is not a replica file (header or size)"));
  }
  void* m = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  close(*fd);
  if (m == MAP_FAILED) return Errno(absl::StrCat("replica file ", name, ": mmap"));
  return std::unique_ptr<ReplicaFile>(new ReplicaFile(name, static_cast<uint8_t*>(m), size, h.payload_bytes, slots));
}

uint64_t ReplicaFile::fingerprint() const {
  Header h;
  std::memcpy(&h, base_, sizeof h);
  return h.fingerprint;
}

int64_t ReplicaFile::RecordOffset(int index) { return kRecordOffset + index * kRecordBytes; }

int64_t ReplicaFile::SlotOffset(int64_t payload_bytes, int index) { return kPage + index * RoundUp(payload_bytes); }

std::optional<ReplicaFile::Slot> ReplicaFile::ParseRecord(const uint8_t* record, int index) {
  static_assert(sizeof(Record) == kRecordBytes);
  Record r;
  std::memcpy(&r, record, sizeof r);
  if (r.committed != 1) return std::nullopt;
  return Slot{index, r.step, r.checksum};
}

void ReplicaFile::PackRecord(uint8_t* out, bool committed, int64_t step, uint64_t checksum) {
  Record r{committed ? 1u : 0u, step, checksum, 0};
  std::memcpy(out, &r, sizeof r);
}

ReplicaFile::Record* ReplicaFile::record(int index) const {
  return reinterpret_cast<Record*>(base_ + kRecordOffset + index * static_cast<int64_t>(sizeof(Record)));
}

uint8_t* ReplicaFile::slot(int index) const { return base_ + kPage + index * RoundUp(payload_bytes_); }

std::vector<ReplicaFile::Slot> ReplicaFile::RawCommitted() const {
  std::vector<Slot> out;
  for (int i = 0; i < slots_; ++i) {
    const Record* r = record(i);
    if (__atomic_load_n(&r->committed, __ATOMIC_ACQUIRE) != 1) continue;
    out.push_back({i, r->step, r->checksum});
  }
  std::stable_sort(out.begin(), out.end(), [](const Slot& a, const Slot& b) { return a.step > b.step; });
  return out;
}

std::vector<ReplicaFile::Slot> ReplicaFile::Committed() const {
  std::vector<Slot> out;
  for (const Slot& s : RawCommitted()) {
    if (ReplicaChecksum(slot(s.index), static_cast<size_t>(payload_bytes_)) == s.checksum) out.push_back(s);
  }
  return out;
}

std::optional<ReplicaFile::Slot> ReplicaFile::Find(int64_t step) const {
  for (const Slot& s : Committed()) {
    if (s.step == step) return s;
  }
  return std::nullopt;
}

int ReplicaFile::BeginWrite() {
  // A slot without a commit, else the one holding the oldest committed step (with 2 slots: the
  // one not holding the newest); with none committed, slot 0.
  std::vector<Slot> raw = RawCommitted();
  int index = -1;
  for (int i = 0; i < slots_ && index < 0; ++i) {
    bool used = false;
    for (const Slot& s : raw) used = used || s.index == i;
    if (!used) index = i;
  }
  if (index < 0) index = raw.back().index;
  __atomic_store_n(&record(index)->committed, 0, __ATOMIC_RELEASE);
  return index;
}

void ReplicaFile::Commit(int index, int64_t step, uint64_t checksum) {
  Record* r = record(index);
  r->step = step;
  r->checksum = checksum;
  // Last, after the slot's bytes and the record's fields (release: no earlier store moves after it).
  __atomic_store_n(&r->committed, 1, __ATOMIC_RELEASE);
}

}  // namespace ember::worker
