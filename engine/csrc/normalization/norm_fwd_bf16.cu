/*
 * Norm forward instantiations for output dtype __nv_bfloat16 (see norm_fwd.cuh for the kernels' design).
 * One translation unit per output dtype so that a parallel build compiles them concurrently; each
 * holds the (x, residual) dtype pairs {f32/f32, f16/f16, f16/f32, bf16/bf16, bf16/f32} x
 * {register, blocked-vector, blocked-scalar} kernels.
 */
#include "normalization/norm_fwd_launch.cuh"

namespace engine {
namespace norm {

engine_status fwd_out_bf16(engine_dtype x_dtype, engine_dtype r_dtype, FwdArgs& a,
                          const LaunchCtx& ctx, bool* transposed) {
  return dispatch_fwd_xr<__nv_bfloat16>(x_dtype, r_dtype, a, ctx, transposed);
}

}  // namespace norm
}  // namespace engine
