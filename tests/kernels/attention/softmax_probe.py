"""A one-program probe of the sm_70 softmax's row statistics (attention/softmax_sm70.py), used by
test_softmax_sm70.py: on the GPU for its values, on the CPU for the shuffles its PTX issues (``python -m
tests.kernels.attention.softmax_probe CC`` prints one JSON line per tile: the ``shfl.bfly`` lane masks)."""
import json
import re
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from catengine.kernels.attention.softmax_sm70 import (frag_bits, frag_merge, p_to_a_stage, row_ids, row_max,
                                                      row_sum, rows_bcast)
from catengine.kernels.common.aot import AotConfig
from catengine.kernels.common.mma884 import (a_smem_shape, acc_rows_cols, frag_layout, smem_layout, stage_index,
                                             stage_layout_a)

# every (BLOCK_M, BLOCK_N, WM, WN) of paged_sm70's tables: PREFILL_SM70 and what decode_launch picks
TILES = [(128, 64, 8, 1), (64, 32, 4, 2), (16, 64, 1, 4), (32, 64, 2, 4), (64, 64, 4, 2)]


@gluon.jit
def softmax_probe_kernel(s_in, w_in, m_out, l_out, o_out, p_out, BM: gl.constexpr, BN: gl.constexpr,
                         WM: gl.constexpr, WN: gl.constexpr):
    """s [BM, BN] (may hold -inf) read through the C map into a fragment tile; writes the row max m and
    l = sum exp2(s - m) per row, o = where(s finite, s, 0) * w[row] through frag_merge and the C map, and
    p = exp2(s - m) through p_to_a_stage, shared memory and the A staging map: every piece the kernel's
    online softmax uses, with their rows checked against torch."""
    LF: gl.constexpr = frag_layout(WM, WN)
    rr, cc = acc_rows_cols(BM, BN, WM, WN)
    s = gl.load(s_in + rr * BN + cc)
    s8 = frag_bits(s, BM, BN)
    m = row_max(s8)
    p = gl.exp2(s8 - rows_bcast(m))
    l = row_sum(p)
    r_m = row_ids(BM, BN, WM, WN)
    gl.store(m_out + r_m, m)
    gl.store(l_out + r_m, l)
    w = gl.load(w_in + r_m)
    o = frag_merge(gl.where(s8 > float("-inf"), s8, 0.0) * rows_bcast(w), BM, BN, LF)
    gl.store(o_out + rr * BN + cc, o)
    s_p = gl.allocate_shared_memory(gl.float16, a_smem_shape(BM, BN), smem_layout())
    s_p.store(p_to_a_stage(p.to(gl.float16), BM, BN))
    # [(step, mb), h, l, k]: row 8 mb + 4 h + l, key 8 step + k
    d, h, ll, k = stage_index(BN // 8 * (BM // 8), stage_layout_a(WM * WN))
    b_p = s_p.load(stage_layout_a(WM * WN))
    gl.store(p_out + (8 * (d % (BM // 8)) + 4 * h + ll) * BN + 8 * (d // (BM // 8)) + k, b_p.to(gl.float32))


def aot_configs(cc: int) -> list[AotConfig]:
    sig = {n: "*fp32" for n in ("s_in", "w_in", "m_out", "l_out", "o_out", "p_out")}
    sig.update({c: "constexpr" for c in ("BM", "BN", "WM", "WN")})
    return [AotConfig("softmax_probe_kernel", sig, dict(BM=bm, BN=bn, WM=wm, WN=wn), wm * wn, 1,
                      f"softmax probe {bm}x{bn} w{wm}x{wn}") for bm, bn, wm, wn in TILES]


def _main(cc: int) -> None:
    from catengine.kernels.common.aot import build
    for cfg in aot_configs(cc):
        ptx = build(sys.modules[__name__], cfg, cc).asm["ptx"]
        masks = sorted({int(x) for x in re.findall(r"shfl\.sync\.bfly\.b32\s+\S+,\s*\S+,\s*(\d+),", ptx)})
        print(json.dumps({"tile": list(cfg.constexprs.values()), "bfly": masks}), flush=True)


if __name__ == "__main__":
    _main(int(sys.argv[1]))
