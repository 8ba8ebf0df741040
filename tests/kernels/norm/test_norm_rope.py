"""rms_norm, gated_rms_norm, silu_mul, qk_norm_rope (Triton) against their twins in norm/naive.py.

Tolerances: outputs are rounded to fp16/bf16 after fp32 math; the kernels reduce in another order and
use the hardware's approximate rsqrt/exp, so a value may land one unit in the last place of the output
dtype away from the twin (and never further): atol/rtol of one such unit."""
import os

import pytest
import torch

from catengine.kernels.norm import naive as ref
from catengine.kernels.norm import norm_rope as tri

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ULP = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7, torch.float32: 1e-6}
# Triton's interpreter casts fp32 -> bf16 by truncation where the GPU rounds to nearest even, so under
# the interpreter a bf16 result may sit one bf16 unit from the twin even where the GPU is bit-exact.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _close(got, want, dtype, what):
    got, want = got.cpu().float(), want.float()
    assert torch.isfinite(got).all(), f"{what}: non-finite output"
    # under the interpreter a truncated bf16 intermediate (e.g. the residual sum) adds one more unit
    tol = ULP[dtype] * (2 if dtype == torch.bfloat16 and INTERPRETED else 1)
    bad = ~torch.isclose(got, want, rtol=tol, atol=tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} elements off, max err {(got - want).abs().max():.3g}"


