"""The sm_70 fused MoE on HMMA.884 (moe/fused_sm70.py) against its twin, moe.naive.fused_moe.

CPU: every configuration compiles for sm_70 with m8n8k4 in its PTX (and for sm_90); the launcher's contract; which
path fused_moe takes on the sm_70 row (the switch CATENGINE_ARCH=70, set through arch.ARCH_OVERRIDE, which it
reads at call time). GPU (``-m gpu``; the H200 emulates m8n8k4): Qwen3.6-35B-A3B's MoE (E 256, top-8, H 2048,
I 512) at 8-512 tokens on both tiles, AWQ (asymmetric zeros, group 128) and compressed-tensors (symmetric zeros 8,
groups 32/64) experts, tails (experts, H and I not multiples of the 64-column tile), the fp16 sum past 65,504, and
the whole fused_moe under the switch.

Tolerance (TOL, test_fused_moe.py): the numerics are the tl.dot sorted path's: the weights dequantised to fp16
exactly as the twin's (q - z) * s rounded once, products exact in fp32, fp32 sums, silu(gate) * up stored in
fp16 (one rounding the twin does not make), the weighted rows and their sum in fp32: 2e-3 of the output norm. A
wrong fragment map, nibble, group row or gathered row gives O(1) errors.
"""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.common import arch
from catengine.kernels.common.aot import SM70_SHARED_LIMIT, compile_module
from catengine.kernels.common.mma884 import Tile884
from catengine.kernels.moe import fused as moe
from catengine.kernels.moe import fused_sm70
from catengine.kernels.moe import naive as reference
from catengine.kernels.w4a16.packing import QuantizedWeight

from .test_fused_moe import TOL, make_dense, make_experts, rel_err, routing

MODULE = "catengine.kernels.moe.fused_sm70"


@pytest.mark.parametrize("cc", [70, 90])
def test_fused_moe_sm70_compiles_to_mma884(cc):
    results = compile_module(MODULE, cc)
    assert len(results) == 4 * len(fused_sm70.SM70_MOE_TABLE)
    for r in results:
        assert r["gluon"] and r["mma884"], r
        if cc == 70:
            assert r["shared"] <= SM70_SHARED_LIMIT and not r["forbidden"], r
            assert r["sass_hmma884"] in (None, True), r


def _scaled_as(w: QuantizedWeight, dtype) -> QuantizedWeight:
    return QuantizedWeight(w.qweight, w.scales.to(dtype), w.zeros.to(dtype), w.group_size)


def _moe(e=6, hid=64, inter=64, group=32, dtype=torch.float16, t=20, k=2):
    w13 = make_experts(e, hid, 2 * inter, group, dtype)
    w2 = make_experts(e, inter, hid, group, dtype, seed=1)
    x = torch.randn(t, hid, generator=torch.Generator().manual_seed(2)).to(dtype)
    tw, ids = routing(t, e, k, seed=3)
    return x, w13, w2, tw, ids


def test_fused_moe_sm70_contract():
    x, w13, w2, tw, ids = _moe()
    f = fused_sm70.fused_moe_sm70
    with pytest.raises(KernelContractError, match="bf16"):          # bf16 does not exist on sm_70
        f(x.bfloat16(), w13, w2, tw, ids)
    with pytest.raises(KernelContractError, match="W4A16"):         # dense experts stay on tl.dot
        f(x, make_dense(6, 128, 64, torch.float16), make_dense(6, 64, 64, torch.float16), tw, ids)
    with pytest.raises(KernelContractError, match="group size 16"):
        x16, w13_16, w2_16, _, _ = _moe(group=16)
        f(x16, w13_16, w2_16, tw, ids)
    with pytest.raises(KernelContractError, match="scales"):
        f(x, _scaled_as(w13, torch.float32), w2, tw, ids)
    with pytest.raises(KernelContractError, match="one MoE"):       # H of x is not w13's K
        f(x[:, :32], w13, w2, tw, ids)
    with pytest.raises(KernelContractError, match="one MoE"):       # w2 is not [E, I//8, H]
        f(x, w13, make_experts(6, 64, 96, 32, torch.float16), tw, ids)
    with pytest.raises(KernelContractError, match="CUDA"):          # CPU: no Gluon interpreter
        f(x, w13, w2, tw, ids)
    with pytest.raises(KernelContractError, match="power of two"):
        fused_sm70.fused_moe_sm70(x, w13, w2, tw, ids, config=Tile884(24, 64, 32, 1, 4))


