/*
 * Norm backward instantiations for x (z) dtype float (see norm_bwd.cuh for the kernels' design):
 * dy in {f32, f16, bf16} x {register, blocked-vector, blocked-scalar} kernels. The dtypes of dx,
 * dres / dresidual and the weight are run-time switches inside the kernels.
 */
#include "normalization/norm_bwd.cuh"

namespace engine {
namespace norm {

engine_status bwd_x_f32(engine_dtype dy_dtype, BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas,
                        int* num_ctas) {
  return dispatch_bwd_dy<float>(dy_dtype, a, ctx, max_ctas, num_ctas);
}

}  // namespace norm
}  // namespace engine