def _rand(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t,h", [(3, 40), (5, 256), (1, 1000)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, t, h, with_residual):
    gen = torch.Generator().manual_seed(t * h)
    x = _rand(t, h, dtype=dtype, gen=gen, scale=3.0)
    w = _rand(h, dtype=dtype, gen=gen, scale=0.1)
    r = _rand(t, h, dtype=dtype, gen=gen) if with_residual else None
    want = ref.rms_norm(x, w, 1e-6, r)
    got = tri.rms_norm(x.to(DEV), w.to(DEV), 1e-6, None if r is None else r.to(DEV))
    if with_residual:
        _close(got[0], want[0], dtype, "rms_norm y")
        if dtype == torch.bfloat16 and INTERPRETED:
            _close(got[1], want[1], dtype, "rms_norm residual sum")
        else:
            assert torch.equal(got[1].cpu(), want[1]), "residual sum must be bit-exact (one rounding of x + r)"
    else:
        _close(got, want, dtype, "rms_norm")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("x_fp32", [False, True], ids=["x-model", "x-fp32"])
@pytest.mark.parametrize("t,h", [(3, 40), (2, 1000)])
def test_rms_norm_fp32_stream(dtype, x_fp32, t, h):
    """The fp32 residual stream of fp16 models (catengine.models.layers.residual_dtype), x in the model
    dtype (a mixer's output) or fp32 (the MoE block's unrounded sum), values and sums past fp16's
    65,504: s stays fp32 (bit-exact: one fp32 add in both), y has the weight's dtype and is finite."""
    gen = torch.Generator().manual_seed(t * h + x_fp32)
    x = _rand(t, h, dtype=torch.float32 if x_fp32 else dtype, gen=gen, scale=3e4 if x_fp32 else 3.0)
    r = _rand(t, h, dtype=torch.float32, gen=gen, scale=5e4)
    w = _rand(h, dtype=dtype, gen=gen, scale=0.1)
    assert (x.float() + r).abs().max() > 65504    # the stream an fp16 sum could not hold
    want = ref.rms_norm(x, w, 1e-6, r)
    got = tri.rms_norm(x.to(DEV), w.to(DEV), 1e-6, r.to(DEV))
    assert got[0].dtype == want[0].dtype == dtype and got[1].dtype == want[1].dtype == torch.float32
    _close(got[0], want[0], dtype, "rms_norm y")
    assert torch.equal(got[1].cpu(), want[1]), "the fp32 residual sum must be bit-exact (one fp32 add)"


def test_rms_norm_fp32_x_model_stream():
    """bf16 models keep a bf16 stream while x may be the MoE block's fp32 output: s is rounded once, to
    bf16, from the fp32 sum (under the interpreter by truncation, hence _close there)."""
    gen = torch.Generator().manual_seed(11)
    x, r = _rand(4, 256, dtype=torch.float32, gen=gen, scale=3.0), _rand(4, 256, dtype=torch.bfloat16, gen=gen)
    w = _rand(256, dtype=torch.bfloat16, gen=gen, scale=0.1)
    want = ref.rms_norm(x, w, 1e-6, r)
    got = tri.rms_norm(x.to(DEV), w.to(DEV), 1e-6, r.to(DEV))
    assert got[0].dtype == got[1].dtype == torch.bfloat16
    _close(got[0], want[0], torch.bfloat16, "rms_norm y")
    _close(got[1], want[1], torch.bfloat16, "rms_norm residual sum")


@pytest.mark.parametrize("cfg", [tri.RowLaunch(4, 2), tri.RowLaunch(2, 4)], ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_rows_per_program(cfg, with_residual):
    """Several rows per program (the benchmark's sweep candidates), 5 rows: a partial last program."""
    gen = torch.Generator().manual_seed(cfg.block_r)
    x = _rand(5, 40, dtype=torch.float16, gen=gen, scale=3.0)
    w = _rand(40, dtype=torch.float16, gen=gen, scale=0.1)
    r = _rand(5, 40, dtype=torch.float16, gen=gen) if with_residual else None
    want = ref.rms_norm(x, w, 1e-6, r)
    got = tri.rms_norm_with(x.to(DEV), w.to(DEV), 1e-6, None if r is None else r.to(DEV), cfg=cfg)
    if with_residual:
        _close(got[0], want[0], torch.float16, "rms_norm y")
        assert torch.equal(got[1].cpu(), want[1]), "residual sum must be bit-exact (one rounding of x + r)"
    else:
        _close(got, want, torch.float16, "rms_norm")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [tri.RowLaunch(16), tri.RowLaunch(4), tri.RowLaunch(8, 2), tri.RowLaunch(4, 2)],
                         ids=str)
def test_gpu_rms_norm_sweep_candidates(cfg):
    """The rms_norm launches bench_attention --sweep times, on the 27B hidden size with a partial last program."""
    gen = torch.Generator().manual_seed(2)
    x, r = _rand(301, 5120, dtype=torch.float16, gen=gen, scale=3), _rand(301, 5120, dtype=torch.float16, gen=gen)
    w = _rand(5120, dtype=torch.float16, gen=gen, scale=0.1)
    _close(tri.rms_norm_with(x.cuda(), w.cuda(), 1e-6, cfg=cfg), ref.rms_norm(x, w, 1e-6), torch.float16, "rms_norm")
    y, s = tri.rms_norm_with(x.cuda(), w.cuda(), 1e-6, r.cuda(), cfg=cfg)
    wy, ws = ref.rms_norm(x, w, 1e-6, r)
    _close(y, wy, torch.float16, "rms_norm + residual")
    assert torch.equal(s.cpu(), ws)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,hv,dv", [(3, 4, 32), (2, 3, 128), (1, 5, 24)])
def test_gated_rms_norm(dtype, t, hv, dv):
    gen = torch.Generator().manual_seed(t + hv + dv)
    x = _rand(t, hv, 2 * dv, dtype=dtype, gen=gen, scale=2.0)[..., :dv]  # strided view, as in the model
    z = _rand(t, hv, dv, dtype=dtype, gen=gen, scale=2.0)
    w = _rand(dv, dtype=dtype, gen=gen)
    _close(tri.gated_rms_norm(x.to(DEV), z.to(DEV), w.to(DEV), 1e-6), ref.gated_rms_norm(x, z, w, 1e-6),
           dtype, "gated_rms_norm")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,inter", [(3, 100), (2, 2500)])
def test_silu_mul(dtype, t, inter):
    gen = torch.Generator().manual_seed(inter)
    x = _rand(t, 2 * inter, dtype=dtype, gen=gen, scale=4.0)
    _close(tri.silu_mul(x.to(DEV)), ref.silu_mul(x), dtype, "silu_mul")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nh,nkv,d,rot,arch", [(6, 2, 64, 16, None), (4, 1, 32, 32, None), (3, 3, 128, 32, None),
                                               (6, 2, 64, 16, 70), (6, 2, 64, 16, 90)])
