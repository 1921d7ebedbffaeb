#include "runtime/comm/rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace ember::comm {
namespace {

absl::Status MkdirP(const std::string& dir) {
  for (size_t p = 1; p <= dir.size(); ++p) {
    if (p == dir.size() || dir[p] == '/') {
      std::string sub = dir.substr(0, p);
      if (mkdir(sub.c_str(), 0755) != 0 && errno != EEXIST)
        return base::ErrnoToStatus(errno, absl::StrCat("mkdir ", sub));
    }
  }
  return absl::OkStatus();
}

class FileRendezvous : public Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    std::string path = Path(key);
    RETURN_IF_ERROR(MkdirP(path.substr(0, path.rfind('/'))));
    std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", counter_++);
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << value;
      if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) return base::ErrnoToStatus(errno, "rename");
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::StatusOr<std::string> v = TryGet(key);
      if (v.ok() || !absl::IsNotFound(v.status())) return v;
      if (absl::Now() > deadline)
        return absl::DeadlineExceededError(absl::StrCat("rendezvous key '", key, "' not set within ",
                                                        absl::FormatDuration(timeout)));
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  absl::StatusOr<std::string> TryGet(const std::string& key) override {
    std::ifstream f(Path(key), std::ios::binary);
    if (!f) return absl::NotFoundError(key);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string Path(const std::string& key) const { return absl::StrCat(dir_, "/", key); }
  std::string dir_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace

std::shared_ptr<Rendezvous> MakeFileRendezvous(const std::string& dir) {
  return std::make_shared<FileRendezvous>(dir);
}

}  // namespace ember::comm
