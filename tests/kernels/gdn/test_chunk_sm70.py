"""The split form's stages on HMMA.884 (gdn/chunk_o_sm70.py output, gdn/chunk_h_sm70.py state): their choice on
the sm_70 row, their contract and the output stage's torch twin (naive.chunk_output) on CPU; with -m gpu the
output kernel against the twin and the whole chunk_gated_delta_rule on the sm_70 row (split form; output stage
alone, then both) against naive.py. mma.m8n8k4 is emulated on the H200, so the GPU shapes are small.

Tolerances as test_gated_delta_rule.py: fp16 operands with fp32 accumulation; as in the tl.dot kernels, the A
tile (q k^T * decay), the state and v_new * f are rounded to fp16 once before their next product: relative
Frobenius error < 5e-3.
"""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.gdn import chunk as gdr
from catengine.kernels.gdn import naive as ref
from catengine.kernels.gdn import table as gdn_table
from catengine.kernels.gdn.chunk_h_sm70 import h_hmma_applies
from catengine.kernels.gdn.chunk_o_sm70 import check_o_sm70, o_block, o_hmma_applies, output_launch

from .test_gated_delta_rule import _case, _qsl, _rel

FP16_TOL = 5e-3


def test_only_the_sm70_row_takes_the_hmma_stages():
    assert gdn_table.TABLE[70].o_hmma and gdn_table.TABLE[70].h_hmma
    assert not any(gdn_table.TABLE[a].o_hmma or gdn_table.TABLE[a].h_hmma for a in (80, 90))
    cuda = torch.device("cuda")
    assert h_hmma_applies(gdn_table.TABLE[70], torch.float16, cuda)
    assert not h_hmma_applies(gdn_table.TABLE[70], torch.bfloat16, cuda)
    assert not h_hmma_applies(gdn_table.TABLE[70], torch.float16, torch.device("cpu"))
    assert not h_hmma_applies(gdn_table.TABLE[90], torch.float16, cuda)
    assert o_hmma_applies(gdn_table.TABLE[70], torch.float16, cuda)
    assert not o_hmma_applies(gdn_table.TABLE[70], torch.bfloat16, cuda)
    assert not o_hmma_applies(gdn_table.TABLE[70], torch.float32, cuda)
    assert not o_hmma_applies(gdn_table.TABLE[70], torch.float16, torch.device("cpu"))
    assert not o_hmma_applies(gdn_table.TABLE[90], torch.float16, cuda)


def test_catengine_arch_70_picks_it_for_a_cuda_device():
    """Under the switch a CUDA device gets the sm_70 row and so both HMMA stages (no GPU needed to ask)."""
    code = ("import json, torch\n"
            "from catengine.kernels.gdn.table import device_table\n"
            "from catengine.kernels.gdn.chunk_o_sm70 import o_hmma_applies\n"
            "from catengine.kernels.gdn.chunk_h_sm70 import h_hmma_applies\n"
            "t, d = device_table(torch.device('cuda')), torch.device('cuda')\n"
            "print(json.dumps([o_hmma_applies(t, torch.float16, d), h_hmma_applies(t, torch.float16, d)]))\n")
    env = {**os.environ, "CATENGINE_ARCH": "70"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, True]


def test_contract_is_fp16_on_cuda_with_a_whole_warp_tile():
    with pytest.raises(KernelContractError, match="fp16"):
        check_o_sm70(torch.zeros(1, 1, 32, dtype=torch.bfloat16), 64)
    with pytest.raises(KernelContractError, match="CUDA"):
        check_o_sm70(torch.zeros(1, 1, 32, dtype=torch.float16), 64)
    assert [o_block(b) for b in (16, 32, 64, 128, 256)] == [32, 32, 64, 64, 64]


