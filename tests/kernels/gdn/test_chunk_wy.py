"""The split form's WY stage alone (chunk_wy.gdn_chunk_wy_kernel through chunk.wy_launch) against its torch twin
(naive.chunk_wy), on the sm_70 row (its products as slices of 16 k, GDNTable.wy_ks: the whole-k FMA build spilled
16 KB a thread) and on a whole-k row; the whole op on the sm_70 row's WY; the row's sm_70 build without a stack.
The GPU check of the sliced WY is in test_chunk_wy_sm70.py (beside the HMMA.884 WY, on the same inputs).

Tolerances as test_gated_delta_rule.py: fp16 w, u come from fp16 operands (X and the scaled k, v rounded once)
with fp32 accumulation; fp32 runs the block merges in ieee fp32 on the sm_70 row.
"""
import dataclasses

import pytest
import torch

from catengine.kernels.gdn import chunk as gdr
from catengine.kernels.gdn import naive as ref
from catengine.kernels.gdn import table as gdn_table

from .test_gated_delta_rule import TOL, _case, _qsl, _rel, _run

ROW70 = gdn_table.TABLE[70]
# the sm_90 row's whole-k products in ieee (the interpreter's tf32 is fp32 anyway; this keeps the fp32 bound)
WHOLE_K = dataclasses.replace(gdn_table.TABLE[90], wy_dot="ieee")


def _wy(lens, hk, r, dk, dv, dtype, table, l2=True, seed=0, device="cpu"):
    """(kernel, twin) of w, u and the key norms on random inputs."""
    gen = torch.Generator().manual_seed(seed)
    _, k, v, g, beta, _, qsl, _, _ = _case(lens, hk, r, dk, dv, dtype, gen, device=device)
    if not l2:   # keys of about unit norm, as the model's l2 norm gives (|k|^2 ~ dk makes (I + A)^-1 overflow fp16)
        k = (k.float() * dk ** -0.5).to(dtype)
    chunks = [-(-n // 64) for n in lens]
    w, u, kn, launch = gdr.wy_launch(k, v, g, beta, qsl, _qsl(chunks, device), len(lens), sum(chunks), l2, table)
    for x in (w, u, kn):
        x.fill_(float("nan"))
    launch()
    return (w, u, kn), ref.chunk_wy(k, v, g, beta, qsl, l2)


def test_sm70_row_slices_its_wy_products():
    assert ROW70.wy_ks == 16 and ROW70.wy_dot == "ieee"
    assert all(gdn_table.TABLE[a].wy_ks == 0 for a in (80, 90))


# lens, Hk, Hv / Hk, dk, dv, dtype, l2norm: dk 128 (8 slices of K K^T), 32 (padded to 64: 4 slices), dk != dv,
# tails of 1 and 63 tokens, a chunk of exactly 64; dk 96 / dv 80: the second 64-column block of w, u partly masked
WY_CASES = [([1, 63, 130, 64], 1, 2, 128, 128, torch.float16, True),
            ([70, 5], 2, 2, 32, 32, torch.float16, False),
            ([65, 3], 1, 3, 64, 128, torch.float32, True),
            ([100], 1, 1, 64, 32, torch.float32, False),
            ([33, 64], 1, 2, 96, 80, torch.float16, True)]


@pytest.mark.parametrize("row", [ROW70, WHOLE_K], ids=["sm70_k16", "whole_k"])
@pytest.mark.parametrize("lens,hk,r,dk,dv,dtype,l2", WY_CASES)
def test_wy_matches_twin(row, lens, hk, r, dk, dv, dtype, l2):
    (w, u, kn), (w_ref, u_ref, kn_ref) = _wy(lens, hk, r, dk, dv, dtype, row, l2)
    torch.testing.assert_close(kn, kn_ref, rtol=1e-5, atol=1e-6)
    assert _rel(w, w_ref) < TOL[dtype] and _rel(u, u_ref) < TOL[dtype]


def test_op_on_the_sm70_rows_wy():
    """The whole op in the split form with the sm_70 row's tl.dot WY (its HMMA stages need CUDA: tl.dot here)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, ssm, qsl, slots, has = _case([130, 1, 64], 1, 2, 128, 128, torch.float16, gen)
    row = dataclasses.replace(ROW70, o_hmma=False, h_hmma=False, wy_hmma=False)
    ssm_ref = ssm.clone()
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, 128 ** -0.5)
    o, ssm_d = _run(row, q, k, v, g, beta, ssm, qsl, slots, has, 128 ** -0.5, names=["offsets", "wy", "h", "o"])
    assert _rel(o, o_ref) < TOL[torch.float16] and _rel(ssm_d, ssm_ref) < TOL[torch.float16]


def test_sm70_wy_builds_do_not_spill():
    """The sm_70 row's WY builds (dk 128 and 32) keep their products in registers: the whole-k 4-warp build ran on
    32 registers with a 16,376-byte stack a thread (44,949 STL/LDL; ptxas 12.9); this one measured 456 bytes at
    dk 128 (439 STL/LDL) and 192 at dk 32, so 1 KB leaves a ptxas version room and still fails the 8-warp whole-k
    build (11,520)."""
    from catengine.kernels.common.aot import compile_module
    built = compile_module("catengine.kernels.gdn.chunk", 70)
    wy = {r["name"]: r for r in built if r["kernel"] == "gdn_chunk_wy_kernel"}
    assert set(wy) == {"chunk_wy_fp16", "chunk_wy_dk32_fp16"}
    for r in wy.values():
        assert r["stack"] < 1024, r
