"""bench/aot_table.py's report on synthetic rows (the builds themselves are the AOT suite's, tests/kernels/test_aot.py;
the table runs on the device, where Triton 3.6's cuobjdump reads sm_70 SASS)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import aot_table as at  # noqa: E402


def _row(**kw):
    row = {"module": "w4a16.gemm_sm70", "kernel": "w4a16_gemm_sm70_kernel", "name": "16x128x64 g128", "warps": 4,
           "stages": 1, "error": None, "gluon": True, "shared": 12288, "mma884": True, "forbidden": [],
           "registers": 96, "stack": 0, "sass_hmma": 64, "local_ops": 0}
    return {**row, **kw}


def test_problems_flag_what_the_closing_note_checks():
    assert at.problems(_row()) == []
    assert at.problems(_row(gluon=False, mma884=False, sass_hmma=0, stack=424, local_ops=20)) == []  # tl.dot: FMA
    assert "96 KB" in at.problems(_row(shared=100000))[0]
    assert "PTX" in at.problems(_row(mma884=False))[0] and "SASS" in at.problems(_row(sass_hmma=0))[0]
    assert at.problems(_row(forbidden=["cp.async"])) and at.problems({"error": "boom"}) == ["boom"]


def test_render_lists_every_row_and_counts_spills_and_missing_sass():
    text = at.render([_row(), _row(gluon=False, mma884=False, sass_hmma=None, local_ops=None, stack=424,
                                   kernel="gdn_chunk_wy_kernel", module="gdn.chunk")], "synthetic")
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 3 and "| yes (64) | 96 | 0 | 0 |" in lines[1] and "| no (FMA) | - | 96 | 424 | - |" in lines[2]
    assert "2 configurations, 2 built; 1 HMMA.884 (Gluon) configurations, 1 with mma.m8n8k4 in the PTX, 1 with " \
           "HMMA.884 in the SASS" in text and "1 with a stack frame" in text and "0 with problems" in text
