"""The split backward's variants on the GPU (lag, num_stages, programs per SM, slices), each
checked against an fp32 reference and timed (the backward alone, % of copy). NOTES P72:

    python3 ci/split_exp.py      # on the GPU machine, repository root
"""
import sys, torch, triton
sys.path.insert(0, ".")
from engine.triton_kernels import norms as nm
from engine.triton_kernels.norms_common import NormConfig
from benchmarks import harness as H
copy = H.copy_bandwidth(None)["gbps"]
print("copy", copy)
def run(is_rms, n, lag, stages, pps, sl, w, hold=True):
    nm.SPLIT_LAG, nm.SPLIT_PROGRAMS_PER_SM, nm.SPLIT_HOLD_G = lag, pps, hold
    m = (64 << 20) // n
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w_ = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    xf = x.float()
    mu = None if is_rms else xf.mean(1)
    xc = xf if is_rms else xf - mu[:, None]
    rs = torch.rsqrt((xc * xc).mean(1) + 1e-5)
    xhat = xc * rs[:, None]
    dyg = dy.float() * w_.float()
    c2 = (dyg * xhat).mean(1, keepdim=True); c1 = 0 if is_rms else dyg.mean(1, keepdim=True)
    dxr = rs[:, None] * (dyg - xhat * c2 - c1)
    dx = torch.full_like(x, float("nan")); dw = torch.full((n,), float("nan"), device="cuda")
    db = None if is_rms else torch.full((n,), float("nan"), device="cuda")
    cfg = None if sl is None else NormConfig(1, sl, False, w, pps, stages, split=True)
    f = lambda: nm.launch_bwd(dy, x, mu, rs, w_, None, dx, None, dw, db, is_rms_norm=is_rms,
                              zero_centered_gamma=False, sm_margin=0, config=cfg)
    try:
        f(); torch.cuda.synchronize()
    except Exception as e:
        print(f"{'rms' if is_rms else 'ln'} {n} lag{lag} s{stages} p{pps} {sl}x{w} hold{int(hold)}: ERROR {str(e)[:200]}", flush=True); return
    err = (dx.float() - dxr).abs().max().item()
    dwe = ((dw - (dy.float() * xhat).sum(0)).abs().max() / (dy.float() * xhat).sum(0).abs().max()).item()
    ms = triton.testing.do_bench(f, warmup=5, rep=30)
    gbps = 3 * m * n * 2 / ms / 1e6
    print(f"{'rms' if is_rms else 'ln'} {n:6d} lag{lag} s{stages} p{pps} {str(sl or 'default'):>7s}x{w:2d} hold{int(hold)}: dx err {err:.3g} dw rel {dwe:.3g}  {ms*1e3:7.1f} us  {100*gbps/copy:5.1f} %", flush=True)
# (lag, num_stages, programs per SM, slice (None: the default config of the width), warps, gamma held)
VARIANTS = [(2, 3, 1, None, 8, True), (2, 3, 1, 8192, 8, False), (2, 3, 1, 4096, 8, False),
            (2, 3, 1, 4096, 4, False), (2, 3, 1, 2048, 4, False)]
WIDTHS = (16384,)
if len(sys.argv) > 1 and sys.argv[1] == "--narrow":  # G = 1 (the slice is the row) and 2 at 4K-8K
    VARIANTS = [(2, 3, 1, None, 8, True), (2, 3, 1, 8192, 8, False), (2, 3, 1, 8192, 8, True),
                (2, 3, 1, 4096, 8, False), (2, 3, 1, 4096, 4, False), (2, 3, 1, 4096, 4, True),
                (2, 3, 1, 2048, 4, False)]
    WIDTHS = (4096, 8192)
if len(sys.argv) > 1 and sys.argv[1] == "--session23":  # the sweeps of NOTES P72 and P74
    VARIANTS = [(1, 3, 1, 8192, 8, True), (1, 1, 1, 8192, 8, True), (2, 1, 1, 8192, 8, True),
                (2, 3, 1, 8192, 8, True), (1, 3, 2, 8192, 8, True), (1, 3, 2, 4096, 4, True),
                (1, 3, 2, 8192, 4, True), (2, 1, 2, 8192, 8, True), (2, 1, 1, 8192, 16, True),
                (2, 1, 1, 16384, 16, True), (2, 3, 1, 8192, 8, False), (2, 3, 1, 8192, 16, False),
                (2, 3, 1, 16384, 16, False), (2, 3, 2, 4096, 8, False), (2, 3, 1, 4096, 8, False)]
    WIDTHS = (32768, 131072)
for is_rms in (True, False):
    for n in WIDTHS:
        for v in VARIANTS:
            run(is_rms, n, *v)
