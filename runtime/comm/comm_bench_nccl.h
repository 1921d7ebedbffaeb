// comm_bench --backend=nccl (issue 17): the NCCL figures one GPU can give, in comm_bench's report
// format. NCCL refuses two ranks on one device, so everything runs at world size 1 on cuda:0:
//   - all_reduce (f32, in place, ReduceOp avg) and all_gather (f32, out of place) from the smallest
//     to the largest size: time, algbw, busbw (nccl-tests' columns; busbw is 0 at one rank by
//     definition), beside cudaMemcpy device-to-device of the same bytes timed in the same run, and
//     algbw / copy bandwidth. Results are checked against the input before and after each size's
//     timed loops; a wrong result or a failed op fails the run.
//   - communicator creation: Create and the first all_reduce, eager `nccl` vs lazy `nccl-lazy`, two
//     rounds (the first pays NCCL's one-time process setup), and each communicator's memory as the
//     backend reports it (ProcessGroup::CommMemoryBytes).
//   - targets: algbw / copy bandwidth >= 0.8 for every size >= 64 MiB.
// Without a usable GPU (or in a build without NCCL) no figure is made up: the tables are empty with
// a note, and every target has value null, met false and the reason ("no CUDA device (...)" or
// "built without NCCL ...").
//
// Thread-compatible: call from one thread.
#ifndef EMBER_RUNTIME_COMM_COMM_BENCH_NCCL_H_
#define EMBER_RUNTIME_COMM_COMM_BENCH_NCCL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/report.h"

namespace ember::comm {

struct NcclBenchOptions {
  std::vector<int64_t> sizes;  // bytes, multiples of 4 (f32), ascending
  double loop_seconds = 0.05;  // target length of one timed loop
};

// Why this process cannot run the NCCL benchmark ("no CUDA device (<cudaGetDeviceCount's
// error>)", "built without NCCL ..."), or "" when cuda:0 is usable.
std::string NcclBenchUnavailableReason();

// Adds the tables, targets and meta described above to `report`. Returns an error (for
// report.Fail) when a GPU run failed or a result was wrong; OK otherwise, also when no GPU is
// usable (then the targets carry NcclBenchUnavailableReason()).
absl::Status RunNcclBench(const NcclBenchOptions& o, bench::Report& report);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_COMM_BENCH_NCCL_H_
