// Constants of the store's plain-TCP fast path, shared by server (fast_path.h) and client.
// Frame: u32 little-endian length, then a RequestBatch (client->server) or ResponseBatch protobuf.
#ifndef EMBER_RUNTIME_STORE_FAST_PATH_PROTOCOL_H_
#define EMBER_RUNTIME_STORE_FAST_PATH_PROTOCOL_H_

#include <cstdint>

namespace ember::store {

// Frames above this size close the connection.
constexpr uint32_t kMaxFastFrameBytes = 256u << 20;
// The message of the single response that acknowledges a successful handshake.
constexpr char kFastPathHello[] = "ember-store fast path v1";

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_FAST_PATH_PROTOCOL_H_