def test_sm70_table_picks_tiles_by_rows_per_expert():
    """BM 16 up to 16 rows per expert on average (35B-A3B's 256 experts x top-8 up to 512 tokens), 64 above."""
    from catengine.kernels.common.mma884 import pick_tile
    assert pick_tile(fused_sm70.SM70_MOE_TABLE, -(-512 * 8 // 256)).BM == 16
    assert pick_tile(fused_sm70.SM70_MOE_TABLE, -(-513 * 8 // 256)).BM == 64
    for _, c in fused_sm70.SM70_MOE_TABLE:
        c.check()
        assert c.BK <= min(fused_sm70.GROUPS)


def test_hmma_moe_applies(monkeypatch):
    x, w13, w2, _, _ = _moe()
    assert not fused_sm70.hmma_moe_applies(x, w13, w2)          # the interpreter runs this test
    monkeypatch.setattr(fused_sm70, "INTERPRET", False)
    assert fused_sm70.hmma_moe_applies(x, w13, w2)
    assert not fused_sm70.hmma_moe_applies(x.bfloat16(), w13, w2)
    assert not fused_sm70.hmma_moe_applies(x, _scaled_as(w13, torch.bfloat16), w2)
    assert not fused_sm70.hmma_moe_applies(x, make_dense(6, 128, 64, torch.float16), w2)
    _, w13_16, w2_16, _, _ = _moe(group=16)
    assert not fused_sm70.hmma_moe_applies(x, w13_16, w2_16)


def _record(monkeypatch):
    """fused_moe's HMMA.884 call replaced by the twin, recording that it was made."""
    calls = []
    monkeypatch.setattr(fused_sm70, "INTERPRET", False)
    monkeypatch.setattr(moe, "fused_moe_sm70", lambda *a, **k: calls.append(1) or reference.fused_moe(*a))
    return calls


@pytest.mark.parametrize("arch_row,t,dtype,quant,group,taken", [
    ("70", 20, torch.float16, True, 32, True),       # 40 rows > row_max 32: the sorted path, on HMMA.884
    ("70", 20, torch.float16, True, 128, True),
    ("70", 2, torch.float16, True, 32, False),       # 4 rows: the decode GEMV stays
    ("70", 20, torch.float16, True, 16, False),      # a group the kernel does not tile: tl.dot
    ("70", 20, torch.float16, False, 0, False),      # dense experts: tl.dot
    ("70", 20, torch.float32, True, 32, False),      # fp32 activations never reach a GPU kernel path
    ("80", 20, torch.float16, True, 32, False),      # sm_80 and sm_90 keep tl.dot
    ("", 20, torch.float16, True, 32, False),
])
def test_sm70_row_dispatch(monkeypatch, arch_row, t, dtype, quant, group, taken):
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", arch_row)
    calls = _record(monkeypatch)
    e, hid, inter = 6, 128, 128
    if quant:
        w13 = make_experts(e, hid, 2 * inter, group, torch.float16)
        w2 = make_experts(e, inter, hid, group, torch.float16, seed=1)
    else:
        w13, w2 = make_dense(e, 2 * inter, hid, torch.float16), make_dense(e, hid, inter, torch.float16, seed=1)
    x = torch.randn(t, hid, generator=torch.Generator().manual_seed(2)).to(dtype)
    tw, ids = routing(t, e, 2, seed=3)
    if dtype == torch.float32:
        with pytest.raises(Exception, match="float16 or bfloat16"):
            moe.fused_moe(x, w13, w2, tw, ids)
        assert not calls
        return
    y = moe.fused_moe(x, w13, w2, tw, ids)
    assert bool(calls) == taken
    assert rel_err(y, reference.fused_moe(x, w13, w2, tw, ids)) < TOL[torch.float16]


def test_only_sm70_row_asks_for_hmma():
    assert moe.TABLES["sm70"].hmma and not moe.TABLES["sm80"].hmma and not moe.TABLES["sm90"].hmma


# ----------------------------------------------------------------------------- GPU
def gpu_check(t, e, k, hid, inter, group, symmetric, config=None, seed=0, scale_down=1.0, x_scale=1.0, fn=None):
    """fn(x, w13, w2, tw, ids) (default: fused_moe_sm70 on ``config``) against the twin, overall and per token."""
    w13 = make_experts(e, hid, 2 * inter, group, torch.float16, symmetric, "cuda", seed)
    w2 = make_experts(e, inter, hid, group, torch.float16, symmetric, "cuda", seed + 1)
    if scale_down != 1.0:
        w2 = QuantizedWeight(w2.qweight, w2.scales * scale_down, w2.zeros, w2.group_size)
    x = (torch.randn(t, hid, generator=torch.Generator("cuda").manual_seed(seed + 2), device="cuda")
         * x_scale).half()
    tw, ids = routing(t, e, k, "cuda", seed + 3)
    y = (fn or (lambda *a: fused_sm70.fused_moe_sm70(*a, config=config)))(x, w13, w2, tw, ids)
    ref = reference.fused_moe(x, w13, w2, tw, ids)
    assert y.dtype == torch.float32
    assert rel_err(y, ref) < TOL[torch.float16], rel_err(y, ref)
    # per token too: a wrongly gathered or dropped row (a padding boundary, an expert's last block) spoils one
    # token, which the norm over thousands of tokens would dilute; a correct row's error is the same fp16 rounding
    # of silu(gate) * up: the tl.dot twin (same numerics) in the interpreter at the tail and overflow shapes gave
    # 3.5e-4 to 4.3e-4 overall and at most 8.8e-4 for a single token (64-160 features), 11 x inside 5 x TOL
    row_err = (y - ref).norm(dim=1) / ref.norm(dim=1)
    assert row_err.max() < 5 * TOL[torch.float16], (row_err.max(), row_err.argmax())
    return ref


BM16, BM64 = fused_sm70.SM70_MOE_TABLE[0][1], fused_sm70.SM70_MOE_TABLE[1][1]


@pytest.mark.gpu
@pytest.mark.parametrize("t,group,symmetric,config", [
    (8, 128, False, None),          # AWQ, 64 rows on 256 experts: BM 16, most blocks one row
    (64, 32, True, None),           # compressed-tensors group 32
    (200, 64, True, None),          # compressed-tensors group 64
    (512, 128, False, None),        # 16 rows per expert: the last BM 16 bucket
    (512, 128, False, BM64),        # the prefill tile at the same rows
    (96, 32, False, BM64),
], ids=lambda v: str(v) if not isinstance(v, Tile884) else f"BM{v.BM}")
def test_gpu_35b_a3b_sm70(t, group, symmetric, config):
    gpu_check(t, 256, 8, 2048, 512, group, symmetric, config, seed=t)


@pytest.mark.gpu
@pytest.mark.parametrize("t,e,k,hid,inter,group,config", [
    (37, 10, 8, 160, 96, 32, BM16),      # H 160 and I 96: 2.5 and 1.5 tiles of 64 columns; top-8 of 10 experts
    (37, 10, 8, 160, 96, 32, BM64),
    (130, 37, 4, 192, 128, 64, BM64),    # 37 experts, ~14 rows each: padded blocks, some experts empty
    (9, 5, 3, 384, 256, 128, BM16),      # top-3, K of 3 groups of 128
], ids=lambda v: str(v) if not isinstance(v, Tile884) else f"BM{v.BM}")
def test_gpu_tails_sm70(t, e, k, hid, inter, group, config):
    gpu_check(t, e, k, hid, inter, group, False, config, seed=e)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [BM16, BM64], ids=["BM16", "BM64"])
def test_gpu_fp16_sum_past_65504_sm70(config):
    """fp16 activations whose expert outputs and weighted sum pass 65,504 (the V100 case: no bf16): the weighted
    rows and their sum stay fp32 (x 30, down scales x 120: silu(gate) * up stays in the thousands)."""
    ref = gpu_check(20, 6, 2, 64, 64, 32, False, config, scale_down=120.0, x_scale=30.0)
    assert ref.abs().max() > 65504


@pytest.mark.gpu
@pytest.mark.parametrize("t", [2, 64, 300])       # decode GEMV, BM 16, BM 64
def test_gpu_fused_moe_under_arch70(monkeypatch, t):
    """The whole fused_moe (through kernels.ops) under the switch, as a V100 would run it: routing on the sm_70 row,
    the HMMA.884 kernel reached from 32 rows on, the result the twin's."""
    from catengine.kernels import ops
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "70")
    assert moe.device_key(torch.device("cuda")) == ("sm70", 80)
    calls = []
    real = moe.fused_moe_sm70
    monkeypatch.setattr(moe, "fused_moe_sm70", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    w13 = make_experts(256, 2048, 1024, 128, torch.float16, device="cuda", seed=t)
    w2 = make_experts(256, 512, 2048, 128, torch.float16, device="cuda", seed=t + 1)
    x = torch.randn(t, 2048, generator=torch.Generator("cuda").manual_seed(t), device="cuda").half()
    tw, ids = ops.moe_route(torch.randn(t, 256, device="cuda").half(), 8, True)
    y = ops.fused_moe(x, w13, w2, tw, ids)
    assert bool(calls) == (t * 8 > moe.TABLES["sm70"].row_max)
    assert rel_err(y, reference.fused_moe(x, w13, w2, tw, ids)) < TOL[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("t", [64, 512])
def test_gpu_35b_a3b_sm70_expert_parallel(t):
    """The HMMA.884 sorted path with expert parallelism (ids -1 for the other ranks' experts, left out by
    align_tokens and combine_kernel)."""
    from .test_fused_moe import expert_parallel_gpu
    expert_parallel_gpu(fused_sm70.fused_moe_sm70, t, torch.float16, True)