def _stage_inputs(lens, hk, r, dk, dv, gen, device="cpu"):
    """Random inputs of the output stage: fp16 q, k, v_new and chunk states, the key norms of k."""
    q, k, v, g, _, _, qsl, _, _ = _case(lens, hk, r, dk, dv, torch.float16, gen)
    hv = hk * r
    nt = sum(-(-n // 64) for n in lens)
    hb = (torch.randn(nt, hv, dk, dv, generator=gen) * 0.3).to(torch.float16)
    kn = torch.rsqrt((k.float() ** 2).sum(-1) + 1e-6).repeat_interleave(r, 1)
    cu = _qsl([-(-n // 64) for n in lens])
    return [x.to(device) for x in (q, k, v, hb, g, kn, qsl, cu)], nt


def test_output_twin_matches_the_tl_dot_kernel():
    """The twin the GPU test trusts is the tl.dot output kernel's semantics (interpreter on CPU)."""
    gen = torch.Generator().manual_seed(7)
    lens = [70, 1, 64]
    (q, k, vn, hb, g, kn, qsl, cu), nt = _stage_inputs(lens, 1, 2, 32, 32, gen)
    want = ref.chunk_output(q, k, vn, hb, g, kn, qsl, 32 ** -0.5)
    o = torch.empty_like(vn)
    gdr.gdn_chunk_o_kernel[(nt, 2, 1)](q, k, vn, hb, g, kn, o, qsl, cu, 0, len(lens), 2, 2, 32 ** -0.5,
                                       q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0),
                                       o.stride(0), o.stride(1), K=32, V=32, BK=32, BV=32, USE_L2NORM=True)
    assert _rel(o, want) < FP16_TOL


def test_sm70_row_runs_the_scan_where_no_hmma_stage_applies():
    """The sm_70 row's split is there for its HMMA.884 stages: with none applying (here: CPU tensors, as for a
    non-fp16 model) it takes the scan, not its tl.dot split build; a row without HMMA stages keeps its split, and
    one stage on HMMA.884 is enough for the split (test_chunk_gated_delta_rule_gpu_sm70_split runs o alone)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta, ssm, qsl, slots, has = _case([70, 5], 1, 2, 32, 32, torch.float16, gen)
    row70, row80 = gdn_table.TABLE[70], dataclasses.replace(gdn_table.TABLE[80], prefill="split")
    assert row70.prefill == "split" and not o_hmma_applies(row70, q.dtype, q.device)

    def names(table):
        _, steps = gdr.chunk_steps(q, k, v, g, beta, ssm, qsl, slots, has, 32 ** -0.5, table=table)
        return [n for n, _ in steps]
    assert names(row70) == ["offsets", "wy", "scan"]
    assert names(row80) == ["offsets", "wy", "h", "o"]


# ---------------------------------------------------------------- GPU (mma.m8n8k4 emulated on the H200: small)
@pytest.mark.gpu
# (the op's cases below run dk = 32 with the l2 norm; without it here: one build fewer in the GPU run)
@pytest.mark.parametrize("dk,lens,l2", [(128, [1, 63, 130, 64], True), (32, [70, 5, 100], False)])
def test_output_kernel_gpu_matches_twin(dk, lens, l2):
    gen = torch.Generator().manual_seed(dk + len(lens))
    (q, k, vn, hb, g, kn, qsl, cu), nt = _stage_inputs(lens, 1, 2, dk, dk, gen, device="cuda")
    want = ref.chunk_output(q, k, vn, hb, g, kn, qsl, dk ** -0.5, l2)
    o = torch.full_like(vn, float("nan"))
    output_launch(q, k, vn, hb, g, kn, o, qsl, cu, dk ** -0.5, l2, len(lens), nt)()
    torch.cuda.synchronize()
    e = _rel(o, want)
    print(f"\nchunk_o_sm70 dk={dk} lens={lens} l2={l2}: rel err {e:.2e}")
    assert e < FP16_TOL


# (o on HMMA, h on HMMA, dk, lens, Hk, Hv / Hk): the output stage alone first, so that -x names the stage that
# fails; then both, and 33 chunks of one sequence cut into windows on side streams (the state kernel continues
# from the slot after the first window; the output kernel's windows are only launch bounds)
SHAPES = ((128, [1, 63, 130, 65], 1, 2), (32, [70, 5, 129], 2, 2))
SPLIT_CASES = [(True, False, *c) for c in SHAPES] + [(True, True, *c) for c in SHAPES] + \
    [(True, True, 32, [2100], 1, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("o_hmma,h_hmma,dk,lens,hk,r", SPLIT_CASES)
def test_chunk_gated_delta_rule_gpu_sm70_split(o_hmma, h_hmma, dk, lens, hk, r):
    """The whole op on the sm_70 row in its split form, so that its stages are chunk_o_sm70 (and chunk_h_sm70 with
    chunk_wy_sm70; without them the sliced tl.dot WY). Without h_hmma the serial state kernel takes the sm_90 row's dv block /
    warps / stages: the sm_70 row's 1-stage tl.dot build hit an illegal address on the H200 (table.py), which
    this test is not about."""
    names = ["wy+h+o overlapped"] if len(lens) == 1 else ["offsets", "wy", "h", "o"]
    _sm70_split_check(dk, lens, hk, r, o_hmma, h_hmma, names)


def _sm70_split_check(dk, lens, hk, r, o_hmma, h_hmma, names):
    gen = torch.Generator().manual_seed(dk + 11)
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, hk, r, dk, dk, torch.float16, gen, device="cuda")
    has = torch.tensor([i % 2 == 0 for i in range(len(lens))], device="cuda")   # with and without a state
    h90 = gdn_table.TABLE[90]
    table = dataclasses.replace(gdn_table.TABLE[70], prefill="split", h_bv=h90.h_bv, h_warps=h90.h_warps,
                                h_stages=h90.h_stages, o_hmma=o_hmma, h_hmma=h_hmma, wy_hmma=h_hmma)
    assert o_hmma_applies(table, q.dtype, q.device) and h_hmma_applies(table, q.dtype, q.device) == h_hmma
    scale = dk ** -0.5
    ssm_ref = ssm.clone()
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, scale)
    o, steps = gdr.chunk_steps(q, k, v, g, beta, ssm, qsl, slots, has, scale, table=table)
    assert [n for n, _ in steps] == names
    for _, launch in steps:
        launch()
    torch.cuda.synchronize()
    e_o, e_s = _rel(o, o_ref), _rel(ssm, ssm_ref)
    print(f"\nsm_70 split o_hmma={o_hmma} h_hmma={h_hmma} dk={dk} lens={lens}: rel err o {e_o:.2e} state {e_s:.2e}")
    assert e_o < FP16_TOL and e_s < FP16_TOL


def test_doctor_reports_the_gdn_path_the_sm70_row_runs(monkeypatch):
    """`catengine doctor` says HMMA.884 for the GDN prefill's state and output stages only when the sm_70 row runs
    the split form with them (the scan form is all FMA)."""
    from catengine.tools import doctor
    facts = {"gpus": [{"cc": 70}], "catengine_arch": {"forced": None}, "triton": {"version": "3.6.0"},
             "kernels_env": ""}
    row = gdn_table.TABLE[70]
    monkeypatch.setitem(gdn_table.TABLE, 70, dataclasses.replace(row, prefill="scan"))
    path = doctor.op_paths(facts)["chunk_gated_delta_rule"]["path"]
    assert path.startswith("tl.dot -> FMA") and "scan" in path
    monkeypatch.setitem(gdn_table.TABLE, 70, dataclasses.replace(row, prefill="split"))
    assert "state HMMA.884 Gluon (fp16); output HMMA.884 Gluon (fp16)" in doctor.op_paths(facts)[
        "chunk_gated_delta_rule"]["path"]
