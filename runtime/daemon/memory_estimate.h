// A job's memory per rank, estimated from its spec at submit so that a model or batch that cannot
// fit is refused with the numbers instead of failing at run time (`AlignedAlloc: out of memory`).
// An estimate of the FSDP GPT worker's big buffers (fp32), not a measurement: it errs low (no
// allocator slack, no per-op scratch), so a job it refuses surely does not fit. Thread-safe (pure).
#ifndef EMBER_RUNTIME_DAEMON_MEMORY_ESTIMATE_H_
#define EMBER_RUNTIME_DAEMON_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job_spec.pb.h"
#include "proto/jobs.pb.h"

namespace ember::daemon {

struct MemoryEstimate {
  int64_t params = 0;             // parameter count
  int64_t state_bytes = 0;        // this rank's shard of weights, gradients, AdamW m and v
  int64_t gathered_bytes = 0;     // the largest layer's full weights and gradients, gathered
  int64_t activation_bytes = 0;   // saved activations and logits of one micro-batch
  int64_t per_rank() const { return state_bytes + gathered_bytes + activation_bytes; }
  std::string ToString() const;   // "3.1 GiB per rank (1.2 B parameters: ...)"
};

// For a job of `world` ranks (a defaulted, validated spec: spec::ParseJobSpec).
MemoryEstimate EstimateMemory(const spec::v1::JobSpec& spec, int world);

// OK when the ranks fit some node's memory: CPU ranks share a node's RAM (memory_total_bytes),
// at ceil(world / nodes with `kind` devices) ranks on each, or resources.devices_per_node; a CUDA
// rank has its GPU's memory (skipped when no node reports it). Else FAILED_PRECONDITION (as for a
// gang that can never be placed) with the estimate and the memory it was compared with.
absl::Status CheckMemoryFits(const spec::v1::JobSpec& spec, int world, const std::string& kind,
                             const std::vector<jobs::v1::Node>& nodes);

}  // namespace ember::daemon

#endif  // EMBER_RUNTIME_DAEMON_MEMORY_ESTIMATE_H_
