// Key spaces of the layers above the store (emberd's records: jobs, nodes, allocations, ...) that
// an unauthenticated TCPStore listener must never reach: ember-store refuses a --tcpstore-prefix
// inside or above one of them. The store knows these names only as strings; runtime/job/keys.h
// owns their meaning, and daemon_unit_test checks that its kEmberdKeySpaces is this list.
// Thread-safe (constants).
#ifndef EMBER_RUNTIME_STORE_RESERVED_KEYS_H_
#define EMBER_RUNTIME_STORE_RESERVED_KEYS_H_

#include "absl/strings/string_view.h"

namespace ember::store {

inline constexpr absl::string_view kReservedKeySpaces[] = {
    "jobs/", "nodes/", "alloc/", "scheduler/", "submissions/", "joblist/", "active/"};

}  // namespace ember::store

#endif  // EMBER_RUNTIME_STORE_RESERVED_KEYS_H_
