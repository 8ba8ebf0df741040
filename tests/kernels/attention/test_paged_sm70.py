"""The sm_70 paged attention on HMMA.884 (attention/paged_sm70.py) against its twin, naive.paged_attention.

CPU: the dispatch on the sm_70 row (and under CATENGINE_ARCH=70), the launch table against the V100's shared memory,
the contract errors; the AOT build of every configuration (m8n8k4 in the PTX, <= 96 KB) is in tests/kernels/test_aot.py.
GPU (``-m gpu``; the H200 emulates m8n8k4, so moderate shapes): prefill and decode against the twin with caches
poisoned with NaN wherever the kernel must not read (test_attention.make_case), at real and tail shapes: query lengths
not multiples of the tile, contexts not multiples of the KV block, GQA 6:1, 8:1 and 1:1, head dims 64/128/256, fp16
and e5m2 caches, chunked prefill over a cached prefix, decode with 1 and 5 query rows per sequence. Tolerance as in
test_attention: the twin is fp32 throughout, the kernel rounds P to fp16 before PV (relative 2^-11 per term) and the
output once, so 4e-3 absolute on outputs of magnitude ~1; a wrong fragment map or mask gives O(1) errors or NaN.
"""
from types import SimpleNamespace

import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from catengine.errors import KernelContractError
from catengine.kernels.attention import paged, paged_sm70
from catengine.kernels.attention.paged_sm70 import (PREFILL_SM70, Sm70Attn, decode_launch, paged_attention_sm70,
                                                    sm70_applies)
from catengine.kernels.attention.softmax_sm70 import frag_bits, frag_merge, p_to_a_stage
from catengine.kernels.common.mma884 import (a_layout, a_smem_shape, acc_rows_cols, b_layout, b_smem_shape, frag_layout,
                                             mma884, smem_layout, stage_index, stage_layout_a, stage_layout_b)

from .test_attention import assert_close, make_case

V100_SMEM = 96 * 1024


class _Launcher:
    """Stands in for a Triton kernel: ``k[grid](*args, **consts)`` records the tile it was launched with."""
    def __init__(self, seen):
        self.seen = seen

    def __getitem__(self, grid):
        return lambda *a, **k: self.seen.append(k["BLOCK_M"])


def _fake(dtype, d=256, device="cuda"):
    return SimpleNamespace(dtype=dtype, shape=(3, 6, d), device=torch.device(device))


def test_sm70_applies_fp16_on_the_sm70_row_only(monkeypatch):
    monkeypatch.setattr(paged_sm70, "INTERPRET", False)
    q, kc = _fake(torch.float16), _fake(torch.float16)
    assert paged_sm70.ENABLED                              # on the sm_70 row since the H200 passed its GPU tests
    monkeypatch.setattr(paged_sm70, "ENABLED", False)
    assert not sm70_applies(70, q, kc)
    monkeypatch.setattr(paged_sm70, "ENABLED", True)
    assert sm70_applies(70, q, kc) and sm70_applies(70, q, _fake(torch.uint8))
    assert not sm70_applies(80, q, kc) and not sm70_applies(90, q, kc)
    assert not sm70_applies(70, _fake(torch.bfloat16), _fake(torch.bfloat16))
    assert not sm70_applies(70, _fake(torch.float16, d=96), kc)          # no tile for this head dim
    assert not sm70_applies(70, _fake(torch.float16, device="cpu"), kc)
    monkeypatch.setattr(paged_sm70, "INTERPRET", True)                   # CI: the tl.dot kernel is the twin
    assert not sm70_applies(70, q, kc)


