"""MoE routing and routed experts (catengine.kernels.moe.fused) against their torch twins.

CPU: the Triton interpreter on tiny shapes: the W4A16 decode path (catengine.kernels.moe.decode,
split and unsplit K, its arrival counters), the row path (dense experts, and W4A16 without a decode
entry) and the sorted path with each GEMM tile height of the table, quantised (asymmetric and
symmetric zeros, each group size) and dense experts, fp16 and bf16, experts that receive no token,
feature counts that are not multiples of the tiles. GPU (-m gpu): Qwen3.6-35B-A3B's MoE (E 256, top-8,
I 512, H 2048), the decode path replayed from a CUDA graph, with programmatic dependent launches.

Tolerance on ||y - ref|| / ||ref||: the twin keeps the intermediate silu(gate) * up in fp32, the
kernels store it in the activation dtype (it feeds a tensor-core product), and the sorted path also
stores each expert's weighted output in bf16 before the top-k sum (in fp32 for fp16). Each adds one
rounding of the activation dtype (the output is fp32 in both, never rounded to it): 2e-3 for fp16,
1.5e-2 for bf16 (8 significant bits, three roundings of ~2e-3 rms each plus the dequantised weights'
one). The fp16 decode path on CUDA also rounds the dense GEMV's half2 products (test_w4a16.py):
6.6e-4 to 6.9e-4 measured at the real shape, inside the same bound.
"""
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from catengine.errors import ConfigError, KernelContractError
from catengine.kernels.moe import fused as moe
from catengine.kernels.moe import naive as reference
from catengine.kernels.moe import route
from catengine.kernels.w4a16.packing import QuantizedWeight, pack_int4_along_k

