// libFuzzer target: the store's framed-record reader (runtime/store/wal.h), as used on wal.log and
// snapshot at start-up, over an in-memory file (memfd). Every record it returns must lie inside the
// input and the valid prefix must re-frame to exactly the bytes it came from.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/store/wal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = memfd_create("wal", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t off = 0;
  while (off < size) {
    ssize_t w = write(fd, data + off, size - off);
    if (w <= 0) std::abort();
    off += static_cast<size_t>(w);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto f = ember::store::ReadFramedFile(path);
  close(fd);
  if (!f.ok()) return 0;
  std::string reframed;
  for (const std::string& r : f->records) ember::store::AppendFramed(r, &reframed);
  if (f->valid_bytes < 0 || static_cast<size_t>(f->valid_bytes) > size ||
      reframed != std::string(reinterpret_cast<const char*>(data), f->valid_bytes)) {
    std::abort();
  }
  return 0;
}
