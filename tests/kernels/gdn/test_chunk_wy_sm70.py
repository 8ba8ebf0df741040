"""The split form's WY stage on HMMA.884 (gdn/chunk_wy_sm70.py): its choice on the sm_70 row, its contract, and on
CPU its algorithm in torch (X = (I + A)^-1 by block merges from 2 x 2 blocks, every product's operands rounded to
fp16 as the kernel rounds them) against the twin naive.chunk_wy; with -m gpu the kernel against the twin and the
sliced tl.dot WY at the 27B's heads (Hk 16, Hv 48, dk = dv = 128) with tail chunks, and at dk 32 (blocks padded to
64). mma.m8n8k4 is emulated on the H100 / H200 (correct, slow, never timed).

Tolerance as test_gated_delta_rule.py's fp16: relative Frobenius error < 5e-3 (the emulation below: ~4e-4).
"""
import dataclasses

import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.gdn import chunk as gdr
from catengine.kernels.gdn import naive as ref
from catengine.kernels.gdn import table as gdn_table
from catengine.kernels.gdn.chunk_wy_sm70 import B_STAGE_PERM, wy_hmma_applies, wy_launch_sm70

from .test_gated_delta_rule import TOL, _case, _qsl, _rel

FP16_TOL = TOL[torch.float16]


def test_only_the_sm70_row_takes_the_hmma_wy():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert gdn_table.TABLE[70].wy_hmma and not any(gdn_table.TABLE[a].wy_hmma for a in (80, 90))
    assert wy_hmma_applies(gdn_table.TABLE[70], torch.float16, cuda)
    assert not wy_hmma_applies(gdn_table.TABLE[70], torch.bfloat16, cuda)
    assert not wy_hmma_applies(gdn_table.TABLE[70], torch.float16, cpu)
    assert not wy_hmma_applies(gdn_table.TABLE[90], torch.float16, cuda)


def test_contract_is_fp16_on_cuda():
    z = torch.zeros(1, dtype=torch.int32)
    for dt, msg in ((torch.bfloat16, "fp16"), (torch.float16, "CUDA")):
        k = torch.zeros(64, 1, 32, dtype=dt)
        with pytest.raises(KernelContractError, match=msg):
            wy_launch_sm70(k, torch.zeros(64, 1, 32, dtype=dt), torch.zeros(64, 1), torch.zeros(64, 1), z, z, 1, 1,
                           True)


def _h(x):
    return x.half().float()