DEV = "cuda" if torch.cuda.is_available() else "cpu"

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def make_experts(e, k, n, group, dtype, symmetric=False, device="cpu", seed=0):
    """Stacked random W4A16 experts [E, K//8, N] (x @ W layout) with their scales and zeros."""
    g = torch.Generator(device).manual_seed(seed)
    q = torch.randint(0, 16, (e, k, n), generator=g, device=device)
    s = (torch.rand(e, k // group, n, generator=g, device=device) + 0.5) * (2.0 / (16 * k ** 0.5))
    shape = (e, k // group, n)
    z = (torch.full(shape, 8.0, device=device) if symmetric else
         torch.randint(0, 16, shape, generator=g, device=device).float())
    return QuantizedWeight(pack_int4_along_k(q), s.to(dtype), z.to(dtype), group)


def make_dense(e, out_f, in_f, dtype, device="cpu", seed=0):
    g = torch.Generator(device).manual_seed(seed)
    return (torch.randn(e, out_f, in_f, generator=g, device=device) / in_f ** 0.5).to(dtype)


def routing(t, e, k, device="cpu", seed=0, used=None):
    """Random top-k routing; with ``used`` only the first ``used`` experts receive tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g)
    if used is not None:
        logits[:, used:] = -1e4
    w, ids = reference.moe_route(logits, k, True)
    return w.to(device), ids.to(device)


def rel_err(y, ref):
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert torch.isfinite(y).all()
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def check(t, e, k, hid, inter, dtype, quant, group=32, symmetric=False, device="cpu", used=None, seed=0):
    if quant:
        w13 = make_experts(e, hid, 2 * inter, group, dtype, symmetric, device, seed)
        w2 = make_experts(e, inter, hid, group, dtype, symmetric, device, seed + 1)
    else:
        w13 = make_dense(e, 2 * inter, hid, dtype, device, seed)
        w2 = make_dense(e, hid, inter, dtype, device, seed + 1)
    x = torch.randn(t, hid, generator=torch.Generator(device).manual_seed(seed + 2), device=device).to(dtype)
    tw, ids = routing(t, e, k, device, seed + 3, used)
    y = moe.fused_moe(x, w13, w2, tw, ids)
    ref = reference.fused_moe(x, w13, w2, tw, ids)
    assert rel_err(y, ref) < TOL[dtype]


# ---------------------------------------------------------------- interpreter (CI)
@pytest.mark.parametrize("t,e,k,renorm,dtype", [
    (5, 10, 3, True, torch.float16),      # E not a power of two, T not a multiple of the row block
    (4, 8, 8, False, torch.bfloat16),     # top_k = E
    (1, 256, 8, True, torch.float32),     # the 35B-A3B router
])
def test_route(t, e, k, renorm, dtype):
    # distinct logits, exact in every dtype (ties may be ordered either way)
    g = torch.Generator().manual_seed(t * e)
    logits = torch.stack([torch.randperm(e, generator=g) for _ in range(t)]).float().mul(0.25).to(dtype)
    w, ids = route.moe_route(logits, k, renorm)
    rw, rids = reference.moe_route(logits, k, renorm)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)


def test_route_rejects_bad_top_k():
    with pytest.raises(ConfigError, match="top_k"):
        route.moe_route(torch.randn(2, 4), 5)
    with pytest.raises(ConfigError, match="expert_range"):
        route.moe_route(torch.randn(2, 4), 2, True, (2, 5))


@pytest.mark.parametrize("t,e,k,lo,hi", [(5, 10, 3, 0, 5), (5, 10, 3, 5, 10), (3, 256, 8, 64, 128)])
def test_route_expert_range(t, e, k, lo, hi):
    """Expert parallelism: the same choice and weights as the whole router, ids local to lo..hi-1 and -1
    for the other ranks' experts."""
    g = torch.Generator().manual_seed(t * e + lo)
    logits = torch.stack([torch.randperm(e, generator=g) for _ in range(t)]).float().mul(0.25).half()
    w, ids = route.moe_route(logits, k, True, (lo, hi))
    rw, rids = reference.moe_route(logits, k, True, (lo, hi))
    fw, fids = reference.moe_route(logits, k, True)
    assert torch.equal(ids, rids) and torch.equal(rw, fw)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)
    local = (fids >= lo) & (fids < hi)
    assert torch.equal(rids, torch.where(local, fids - lo, -1)) and (~local).any()


@pytest.mark.parametrize("quant,group,symmetric,dtype", [
    (True, 32, False, torch.float16),
    (True, 64, True, torch.bfloat16),
    (False, 0, False, torch.bfloat16),
])
def test_rows(quant, group, symmetric, dtype):
    # T * top_k = 4 <= row_max: the decode kernels; dense I = 40 ends in a partial 16-wide tile
    check(2, 6, 2, 64 if group != 128 else 128, 40 if not quant else 64, dtype, quant, group, symmetric)


@pytest.mark.parametrize("stages", [1, 3])
def test_rows_quantised_without_decode_entry(monkeypatch, stages):
    """W4A16 experts on the row kernels (a table without ``decode``); num_stages > 1 runs the down loop
    that Triton pipelines."""
    tab = moe.TABLES["sm90"]
    monkeypatch.setitem(moe.TABLES, "sm90", dataclasses.replace(
        tab, decode=None, down_row=dataclasses.replace(tab.down_row, num_stages=stages)))
    check(2, 6, 2, 64, 64, torch.float16, True, 32)


def decode_table(monkeypatch, up_waves=16, down_waves=16, bn=64, bk=512):
    tab = moe.TABLES["sm90"]
    gv = moe.GemvConfig
    monkeypatch.setitem(moe.TABLES, "sm90", dataclasses.replace(
        tab, decode=(gv(bn, bk, 4, 1, up_waves), gv(bn, bk, 4, 1, down_waves))))


@pytest.mark.parametrize("t,e,k,hid,inter,group,symmetric,dtype,waves,bn,bk", [
    (1, 6, 3, 128, 128, 128, False, torch.float16, 16, 64, 512),   # top_k 3, split K in both passes
    (3, 9, 3, 96, 160, 32, False, torch.float16, 16, 64, 64),      # H, I tails of 64-wide tiles, 3 tiles/expert
    (2, 6, 2, 64, 64, 64, True, torch.bfloat16, 16, 64, 512),
    (4, 8, 8, 64, 96, 32, False, torch.float16, 1, 64, 128),      # T * top_k = sm_70/sm_80 row_max, no split at all
    (8, 8, 8, 64, 96, 32, False, torch.float16, 16, 64, 64),      # T * top_k = sm_90 row_max (64 rows), split K
    (2, 5, 4, 192, 64, 64, False, torch.bfloat16, 1, 16, 256),    # no split, R shrunk to divide K / 8
    (3, 9, 4, 192, 128, 64, True, torch.bfloat16, 1, 128, 2048),  # H tail, up unsplit (one K tile)
])
def test_decode(monkeypatch, t, e, k, hid, inter, group, symmetric, dtype, waves, bn, bk):
    """fused_moe_decode (both kernels, with and without split-K and its in-kernel reduce)."""
    decode_table(monkeypatch, waves, waves, bn, bk)
    check(t, e, k, hid, inter, dtype, True, group, symmetric)


def test_decode_counters_rearmed_and_repeatable(monkeypatch):
    """The split-K arrival counters end each call at zero (a captured graph replays on them), so calls
    with other token counts on the same weights stay right and repeat bit for bit."""
    decode_table(monkeypatch, bk=64)
    w13 = make_experts(6, 256, 2 * 64, 32, torch.float16)       # 4 K tiles in the up pass, 2 in the down
    w2 = make_experts(6, 64, 256, 32, torch.float16, seed=1)
    for t in (2, 1):
        x = torch.randn(t, 256, generator=torch.Generator().manual_seed(t)).half()
        tw, ids = routing(t, 6, 2, seed=t)
        y = moe.fused_moe(x, w13, w2, tw, ids)
        assert rel_err(y, reference.fused_moe(x, w13, w2, tw, ids)) < TOL[torch.float16]
        assert torch.equal(y, moe.fused_moe(x, w13, w2, tw, ids))
        assert w13.split_counters is not None and w2.split_counters is not None
        assert not w13.split_counters.any() and not w2.split_counters.any()


@pytest.mark.parametrize("t,e,k,quant,group,dtype", [
    (20, 6, 2, True, 32, torch.float16),     # ~7 rows per expert: BM = 16, one expert unused
    (20, 6, 2, False, 0, torch.bfloat16),
    (40, 4, 2, True, 128, torch.bfloat16),   # 20 rows per expert: BM = 64
    (150, 4, 2, True, 32, torch.float16),    # 75 rows per expert: BM = 128
])
def test_sorted(t, e, k, quant, group, dtype):
    # H = 96 and I = 96 (quantised) / 80 (dense) end in partial 64/128-wide tiles
    hid = 128 if group == 128 else 96
    check(t, e, k, hid, 128 if group == 128 else (96 if quant else 80), dtype, quant, group,
          used=e - 1 if e == 6 else None)


@pytest.mark.parametrize("t,quant", [(4, False), (4, True), (20, False), (20, True)],
                         ids=["rows", "decode", "sorted-dense", "sorted-w4"])
def test_fp16_sum_past_65504(monkeypatch, t, quant):
    """fp16 activations whose expert outputs and weighted sum pass 65,504 (the V100 case: no bf16):
    every path returns the fp32 sum, finite and equal to the twin's, never rounded to fp16 (x 30, the
    down weights x 120: silu(gate) * up stays in the thousands, the sums reach 70-240K)."""
    e, k, hid, inter = 6, 2, 64, 64
    decode_table(monkeypatch)
    if quant:
        w13 = make_experts(e, hid, 2 * inter, 32, torch.float16)
        w2 = make_experts(e, inter, hid, 32, torch.float16, seed=1)
        w2 = QuantizedWeight(w2.qweight, w2.scales * 120, w2.zeros, w2.group_size)
    else:
        w13 = make_dense(e, 2 * inter, hid, torch.float16)
        w2 = (make_dense(e, hid, inter, torch.float32, seed=1) * 120).half()
    x = (torch.randn(t, hid, generator=torch.Generator().manual_seed(2)) * 30).half()
    tw, ids = routing(t, e, k, seed=3)
    ref = reference.fused_moe(x, w13, w2, tw, ids)
    assert ref.dtype == torch.float32 and ref.abs().max() > 65504
    assert rel_err(moe.fused_moe(x, w13, w2, tw, ids), ref) < TOL[torch.float16]


def test_align_tokens():
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [2, 3]], dtype=torch.int32)
    sorted_ids, block_expert, n_post = (v.cpu() for v in route.align_tokens(ids.to(DEV), 5, 4))
    n = int(n_post)
    assert n == 16                                     # experts 0..3 hold 2, 1, 4, 1 rows: a block each
    assert block_expert[: n // 4].tolist() == [0, 1, 2, 3] and (block_expert[n // 4:] == -1).all()
    flat = ids.reshape(-1)
    for b in range(n // 4):
        rows = sorted_ids[4 * b: 4 * b + 4]
        real = rows[rows < flat.numel()]
        assert (flat[real.long()] == block_expert[b]).all()
    assert sorted(sorted_ids[sorted_ids < 8].tolist()) == list(range(8))


@pytest.mark.parametrize("t,k,e,block", [(1, 1, 4, 16), (2, 8, 256, 16), (8, 8, 256, 16), (5, 3, 7, 4),
                                         (33, 2, 16, 64), (256, 8, 256, 16), (300, 8, 64, 32)])
def test_align_kernel_equals_twin(t, k, e, block):
    """The per-expert Triton alignment against the torch twin: every output identical (the order within an
    expert included, so the grouped GEMMs see the very same rows). Routings skewed to a few experts too,
    so some runs span many blocks and most experts are absent."""
    gen = torch.Generator().manual_seed(t * 31 + e)
    for skew in (False, True):
        if skew:
            ids = torch.randint(0, min(e, 3), (t, k), generator=gen)
        else:
            ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
        ids = ids.to(torch.int32)
        want = reference.align_tokens(ids, e, block)
        got = route.align_tokens(ids.to(DEV), e, block)
        for g, w in zip(got, want):
            assert g.dtype == torch.int32 and torch.equal(g.cpu(), w), (skew, g, w)


def test_align_kernel_one_expert_over_many_chunks():
    """One expert's run longer than a program's chunk of block entries (256), the tail too: still the twin's."""
    ids = torch.zeros(1100, 1, dtype=torch.int32)
    ids[::7] = 1
    want = reference.align_tokens(ids, 3, 4)
    assert int(want[2]) // 4 > 256
    for g, w in zip(route.align_tokens(ids.to(DEV), 3, 4), want):
        assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("t,k,e,block", [(1, 2, 4, 16), (8, 8, 64, 16), (33, 2, 16, 64), (300, 8, 64, 32)])
def test_align_kernel_equals_twin_with_other_ranks_experts(t, k, e, block):
    """Ids of -1 (experts another rank holds) are left out by both, identically; all -1 gives no block."""
    gen = torch.Generator().manual_seed(t + e)
    ids = torch.stack([torch.randperm(2 * e, generator=gen)[:k] for _ in range(t)])
    ids = torch.where(ids < e, ids, -1).to(torch.int32)
    for case in (ids, torch.full_like(ids, -1)):
        want = reference.align_tokens(case, e, block)
        got = route.align_tokens(case.to(DEV), e, block)
        for g, w in zip(got, want):
            assert g.dtype == torch.int32 and torch.equal(g.cpu(), w), (g, w)
        flat = case.reshape(-1)
        kept = want[0][want[0] < flat.numel()].long()
        assert sorted(kept.tolist()) == (flat >= 0).nonzero().reshape(-1).tolist()
    assert int(reference.align_tokens(torch.full_like(ids, -1), e, block)[2]) == 0


@pytest.mark.parametrize("path,t,quant,dtype", [
    ("rows", 2, False, torch.bfloat16), ("rows-w4", 2, True, torch.float16), ("decode", 2, True, torch.float16),
    ("decode", 3, True, torch.bfloat16), ("sorted", 20, True, torch.float16), ("sorted", 20, False, torch.bfloat16),
])
@pytest.mark.parametrize("ranks", [2, 4])
def test_expert_parallel(monkeypatch, path, t, quant, dtype, ranks):
    """Each rank's experts only (ids -1 elsewhere): every path equals the twin on the rank's slice, and the
    twins' per-rank outputs sum to the whole MoE (the all-reduce after the block)."""
    e, k, hid, inter, group = 8, 3, 64, 64, 32
    if path == "rows-w4":
        tab = moe.TABLES["sm90"]
        monkeypatch.setitem(moe.TABLES, "sm90", dataclasses.replace(tab, decode=None))
    else:
        decode_table(monkeypatch, bk=64)
    if quant:
        w13 = make_experts(e, hid, 2 * inter, group, dtype)
        w2 = make_experts(e, inter, hid, group, dtype, seed=1)
    else:
        w13, w2 = make_dense(e, 2 * inter, hid, dtype), make_dense(e, hid, inter, dtype, seed=1)
    x = torch.randn(t, hid, generator=torch.Generator().manual_seed(2)).to(dtype)
    logits = torch.randn(t, e, generator=torch.Generator().manual_seed(3)).to(dtype)
    tw, ids = reference.moe_route(logits, k)
    whole = reference.fused_moe(x, w13, w2, tw, ids)
    n = e // ranks
    total = torch.zeros_like(whole)
    for r in range(ranks):
        lo, hi = r * n, (r + 1) * n
        part = (lambda w: QuantizedWeight(w.qweight[lo:hi], w.scales[lo:hi], w.zeros[lo:hi], w.group_size)) \
            if quant else (lambda w: w[lo:hi])
        rtw, rids = route.moe_route(logits, k, True, (lo, hi))
        _, want_ids = reference.moe_route(logits, k, True, (lo, hi))
        assert torch.equal(rids, want_ids)
        ref = reference.fused_moe(x, part(w13), part(w2), rtw, rids)
        total += ref
        if not (rids >= 0).any():
            continue
        y = moe.fused_moe(x, part(w13), part(w2), rtw, rids)
        # rows without a local expert are exactly zero
        none = ~(rids >= 0).any(1)
        assert torch.equal(y[none], torch.zeros_like(y[none]))
        assert rel_err(y, ref) < TOL[dtype]
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-5)


def test_align_above_the_kernel_limit_uses_the_twin():
    ids = torch.randint(0, 8, (route.ALIGN_MAX_ROWS // 2 + 1, 2), generator=torch.Generator().manual_seed(0))
    for g, w in zip(route.align_tokens(ids.to(torch.int32).to(DEV), 8, 16), reference.align_tokens(ids, 8, 16)):
        assert torch.equal(g.cpu(), w)


class HostValues(TorchDispatchMode):
    """Records the ops that move a value between host and device when the tensors live on a GPU: a tensor made
    from a Python number (``lift_fresh``, then a host-to-device copy, e.g. ``t[i] = 0``) and a read-back
    (``_local_scalar_dense``: ``.item()``, ``int(t)``); on the CPU they show as the same ops."""
    NAMES = ("aten.lift_fresh", "aten._local_scalar_dense", "aten.nonzero")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.NAMES):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tk", [route.ALIGN_MAX_ROWS // 2, route.ALIGN_MAX_ROWS * 2])
def test_align_tokens_moves_nothing_between_host_and_device(tk):
    """A long prefill's alignment (the twin above ALIGN_MAX_ROWS) stays on the device: one such copy per MoE layer
    made every layer wait for the GPU (bench/NOTES.md, session 24)."""
    ids = torch.randint(-1, 64, (tk // 8, 8), generator=torch.Generator().manual_seed(0)).to(torch.int32).to(DEV)
    with HostValues() as mode:
        route.align_tokens(ids, 64, 16)
    assert not mode.seen


def test_rejects_mixed_weights():
    w13 = make_experts(2, 32, 64, 32, torch.float16)
    with pytest.raises(KernelContractError, match="both"):
        moe.fused_moe(torch.randn(1, 32).half(), w13, make_dense(2, 32, 32, torch.float16),
                      torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.int32))


def test_aot_list_has_no_bf16_on_sm70():
    for cfg in moe.aot_configs(70):
        assert "bf16" not in str(cfg.signature)


# ---------------------------------------------------------------- GPU, Qwen3.6-35B-A3B
@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4, 64, 1000, 4096])      # rows, rows, BM 16, BM 64, BM 128
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_35b_a3b(t, dtype):
    check(t, 256, 8, 2048, 512, dtype, True, group=128, device="cuda", seed=t)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [4, 64, route.ALIGN_MAX_ROWS // 8 + 1, 8192])   # the kernel, and the twin above its limit
def test_gpu_prefill_never_waits_for_the_device(t):
    """Routing, alignment and the grouped GEMMs launch without a host sync (CUDA's sync debug mode): one per MoE
    layer left the GPU idle between launches in long prefills."""
    x = torch.randn(t, 2048, device="cuda", dtype=torch.float16)
    w13 = make_experts(256, 2048, 1024, 128, torch.float16, device="cuda")
    w2 = make_experts(256, 512, 2048, 128, torch.float16, device="cuda", seed=1)
    logits = torch.randn(t, 256, device="cuda", dtype=torch.float16)
    moe.fused_moe(x, w13, w2, *route.moe_route(logits, 8, True))   # compilation and first-call buffers
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        route.align_tokens(torch.randint(0, 256, (t, 8), device="cuda", dtype=torch.int32), 256, 64)
        moe.fused_moe(x, w13, w2, *route.moe_route(logits, 8, True))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_gpu_35b_a3b_dense(t):
    check(t, 256, 8, 2048, 512, torch.bfloat16, False, device="cuda", seed=t)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 300])
