"""The row statistics of the sm_70 attention's online softmax (attention/softmax_sm70.py), alone.

CPU: the PTX of the probe kernel (softmax_probe.py) at every tile of paged_sm70's tables reduces a row only
across the lanes that hold its columns (lane bits 1 and 3: ``shfl.bfly`` 2 and 8; with column warps a second,
cross-warp stage adds masks below the warp count). Triton 3.6 reducing a [rows, cols] relabelling of the tile
emitted 2 and 4 (mixing rows 8 apart), which is what made the first kernel's outputs off by one factor per row;
bench/aot_triton_versions.sh runs this file under 3.5 and 3.6 as well.
GPU: the probe's row max, row sum, broadcast of a row vector back onto the tile and P's staging for PV against
torch, at every tile and with fully masked columns and rows.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from .softmax_probe import TILES


def test_row_reductions_shuffle_only_across_columns():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # a real build, not the interpreter
    out = subprocess.run([sys.executable, "-m", "tests.kernels.attention.softmax_probe", "70"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["tile"] for r in got] == [list(t) for t in TILES]
    for r in got:
        bm, bn, wm, wn = r["tile"]
        masks = set(r["bfly"])
        # lanes 1 and 3 are the column bits (l2, nb); 4 and 16 would mix rows (mb, h)
        assert {2, 8} <= masks and not masks & {4, 16}, r
        if wn == 1:
            assert masks == {2, 8}, r
        else:   # the cross-warp stage reduces wn partials over neighbouring lanes
            assert masks - {2, 8} <= {1 << b for b in range(wn.bit_length() - 1)}, r


@pytest.mark.gpu
@pytest.mark.parametrize("bm,bn,wm,wn", TILES, ids=str)
def test_gpu_softmax_probe(bm, bn, wm, wn):
    from .softmax_probe import softmax_probe_kernel
    gen = torch.Generator(device="cuda").manual_seed(bm * bn + wn)
    s = torch.randn(bm, bn, generator=gen, device="cuda") * 4
    s[:, bn - 5:] = float("-inf")          # masked keys (a tail tile)
    s[1, :] = float("-inf")                 # a row that sees no key yet: finite max, l = 0, no NaN
    s[1, 0] = -1e30
    w = torch.rand(bm, generator=gen, device="cuda") + 0.5
    m, l = (torch.full((bm,), float("nan"), device="cuda") for _ in range(2))
    o, p = (torch.full((bm, bn), float("nan"), device="cuda") for _ in range(2))
    softmax_probe_kernel[(1,)](s, w, m, l, o, p, BM=bm, BN=bn, WM=wm, WN=wn, num_warps=wm * wn)
    m_want = s.amax(1)
    p_want = torch.exp2(s - m_want[:, None])
    torch.testing.assert_close(m, m_want, rtol=0, atol=0)
    torch.testing.assert_close(l, p_want.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o, torch.where(s.isfinite(), s, 0.0) * w[:, None], rtol=1e-6, atol=1e-6)
    # p is staged as fp16: exact against the rounded reference
    torch.testing.assert_close(p, p_want.half().float(), rtol=0, atol=0)
