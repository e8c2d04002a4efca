/*
 * Norm forward instantiations for FP8 outputs of a __nv_bfloat16 x (with x's own or an fp32 residual);
 * one of three units split by x dtype (see norm_fwd_fp8.cu).
 */
#include "normalization/norm_fwd_launch.cuh"

namespace engine {
namespace norm {

engine_status fwd_out_fp8_x_bf16(engine_dtype r_dtype, FwdArgs& a, const LaunchCtx& ctx,
                                 bool* transposed) {
  return dispatch_fwd_r<__nv_bfloat16, fp8>(r_dtype, a, ctx, transposed);
}

}  // namespace norm
}  // namespace engine
