// Fast-path framing for the store client (see client_framing.h).
#include "runtime/store/client_framing.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "runtime/base/little_endian.h"
#include "runtime/store/fast_path_protocol.h"

namespace ember::store::client_internal {

void BeginFrame(std::string* frame) { frame->assign(4, '\0'); }

void AppendRequestField(const v1::Request& req, std::string* out) {
  const size_t size = req.ByteSizeLong();
  out->push_back(static_cast<char>((1 << 3) | 2));  // field 1, wire type LEN
  size_t v = size;
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
  const size_t at = out->size();
  out->resize(at + size);
  req.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&(*out)[at]));
}

void EndFrame(std::string* frame) {
  const uint32_t len = static_cast<uint32_t>(frame->size() - 4);
  std::string hdr;
  base::AppendU32LE(len, &hdr);
  frame->replace(0, 4, hdr);
}

std::string FrameOf(const v1::RequestBatch& batch) {
  std::string payload = batch.SerializeAsString(), frame;
  base::AppendU32LE(static_cast<uint32_t>(payload.size()), &frame);
  frame += payload;
  return frame;
}

bool SendAll(int fd, absl::string_view data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t k = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    off += static_cast<size_t>(k);
  }
  return true;
}

bool ReadFrame(int fd, std::string* payload, int timeout_ms) {
  auto read_n = [&](char* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return false;
      ssize_t k = recv(fd, dst + got, n - got, 0);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return false;
      got += static_cast<size_t>(k);
    }
    return true;
  };
  char hdr[4];
  if (!read_n(hdr, 4)) return false;
  uint32_t len = base::LoadU32LE(hdr);
  if (len > kMaxFastFrameBytes) return false;
  payload->resize(len);
  return read_n(payload->data(), len);
}

FrameReader::Result FrameReader::ReadSome(int fd, v1::ResponseBatch* out) {
  while (true) {
    if (buf_.size() >= 4) {
      uint32_t len = base::LoadU32LE(buf_.data());
      if (len > kMaxFastFrameBytes) return Result::kClosed;
      if (buf_.size() >= 4 + size_t{len}) {
        bool ok = out->ParseFromArray(buf_.data() + 4, static_cast<int>(len));
        buf_.erase(0, 4 + size_t{len});
        return ok ? Result::kFrame : Result::kClosed;
      }
    }
    // The socket has SO_RCVTIMEO (set by DialFastPath): a blocking recv that gives up after the
    // slice, so the reader re-checks its state without an extra poll() per message.
    char buf[64 << 10];
    ssize_t k = recv(fd, buf, sizeof(buf), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Result::kNone;
    if (k <= 0) return Result::kClosed;
    buf_.append(buf, static_cast<size_t>(k));
  }
}

}  // namespace ember::store::client_internal
