// Framing of the store client's fast-path socket (fast_path_protocol.h): u32le length, then a
// RequestBatch (client -> server) or ResponseBatch protobuf. Encoding requests straight into a
// frame, blocking sends, and a reader that keeps partial frames between calls.
//
// Thread-safety: the free functions are thread-safe; a FrameReader is used by one thread at a time
// (the connection's reader role).
#ifndef EMBER_RUNTIME_STORE_CLIENT_FRAMING_H_
#define EMBER_RUNTIME_STORE_CLIENT_FRAMING_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "proto/store.pb.h"

namespace ember::store::client_internal {

// Frames a RequestBatch without building one: BeginFrame reserves the length, AppendRequestField
// adds one request as field 1 of the batch (that is all a RequestBatch of requests is on the
// wire), EndFrame fills in the length.
void BeginFrame(std::string* frame);
void AppendRequestField(const v1::Request& req, std::string* frame);
void EndFrame(std::string* frame);

// One frame holding `batch`.
std::string FrameOf(const v1::RequestBatch& batch);

// send(2)s all of `data` (MSG_NOSIGNAL, retrying EINTR); false when the socket fails.
bool SendAll(int fd, absl::string_view data);

// Reads one frame from a blocking socket (the handshake only): false on EOF, error, a frame over
// kMaxFastFrameBytes, or no byte for `timeout_ms`.
bool ReadFrame(int fd, std::string* payload, int timeout_ms);

// Reads ResponseBatch frames from a socket with a receive timeout (SO_RCVTIMEO), keeping a partial
// frame for the next call.
class FrameReader {
 public:
  enum class Result {
    kFrame,   // *out holds the next batch
    kNone,    // no complete frame within the socket's receive timeout
    kClosed,  // EOF, error, an oversized frame or one that does not parse
  };
  Result ReadSome(int fd, v1::ResponseBatch* out);
  void Clear() { buf_.clear(); }

 private:
  std::string buf_;  // bytes read but not yet parsed
};

}  // namespace ember::store::client_internal

#endif  // EMBER_RUNTIME_STORE_CLIENT_FRAMING_H_
