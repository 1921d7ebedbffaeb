#include "kernels/cast.h"

namespace ember::kernels {

namespace {
template <typename In, typename Out>
void CastLoop(const ExecContext& ctx, const In* in, Out* out, int64_t n,
              void (*cast)(const In*, Out*, size_t)) {
  auto body = [&](int64_t b, int64_t e) { cast(in + b, out + b, static_cast<size_t>(e - b)); };
  if (ctx.pool) ctx.pool->ParallelFor(n, 1 << 16, body); else body(0, n);
}
}  // namespace

void CastF32ToBf16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n) {
  CastLoop(ctx, in, out, n, base::CastF32ToBf16);
}
void CastBf16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n) {
  CastLoop(ctx, in, out, n, base::CastBf16ToF32);
}
void CastF32ToF16(const ExecContext& ctx, const float* in, uint16_t* out, int64_t n) {
  CastLoop(ctx, in, out, n, base::CastF32ToF16);
}
void CastF16ToF32(const ExecContext& ctx, const uint16_t* in, float* out, int64_t n) {
  CastLoop(ctx, in, out, n, base::CastF16ToF32);
}

}  // namespace ember::kernels
