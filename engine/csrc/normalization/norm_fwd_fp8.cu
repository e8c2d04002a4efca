/*
 * Norm forward for FP8 outputs: the dispatch over x's dtype. The instantiations are split by x
 * dtype over three translation units (norm_fwd_fp8_x*.cu), so that a parallel build compiles them
 * concurrently: the FP8 forward (register, blocked, streamed and band kernels, each in its
 * current-scaling and transposed forms) was the build's longest unit, about 320 s on its own.
 */
#include "normalization/norm_common.cuh"

namespace engine {
namespace norm {

engine_status fwd_out_fp8(engine_dtype x_dtype, engine_dtype r_dtype, FwdArgs& a,
                          const LaunchCtx& ctx, bool* transposed) {
  switch (x_dtype) {
    case ENGINE_DTYPE_FLOAT32:
      return fwd_out_fp8_x_f32(r_dtype, a, ctx, transposed);
    case ENGINE_DTYPE_FLOAT16:
      return fwd_out_fp8_x_f16(r_dtype, a, ctx, transposed);
    case ENGINE_DTYPE_BFLOAT16:
      return fwd_out_fp8_x_bf16(r_dtype, a, ctx, transposed);
    default:
      break;
  }
  return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm forward: unsupported x dtype %s",
                   dtype_name(x_dtype));
}

}  // namespace norm
}  // namespace engine
