// f32 <-> bf16 / f16 casts of kernel buffers, split over the thread pool. The element conversions
// (round to nearest even, NaN stays NaN, f16 subnormals exact) and the vectorised single-thread
// casts are runtime/base/dtype.h's; the scalar functions are re-exported here for kernel code.
// Elements are raw uint16 bits. Thread safety: pure functions.
#ifndef EMBER_KERNELS_CAST_H_
#define EMBER_KERNELS_CAST_H_

#include <cstdint>

#include "kernels/exec_context.h"
#include "runtime/base/dtype.h"

namespace ember::kernels {

using base::Bf16ToF32;
using base::F16ToF32;
using base::F32ToBf16;
using base::F32ToF16;

// Bulk casts over n elements, split over the pool.
void CastF32ToBf16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n);
void CastBf16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n);
void CastF32ToF16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n);
void CastF16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n);

}  // namespace ember::kernels

#endif  // EMBER_KERNELS_CAST_H_