def test_qk_norm_rope(dtype, nh, nkv, d, rot, arch):
    """arch: that table row's launch (rows per program over a partial last program), not the device's."""
    gen = torch.Generator().manual_seed(nh * d + rot)
    t = 5
    # q as the per-head [q | gate] interleave of q_proj's output: a strided view
    q = _rand(t, nh, 2 * d, dtype=dtype, gen=gen, scale=2.0)[..., :d]
    k = _rand(t, nkv, d, dtype=dtype, gen=gen, scale=2.0)
    qw, kw = _rand(d, dtype=dtype, gen=gen, scale=0.1), _rand(d, dtype=dtype, gen=gen, scale=0.1)
    cs = ref.rope_cos_sin_cache(4096, rot, 1e7)
    pos = torch.tensor([0, 7, 4095, 1000, 3], dtype=torch.int64)
    want_q, want_k = ref.qk_norm_rope(q, k, qw, kw, pos, cs, 1e-6)
    cfg = tri.TABLE[arch]["qk"] if arch else None
    got_q, got_k = tri.qk_norm_rope_with(q.to(DEV), k.to(DEV), qw.to(DEV), kw.to(DEV), pos.to(DEV), cs.to(DEV), 1e-6,
                                         cfg=cfg)
    _close(got_q, want_q, dtype, "qk_norm_rope q")
    _close(got_k, want_k, dtype, "qk_norm_rope k")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_small_ops_gpu_real_shapes(dtype):
    gen = torch.Generator().manual_seed(1)
    t = 300
    x, r = _rand(t, 5120, dtype=dtype, gen=gen, scale=3), _rand(t, 5120, dtype=dtype, gen=gen)
    w = _rand(5120, dtype=dtype, gen=gen, scale=0.1)
    y, s = tri.rms_norm(x.cuda(), w.cuda(), 1e-6, r.cuda())
    wy, ws = ref.rms_norm(x, w, 1e-6, r)
    _close(y, wy, dtype, "rms_norm")
    assert torch.equal(s.cpu(), ws)
    xg, zg, wg = (_rand(t, 48, 128, dtype=dtype, gen=gen), _rand(t, 48, 128, dtype=dtype, gen=gen),
                  _rand(128, dtype=dtype, gen=gen))
    _close(tri.gated_rms_norm(xg.cuda(), zg.cuda(), wg.cuda(), 1e-6), ref.gated_rms_norm(xg, zg, wg, 1e-6),
           dtype, "gated")
    xs = _rand(t, 2 * 17408, dtype=dtype, gen=gen, scale=4)
    _close(tri.silu_mul(xs.cuda()), ref.silu_mul(xs), dtype, "silu_mul")
    q = _rand(t, 24, 512, dtype=dtype, gen=gen, scale=2)[..., :256]
    k = _rand(t, 4, 256, dtype=dtype, gen=gen, scale=2)
    qw, kw = _rand(256, dtype=dtype, gen=gen, scale=0.1), _rand(256, dtype=dtype, gen=gen, scale=0.1)
    cs = ref.rope_cos_sin_cache(262144, 64, 1e7)
    pos = torch.randint(0, 262144, (t,), generator=gen)
    gq, gk = tri.qk_norm_rope(q.cuda(), k.cuda(), qw.cuda(), kw.cuda(), pos.cuda(), cs.cuda(), 1e-6)
    wq, wk = ref.qk_norm_rope(q, k, qw, kw, pos, cs, 1e-6)
    _close(gq, wq, dtype, "q")
    _close(gk, wk, dtype, "k")