def test_gpu_symmetric_group64(t):
    check(t, 256, 8, 2048, 512, torch.bfloat16, True, group=64, symmetric=True, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,pdl", [(torch.float16, 0), (torch.bfloat16, 0), (torch.float16, 1),
                                       (torch.bfloat16, 2)])
# split K in both passes (the table's tiles), or the up pass unsplit and the down pass split toward one wave
@pytest.mark.parametrize("unsplit", [False, True])
def test_gpu_decode_graph_replay(monkeypatch, dtype, pdl, unsplit):
    """The decode path captured in a CUDA graph (first use inside the capture: fresh zeroed counters),
    replayed on new routings and activations copied into its inputs, equals eager calls bit for bit;
    pdl: the down kernel (1) or both kernels (2) launched as programmatic dependents (sm_90 on only)."""
    key, _ = moe.device_key("cuda")
    if pdl and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    gv = moe.GemvConfig
    dec = (gv(16, 2048, 4, 1, 16), gv(64, 512, 4, 1, 1)) if unsplit else (gv(64, 512, 4, 1, 16),) * 2
    monkeypatch.setitem(moe.TABLES, key, dataclasses.replace(moe.TABLES[key], decode_pdl=pdl, decode=dec))
    w13 = make_experts(256, 2048, 1024, 128, dtype, device="cuda")
    w2 = make_experts(256, 512, 2048, 128, dtype, device="cuda", seed=1)
    x = torch.randn(2, 2048, device="cuda").to(dtype)
    tw, ids = routing(2, 256, 8, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        y = moe.fused_moe(x, w13, w2, tw, ids)
    torch.cuda.current_stream().wait_stream(side)
    for seed in range(3):
        x.copy_(torch.randn(2, 2048, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        new_tw, new_ids = routing(2, 256, 8, "cuda", seed=seed + 10)
        tw.copy_(new_tw)
        ids.copy_(new_ids)
        graph.replay()
        assert rel_err(y, reference.fused_moe(x, w13, w2, tw, ids)) < TOL[dtype]
        assert torch.equal(y, moe.fused_moe(x, w13, w2, tw, ids))


@pytest.mark.gpu
def test_gpu_decode_reads_only_chosen_experts():
    """Experts the token did not choose hold NaN scales: any read of them would poison the output."""
    w13 = make_experts(256, 2048, 1024, 128, torch.float16, device="cuda")
    w2 = make_experts(256, 512, 2048, 128, torch.float16, device="cuda", seed=1)
    x = torch.randn(1, 2048, device="cuda").half()
    tw, ids = routing(1, 256, 8, "cuda")
    ref = reference.fused_moe(x, w13, w2, tw, ids)
    unused = torch.ones(256, dtype=torch.bool, device="cuda")
    unused[ids[0].long()] = False
    w13.scales[unused] = float("nan")
    w2.scales[unused] = float("nan")
    assert rel_err(moe.fused_moe(x, w13, w2, tw, ids), ref) < TOL[torch.float16]


def expert_parallel_gpu(fn, t, dtype, quant, ranks=4, e=256, k=8, hid=2048, inter=512):
    """Qwen3.6-35B-A3B's MoE cut into ``ranks`` expert ranges: ``fn`` on each range equals the twin on it (rows
    with no local expert exactly zero), and the ranges' twins sum to the whole MoE."""
    if quant:
        w13 = make_experts(e, hid, 2 * inter, 128, dtype, device="cuda", seed=t)
        w2 = make_experts(e, inter, hid, 128, dtype, device="cuda", seed=t + 1)
    else:
        w13, w2 = make_dense(e, 2 * inter, hid, dtype, "cuda", t), make_dense(e, hid, inter, dtype, "cuda", t + 1)
    x = torch.randn(t, hid, generator=torch.Generator("cuda").manual_seed(t), device="cuda").to(dtype)
    # distinct logits, exact in bf16 too: random ones tie in 16 bits, and the kernel may order a tie either way
    # (test_route), which would move a choice across the ids' positions
    g = torch.Generator().manual_seed(t + 2)
    logits = (torch.stack([torch.randperm(e, generator=g) for _ in range(t)]) - e // 2).mul(0.25).to(dtype).cuda()
    tw, ids = reference.moe_route(logits, k)
    total = torch.zeros(t, hid, device="cuda")
    n = e // ranks
    for r in range(ranks):
        lo, hi = r * n, (r + 1) * n
        part = (lambda w: QuantizedWeight(w.qweight[lo:hi], w.scales[lo:hi], w.zeros[lo:hi], w.group_size)) \
            if quant else (lambda w: w[lo:hi])
        rtw, rids = route.moe_route(logits, k, True, (lo, hi))
        assert torch.equal(rids, torch.where((ids >= lo) & (ids < hi), ids - lo, -1))
        y = fn(x, part(w13), part(w2), rtw, rids)
        ref = reference.fused_moe(x, part(w13), part(w2), rtw, rids)
        none = ~(rids >= 0).any(1)
        assert torch.equal(y[none], torch.zeros_like(y[none]))
        assert rel_err(y, ref) < TOL[dtype]
        total += ref
    torch.testing.assert_close(total, reference.fused_moe(x, w13, w2, tw, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("t,dtype,quant", [(1, torch.float16, True), (4, torch.bfloat16, True), (2, torch.float16, False),
                                           (64, torch.float16, True), (4096, torch.bfloat16, True),
                                           (64, torch.bfloat16, False)])
def test_gpu_35b_a3b_expert_parallel(t, dtype, quant):
    """Expert parallelism at TP4 (64 experts a rank): decode GEMV, rows and sorted paths skip the other ranks'."""
    expert_parallel_gpu(moe.fused_moe, t, dtype, quant)