def test_dispatch_under_catengine_arch_70(monkeypatch):
    """With CATENGINE_ARCH=70 paged_attention_with hands the call (and an explicit split count) to the sm_70
    kernel when it applies, and keeps the Triton kernel when a launch is forced (tests, the benchmark)."""
    from catengine.kernels.common import arch
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "70")
    seen, calls = [], []
    monkeypatch.setattr(paged, "sm70_applies", lambda a, q, k: seen.append(a) or True)
    monkeypatch.setattr(paged, "paged_attention_sm70", lambda *a, **k: calls.append(k) or "sm70")
    case = make_case([3, 1], [9, 4], 6, 2, 64, 4, torch.float16)
    args = (case["q"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
            case["query_start_loc"], 0.125, 3, 9)
    assert paged.paged_attention_with(*args, num_splits=2) == "sm70"
    assert seen == [70] and calls == [{"num_splits": 2}]
    launched = []
    monkeypatch.setattr(paged, "paged_attn_kernel", _Launcher(launched))     # the tl.dot kernel, not run here
    got = paged.paged_attention_with(*args, cfg=paged.table_launch(70, 64, False, False))
    assert torch.is_tensor(got) and len(calls) == 1 and launched == [64]


def test_launch_table_fits_a_v100_block():
    for d, c in PREFILL_SM70.items():
        c.check(d, 8)
        assert c.smem_bytes(d) <= V100_SMEM
    for d in (64, 128, 256):
        for rows in (1, 6, 8, 16, 30, 40, 64):
            c = decode_launch(d, rows)
            c.check(d, min(rows, 8))
            assert c.block_m >= rows and c.block_m in (max(16, 1 << (rows - 1).bit_length()), 32)
            assert c.ctas_per_sm * c.smem_bytes(d) <= V100_SMEM
    # 27B decode (6 heads), speculative 6 x 5 and 8 x 5 rows: 8 warps at d 256, 4 below; the key tile that fits
    assert decode_launch(256, 6) == Sm70Attn(32, 64, 2, 4, 1)
    assert decode_launch(256, 30) == Sm70Attn(32, 64, 2, 4, 1)
    assert decode_launch(256, 40) == Sm70Attn(64, 32, 4, 2, 1)
    assert decode_launch(64, 6) == Sm70Attn(16, 64, 1, 4, 4)


def test_contract_errors():
    case = make_case([2], [5], 6, 2, 64, 4, torch.float16)
    args = (case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"], case["query_start_loc"],
            0.125, 2, 5)
    with pytest.raises(KernelContractError, match="no bf16"):
        paged_attention_sm70(case["q"].bfloat16(), *args)
    with pytest.raises(KernelContractError, match="CUDA only"):             # no Gluon interpreter
        paged_attention_sm70(case["q"], *args)
    with pytest.raises(KernelContractError, match="shared memory"):          # 147 KB at d = 256
        Sm70Attn(128, 64, 8, 1).check(256, 6)
    with pytest.raises(KernelContractError, match="query heads"):            # a group of 24 in 16 rows
        Sm70Attn(16, 32, 1, 1).check(128, 24)
    with pytest.raises(KernelContractError, match="16/32/64/128"):
        Sm70Attn(48, 32, 3, 1).check(64, 6)
    with pytest.raises(KernelContractError, match="BN % "):                   # 32 keys on 4 column warps
        Sm70Attn(16, 32, 1, 4).check(256, 6)


# ----------------------------------------------------------------------------- GPU
# Probes of the kernel's pieces (first in the device run: if the kernel fails, they say which piece): QK^T through
# the Q and K^T staging, P from a fragment tile through the shared-memory round trip into PV's A fragment, each
# written out through mma884's own C map (acc_rows_cols, proven by gemm884); the row statistics of the softmax
# have their own probe (test_softmax_sm70.py).


@gluon.jit
def _probe_kernel(q, k, p, v, s_raw, o_raw, r_raw, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                  WM: gl.constexpr, WN: gl.constexpr):
    MB: gl.constexpr = BM // 8
    NB: gl.constexpr = BN // 8
    ND: gl.constexpr = D // 8
    LF: gl.constexpr = frag_layout(WM, WN)
    LA: gl.constexpr = stage_layout_a(WM * WN)
    LB: gl.constexpr = stage_layout_b(WM * WN)
    dq, hq, lq, kq = stage_index(ND * MB, LA)
    s_q = gl.allocate_shared_memory(gl.float16, a_smem_shape(BM, D), smem_layout())
    s_q.store(gl.load(q + (8 * (dq % MB) + 4 * hq + lq) * D + 8 * (dq // MB) + kq))
    dk, hk, lk, kk = stage_index(ND * NB, LA)
    s_k = gl.allocate_shared_memory(gl.float16, b_smem_shape(D, BN), smem_layout())
    s_k.store(gl.load(k + (8 * (dk % NB) + 4 * hk + lk) * D + 8 * (dk // NB) + kk))
    s = gl.zeros([MB, NB, 2, 4, 8], gl.float32, layout=LF)
    for j in gl.static_range(ND):
        s = mma884(s, gl.expand_dims(s_q.slice(j * MB, MB).load(a_layout(WM, WN)), 1),
                   gl.expand_dims(s_k.slice(j * NB, NB).load(b_layout(WM, WN)), 0))
    rr, cc = acc_rows_cols(BM, BN, WM, WN)
    gl.store(s_raw + rr * BN + cc, s)
    # P [BM, BN] read into a fragment tile like S, staged from its bits view, times V
    p8 = frag_bits(gl.load(p + rr * BN + cc), BM, BN)
    s_p = gl.allocate_shared_memory(gl.float16, a_smem_shape(BM, BN), smem_layout())
    s_p.store(p_to_a_stage(p8, BM, BN))
    dv, hv, lv, kv = stage_index(NB * ND, LB)
    s_v = gl.allocate_shared_memory(gl.float16, b_smem_shape(BN, D), smem_layout())
    s_v.store(gl.load(v + (8 * (dv // ND) + kv) * D + 8 * (dv % ND) + 4 * hv + lv))
    acc = gl.zeros([MB, ND, 2, 4, 8], gl.float32, layout=LF)
    for j in gl.static_range(NB):
        acc = mma884(acc, gl.expand_dims(s_p.slice(j * MB, MB).load(a_layout(WM, WN)), 1),
                     gl.expand_dims(s_v.slice(j * ND, ND).load(b_layout(WM, WN)), 0))
    ro, co = acc_rows_cols(BM, D, WM, WN)
    gl.store(o_raw + ro * D + co, acc)
    # fragment -> bits -> fragment must give back the accumulator (plus one)
    gl.store(r_raw + ro * D + co, frag_merge(frag_bits(acc, BM, D) + 1.0, BM, D, LF))


@pytest.mark.gpu
@pytest.mark.parametrize("bm,bn,d,wm,wn", [(16, 64, 64, 1, 4), (64, 32, 256, 4, 2), (128, 64, 128, 8, 1),
                                           (32, 64, 256, 2, 4)], ids=str)
def test_gpu_probe_pieces(bm, bn, d, wm, wn):
    gen = torch.Generator(device="cuda").manual_seed(bm + d)
    q, k = (torch.randn(n, d, generator=gen, device="cuda").half() for n in (bm, bn))
    p = torch.rand(bm, bn, generator=gen, device="cuda").half()
    v = torch.randn(bn, d, generator=gen, device="cuda").half()
    out = [torch.full((bm, n), float("nan"), device="cuda") for n in (bn, d, d)]
    _probe_kernel[(1,)](q, k, p, v, *out, BM=bm, BN=bn, D=d, WM=wm, WN=wn, num_warps=wm * wn)
    s_raw, o_raw, r_raw = (x.cpu() for x in out)
    s_want = (q.float() @ k.float().T).cpu()
    o_want = (p.float() @ v.float()).cpu()
    errs = {"qk via C map": (s_raw - s_want).abs().max().item(), "pv via C map": (o_raw - o_want).abs().max().item(),
            "bits -> frag": (r_raw - o_raw - 1.0).abs().max().item()}
    print(f"\nprobe {bm}x{bn} d{d} w{wm}x{wn}: " + ", ".join(f"{n} {e:.2g}" for n, e in errs.items()), flush=True)
    assert all(e <= 1e-3 for e in errs.values()), errs


def run_sm70(case, gated=True, **kw):
    dev = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in case.items()}
    gate = dev["gate"] if gated else None
    scale = case["q"].shape[-1] ** -0.5
    args = (dev["q"], dev["k_cache"], dev["v_cache"], dev["block_tables"], dev["seq_lens"], dev["query_start_loc"],
            scale, dev["max_query_len"], dev["max_seq_len"], gate)
    from catengine.kernels.attention import naive
    want = naive.paged_attention(*args).cpu()
    return paged_attention_sm70(*args, **kw).cpu(), want


def assert_close_rows(got, want, tol=4e-3):
    """test_attention.assert_close, and on failure which (token, head) rows are wrong: a layout error shows as a
    pattern (every row, every other head, the rows past the first tile...), a mask error as the causal edge."""
    diff = (got.float() - want.float()).abs().nan_to_num(1e9)     # [T, nh, d]
    bad = diff.amax(-1) > tol
    print(f"\nmax err {diff.max().item():.3g} over {tuple(diff.shape)}, {bad.sum().item()} rows over {tol}", flush=True)
    if bad.any():
        idx = bad.nonzero().tolist()
        cols = (diff > tol).flatten(0, 1).any(0).nonzero().flatten().tolist()
        raise AssertionError(f"{bad.sum().item()} of {bad.numel()} (token, head) rows wrong (max err "
                             f"{diff.max().item():.3g}, {(~torch.isfinite(got.float())).sum().item()} non-finite, "
                             f"|want| max {want.float().abs().max().item():.3g}), first rows {idx[:12]}; "
                             f"{len(cols)} of {diff.shape[-1]} dims wrong, first {cols[:16]}; "
                             f"got[0, 0, :4] {got[0, 0, :4].tolist()} want {want[0, 0, :4].tolist()}")


@pytest.mark.gpu
def test_gpu_tiny_prefill():
    """The smallest whole-kernel case: one sequence of 16 tokens, one head, d 64, fp16, no gate, no split."""
    case = make_case([16], [16], 1, 1, 64, 16, torch.float16, gen=torch.Generator().manual_seed(0))
    got, want = run_sm70(case, gated=False)
    assert_close_rows(got, want)


@pytest.mark.gpu
def test_gpu_tiny_multi_tile():
    """Two query tiles (150 rows of 128) over three key tiles (64 keys), then a 6:1 group with a cached prefix:
    what the one-tile case above does not reach (the loop-carried softmax state, tok0 > 0, G > 1)."""
    case = make_case([150], [150], 1, 1, 64, 16, torch.float16, gen=torch.Generator().manual_seed(2))
    got, want = run_sm70(case, gated=False)
    assert_close_rows(got, want)
    case = make_case([20], [30], 6, 1, 64, 16, torch.float16, gen=torch.Generator().manual_seed(3))
    got, want = run_sm70(case, gated=False)
    assert_close_rows(got, want)


@pytest.mark.gpu
def test_gpu_tiny_decode():
    """One decode row over 40 keys, one head, d 64, fp16, unsplit and split in two."""
    case = make_case([1], [40], 1, 1, 64, 16, torch.float16, gen=torch.Generator().manual_seed(1))
    for splits in (1, 2):
        got, want = run_sm70(case, gated=False, num_splits=splits)
        assert_close_rows(got, want)


GQA = {"6:1": (24, 4), "8:1": (8, 1), "1:1": (4, 4)}
FP16, E5M2 = torch.float16, torch.uint8
# every group and cache dtype at the real head dim 256; at 128 and 64 every group, both dtypes among them (each
# combination is a compile of a Gluon kernel, and the H200 emulates m8n8k4: the device run has minutes)
COMBOS = ([(256, g, kv) for g in GQA for kv in (FP16, E5M2)]
          + [(128, "6:1", FP16), (128, "8:1", E5M2), (128, "1:1", FP16), (64, "6:1", E5M2), (64, "8:1", FP16),
             (64, "1:1", E5M2)])
_IDS = [f"d{d}-{g}-{'e5m2' if kv == E5M2 else 'fp16'}" for d, g, kv in COMBOS]


@pytest.mark.gpu
@pytest.mark.parametrize("d,gqa,kv_dtype", COMBOS, ids=_IDS)
def test_gpu_prefill_matches_twin(d, gqa, kv_dtype):
    """Chunked prefill over cached prefixes (query lengths 77 and 130 are no multiple of any tile, contexts end
    mid-block), a fresh prompt, and a decode row in the same batch (prefill launch)."""
    nh, nkv = GQA[gqa]
    case = make_case([77, 130, 1, 40], [200, 130, 61, 93], nh, nkv, d, 16, kv_dtype,
                     gen=torch.Generator().manual_seed(d + nh))
    got, want = run_sm70(case, gated=gqa != "1:1")
    assert_close_rows(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.uint8], ids=["fp16", "e5m2"])
@pytest.mark.parametrize("bs", [8, 32])
def test_gpu_prefill_block_sizes(kv_dtype, bs):
    """KV blocks smaller and larger than the key tile (27B shape)."""
    case = make_case([50, 19], [171, 19], 24, 4, 256, bs, kv_dtype, gen=torch.Generator().manual_seed(bs))
    got, want = run_sm70(case)
    assert_close_rows(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("d,gqa,kv_dtype", COMBOS, ids=_IDS)
@pytest.mark.parametrize("q_len", [1, 5])
def test_gpu_decode_matches_twin(d, gqa, kv_dtype, q_len):
    """Decode (1 row per head) and speculative verification (5 positions per sequence: 6:1 packs 30 rows, 8:1
    40 rows into one tile), split KV from the table, contexts ending mid-block and mid-tile."""
    nh, nkv = GQA[gqa]
    seq = [700, 5, 1030, 16, 131]
    case = make_case([min(q_len, s) for s in seq], seq, nh, nkv, d, 16, kv_dtype,
                     gen=torch.Generator().manual_seed(d * q_len + nh))
    got, want = run_sm70(case)
    assert_close_rows(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 17])
def test_gpu_decode_split_counts(splits):
    """Unsplit, few and many splits (most of them empty for the short sequences: they must stay neutral)."""
    case = make_case([1, 1, 1], [900, 3, 64], 24, 4, 256, 16, torch.uint8, gen=torch.Generator().manual_seed(splits))
    got, want = run_sm70(case, num_splits=splits)
    assert_close_rows(got, want)


@pytest.mark.gpu
def test_gpu_sm70_row_dispatch(monkeypatch):
    """paged_attention on the sm_70 row (CATENGINE_ARCH=70 as the engine sets it) reaches the HMMA kernel."""
    from catengine.kernels.common import arch
    monkeypatch.setattr(arch, "ARCH_OVERRIDE", "70")
    monkeypatch.setattr(paged_sm70, "ENABLED", True)
    calls = []
    real = paged.paged_attention_sm70
    monkeypatch.setattr(paged, "paged_attention_sm70", lambda *a, **k: calls.append(1) or real(*a, **k))
    case = make_case([33, 1], [90, 20], 24, 4, 256, 16, torch.float16, gen=torch.Generator().manual_seed(2))
    dev = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in case.items()}
    args = (dev["q"], dev["k_cache"], dev["v_cache"], dev["block_tables"], dev["seq_lens"], dev["query_start_loc"],
            256 ** -0.5, dev["max_query_len"], dev["max_seq_len"], dev["gate"])
    from catengine.kernels.attention import naive
    got = paged.paged_attention(*args)
    assert calls
    assert_close(got.cpu(), naive.paged_attention(*args).cpu(), torch.float16)