def merge_form(k, v, g, beta, qsl, l2=True):
    """The kernel's algorithm in torch on 64-row chunks padded with zero rows: A from fp16 k, X_2 = I - A inside the
    2-blocks, X_2s = X_s - (X_s A_off) X_s with fp16 operands, w = X (beta k e^g / |k|), u = X (beta v)."""
    rep = v.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(rep, 1)
    kn = torch.rsqrt((kf ** 2).sum(-1) + 1e-6) if l2 else torch.ones(kf.shape[:2])
    w, u = torch.empty(kf.shape, dtype=v.dtype), torch.empty_like(v)
    r = torch.arange(64)
    bounds = qsl.tolist()
    for b in range(len(bounds) - 1):
        for c0 in range(bounds[b], bounds[b + 1], 64):
            n = min(64, bounds[b + 1] - c0)

            def pad(x):
                out = x.new_zeros((64,) + x.shape[1:])
                out[:n] = x[c0:c0 + n]
                return out.float().transpose(0, 1)    # [Hv, 64, *]
            kc, vc, gc, bc, nc = pad(kf), pad(v), pad(g).cumsum(-1), pad(beta), pad(kn)
            a = (_h(kc) @ _h(kc).transpose(1, 2)) * nc[:, :, None] * nc[:, None, :] * bc[:, :, None]
            a = torch.where(r[:, None] > r[None, :], a * (gc[:, :, None] - gc[:, None, :]).clamp_max(0).exp(), 0.)
            x = torch.eye(64) - torch.where(r[:, None] // 2 == r[None, :] // 2, a, 0.)
            for s in (2, 4, 8, 16, 32):
                inside = (r[:, None] // (2 * s) == r[None, :] // (2 * s)) & (r[:, None] // s != r[None, :] // s)
                off = torch.where(inside, a, 0.)
                x = x - _h(_h(x) @ _h(off)) @ _h(x)
            w[c0:c0 + n] = (_h(x) @ _h(kc * (nc * bc * gc.exp())[:, :, None]))[:, :n].transpose(0, 1).to(v.dtype)
            u[c0:c0 + n] = (_h(x) @ _h(vc * bc[:, :, None]))[:, :n].transpose(0, 1).to(v.dtype)
    return w, u, kn


@pytest.mark.parametrize("lens,hk,r,dk,slow", [([1, 63, 130, 64], 1, 2, 128, False), ([263], 2, 3, 128, True),
                                               ([70, 5], 2, 2, 32, False)])
def test_merge_form_matches_twin(lens, hk, r, dk, slow):
    """The block-merge inverse with fp16 operands (the kernel's numerics; slow decay: long memories) is within the
    fp16 bound of the exact triangular solve."""
    gen = torch.Generator().manual_seed(1)
    _, k, v, g, beta, _, qsl, _, _ = _case(lens, hk, r, dk, dk, torch.float16, gen, slow_decay=slow)
    w, u, _ = merge_form(k, v, g, beta, qsl)
    w_ref, u_ref, _ = ref.chunk_wy(k, v, g, beta, qsl)
    assert _rel(w, w_ref) < FP16_TOL / 5 and _rel(u, u_ref) < FP16_TOL / 5


@pytest.mark.gpu
# the 27B's heads on 1K tokens (16 chunks x 48 heads: m8n8k4 is emulated there) and on ragged tails; dk 32
@pytest.mark.parametrize("lens,hk,r,dk,l2", [([1024], 16, 3, 128, True), ([129, 1, 63, 200], 16, 3, 128, True),
                                             ([70, 5, 129], 2, 2, 32, False)], ids=["27b_1k", "27b_tails", "dk32"])
def test_wy_sm70_gpu_matches_twin(lens, hk, r, dk, l2):
    gen = torch.Generator().manual_seed(len(lens) + dk)
    _, k, v, g, beta, _, qsl, _, _ = _case(lens, hk, r, dk, dk, torch.float16, gen, device="cuda")
    if not l2:   # keys of about unit norm (|k|^2 ~ dk makes (I + A)^-1 overflow fp16)
        k = (k.float() * dk ** -0.5).half()
    chunks = [-(-n // 64) for n in lens]
    cu, nt = _qsl(chunks, "cuda"), sum(chunks)
    w, u, kn, launch = wy_launch_sm70(k, v, g, beta, qsl, cu, len(lens), nt, l2)
    for x in (w, u, kn):
        x.fill_(float("nan"))
    launch()
    # the sliced tl.dot WY of the same row (compiled for this GPU: mma / wgmma, not FMA) on the same inputs
    row = dataclasses.replace(gdn_table.TABLE[70], wy_hmma=False)
    w_dot, u_dot, _, launch_dot = gdr.wy_launch(k, v, g, beta, qsl, cu, len(lens), nt, l2, row)
    launch_dot()
    torch.cuda.synchronize()
    w_ref, u_ref, kn_ref = ref.chunk_wy(k, v, g, beta, qsl, l2)
    e = [_rel(w, w_ref), _rel(u, u_ref), _rel(w_dot, w_ref), _rel(u_dot, u_ref)]
    print(f"\nWY sm_70 HMMA lens={lens} dk={dk}: rel err w {e[0]:.2e} u {e[1]:.2e} "
          f"(tl.dot WY {e[2]:.2e} {e[3]:.2e})")
    torch.testing.assert_close(kn, kn_ref, rtol=1e-5, atol=1e-6)
    assert max(e) < FP16_TOL


def _acc_map(m):
    """A [64, 64] matrix on the m8n8k4 accumulator map [mb, nb, h, l, i] (common/mma884.py's C map)."""
    mb, nb, h, ll, i = torch.meshgrid(*(torch.arange(n) for n in (8, 8, 2, 4, 8)), indexing="ij")
    return m[8 * mb + (ll & 1) + (i & 2) + 4 * h, 8 * nb + (i & 4) + (ll & 2) + (i & 1)]


def _staged(m, b_operand):
    """A [64, 64] matrix in the A staging order [(step, mb), h, l, k] (A[8 mb + 4 h + l, 8 step + k]) or the B one
    [(step, nb), h, l, k] (B[8 step + k, 8 nb + 4 h + l])."""
    step, blk, h, ll, k = torch.meshgrid(*(torch.arange(n) for n in (8, 8, 2, 4, 8)), indexing="ij")
    rc = (8 * step + k, 8 * blk + 4 * h + ll) if b_operand else (8 * blk + 4 * h + ll, 8 * step + k)
    return m[rc].reshape(64, 2, 4, 8)


def test_stage_permutations_put_the_accumulator_in_operand_order():
    """The register permutations the kernel stages its tiles with (accumulator map -> A / B staging order), run on
    torch tensors: gl.reshape / gl.permute have torch's logical semantics, whatever layout Gluon gives the result.
    The A one is chunk_o_sm70's _to_a_stage (GPU-tested there), which checks this test's staging convention."""
    m = torch.arange(64 * 64).reshape(64, 64)
    x = _acc_map(m)
    a = x.reshape(8, 8, 2, 2, 2, 2, 2, 2).permute(1, 0, 2, 6, 4, 5, 3, 7).reshape(64, 2, 4, 8)   # _to_a_stage
    b = x.reshape(8, 8, 2, 2, 2, 2, 2, 2).permute(*B_STAGE_PERM).reshape(64, 2, 4, 8)   # to_b_stage
    assert torch.equal(a, _staged(m, False)) and torch.equal(b, _staged(m, True))


def test_b_stage_kernel_uses_the_tested_permutation():
    """The kernel spells to_b_stage's permutation as a literal (Triton 3.6's gl.permute refuses a constexpr
    tuple); it must be the one the staging test above checks."""
    import inspect

    from catengine.kernels.gdn import chunk_wy_sm70
    src = inspect.getsource(chunk_wy_sm70.to_b_stage.fn)
    assert f"gl.permute(x, {list(B_STAGE_PERM)})" in src
