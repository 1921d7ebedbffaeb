// Element types and reduction operators of the communication layer, plus the scalar kernels that
// combine two buffers. Pure functions; thread-safe. The element type is the runtime's one enum
// (runtime/base/dtype.h: names, sizes and the 16-bit float conversions live there).
//
//   comm::Reduce(dst, src, count, DataType::kBF16, ReduceOp::kSum);   // dst[i] = dst[i] + src[i]
//
// 16-bit floats (bf16, f16) are widened to f32, combined, and rounded (round-to-nearest-even) once
// per call. Reduce combines two buffers, so a chain of calls (a ring or tree of 2-input hops, as the
// TCP path and NCCL's ring run) rounds every partial sum to 16 bits: the error grows with the number
// of hops (see docs/comm.md for the bound). ReduceMany combines all inputs at once in f32 and rounds
// once (the shared-memory path, where a rank can read every peer's input in place).
#ifndef EMBER_RUNTIME_COMM_TYPES_H_
#define EMBER_RUNTIME_COMM_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/base/dtype.h"

namespace ember::comm {

using DataType = base::DType;
using base::DTypeName;  // "f32", "bf16", ...
using base::DTypeSize;
enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin, kProduct };

// The element types the reducing collectives (Reduce, ReduceMany, FinishAvg) support; the others
// only move bytes (p2p, all_gather, broadcast, all_to_all take any DataType).
constexpr DataType kAllDataTypes[] = {DataType::kF32, DataType::kBF16, DataType::kF16,
                                      DataType::kF64, DataType::kI32,  DataType::kI64,
                                      DataType::kU8};
constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                      ReduceOp::kMin, ReduceOp::kProduct};

const char* ReduceOpName(ReduceOp op);  // "sum", "avg", ...
// One of kAllDataTypes by DTypeName; INVALID_ARGUMENT otherwise.
absl::StatusOr<DataType> ParseDataType(absl::string_view name);
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);
// Whether t is one of kAllDataTypes.
bool IsReducible(DataType t);

// For the three functions below, t must be one of kAllDataTypes (others: no-op).
// dst[i] = op(dst[i], src[i]) for i < count. kAvg combines like kSum (the division happens once,
// at the end, through Scale). Integer sum/product wrap around (two's complement).
void Reduce(void* dst, const void* src, size_t count, DataType t, ReduceOp op);

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]), combined in index order (so every
// rank that reduces the same inputs gets bitwise the same result). With avg_n > 0 the result is
// divided by avg_n before it is stored (16-bit floats: in f32, before the single rounding;
// integers: truncating). dst may be one of the sources (same address); no other overlap.
void ReduceMany(void* dst, const void* const* srcs, int nsrc, size_t count, DataType t,
                ReduceOp op, int avg_n = 0);

// Finishes an average over `n` contributions: buf[i] /= n (integers: truncating division).
void FinishAvg(void* buf, size_t count, DataType t, int n);

}  // namespace ember::comm

#endif  // EMBER_RUNTIME_COMM_TYPES_H_
