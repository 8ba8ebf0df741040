"""bench/v100_tables.py on a synthetic raw dump (no GPU, no compiler): the loaded-latency factor is fitted on the
model-step cases only, the per-kernel cases are held out, and the tables rebuilt from the dump report both."""
import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import v100_tables as vt  # noqa: E402

from catengine.tools import sass_model as sm  # noqa: E402

from .test_sass_model import SNIPPET  # noqa: E402

COUNTS = sm.count(sm.parse_sass(SNIPPET)["toy_kernel"], (10,))


def _launch(programs):
    return {"kernel": "toy_kernel", "programs": programs, "warps": 4, "regs": 108, "shared": 0, "dram": 1e5,
            "prefetch": 1, "counts": dataclasses.asdict(COUNTS)}


def _case(programs, chip, factor, skew=1.0):
    """A raw case whose H200 time is the model's at ``factor`` (times ``skew``)."""
    ln = _launch(programs)
    lm = sm.launch_model(COUNTS, programs, 4, chip, ln["dram"], ln["regs"], ln["shared"])
    return {"ms": lm.time(factor)[0] * 1e3 * skew, "error": None, "timer": "graph", "floor_ms": 0.0,
            "hmma_present": True, "notes": {p: [] for p in vt.PATHS},
            "roof": {p: [sm.bound_time(lm.throughput)[0], "smem", "toy_kernel"] for p in vt.PATHS},
            **{p: [ln] for p in vt.PATHS}}


def test_factor_fits_on_the_steps_and_the_kernel_row_is_held_out():
    chip = sm.h200(900e12, 4.2e12, launch_s=1e-6)
    kernel = ("w4a16", {"M": 8, "K": 5120, "N": 17408, "label": "M=8 5120->17408"})
    steps = [("w4a16", {"M": m, "K": 5120, "N": 1024, "label": f"step M={m}"}) for m in (1, 2, 4)]
    raw = {"chip90": dataclasses.asdict(chip), "cases": {}}
    for (op, shape), programs in zip(steps, (132, 1320, 13200)):
        raw["cases"][vt._case_id(op, shape)] = _case(programs, chip, 3.0)
    # the held-out case is 25% slower than the model says: its calib must show it, and not move the fit
    raw["cases"][vt._case_id(*kernel)] = _case(264, chip, 3.0, skew=1.25)
    v100 = dataclasses.replace(sm.V100, launch_s=1e-6)
    results = vt.results_from_raw(raw, chip, v100)
    cases = [(*kernel, "kernel")] + [(op, s, "step") for op, s in steps]
    text, factor, fit_ids, kernel_ids = vt.tables(cases, [], results, {}, "synthetic", 1e-3, 0.0, 3)
    assert factor == pytest.approx(3.0, rel=0.02)
    assert set(fit_ids) == {vt._case_id(op, s) for op, s in steps} and vt._case_id(*kernel) in kernel_ids
    row = next(line for line in text.splitlines() if line.startswith("| W4A16") and "M=8 5120->17408" in line)
    assert "| -20% |" in row and "in the fit set" not in row          # 1 / 1.25 - 1
    assert "Fitted: loaded-latency factor 3.0" in text and "AT THE BOUND" not in text


def test_tables_print_each_kernel_of_the_hmma_path_its_spills_and_the_targets():
    """A mixed HMMA path (a Gluon kernel beside a tl.dot one) is broken down per kernel, local-memory bytes are
    printed beside the kernel that moves them, the % of 900 GB/s divides the op's own bytes (no split-K partials),
    and the targets table reports the decode GEMM against 80% of 900 GB/s."""
    chip = sm.h200(900e12, 4.2e12, launch_s=1e-6)
    shape = {"M": 32, "K": 5120, "N": 17408, "label": "M=32 5120->17408"}
    case = _case(272, chip, 3.0)
    spilling = dict(_launch(80), kernel="wy_kernel", gluon=False,
                    counts=dict(dataclasses.asdict(COUNTS), local_bytes=1024.0))
    case["hmma"] = [dict(_launch(272), gluon=True, dram=9e9), spilling]   # dram: not what the % divides
    results = vt.results_from_raw({"chip90": dataclasses.asdict(chip), "cases": {vt._case_id("w4a16", shape): case}},
                                  chip, dataclasses.replace(sm.V100, launch_s=1e-6))
    text, *_ = vt.tables([("w4a16", shape, "kernel")], [], results, {}, "synthetic", 1e-3, 0.0, 3, given_factor=4.0)
    row = next(line for line in text.splitlines() if line.startswith("| W4A16") and "M=32 5120" in line)
    assert "toy_kernel" in row and "(HMMA.884)" in row and "wy_kernel" in row and "(CUDA cores, spills" in row
    assert f"{80 * 4 * 1024 / 1e9:,.2f} GB through local memory" in row
    r = results[vt._case_id("w4a16", shape)]
    want = (5120 * 17408 / 2 + 4 * 40 * 17408 + 2 * 32 * (5120 + 17408)) / r["hmma"]["lat"]["s"] / 900e9
    assert f"{100 * want:.0f}% of 900 GB/s" in row
    assert "Given (--factor), not fitted: loaded-latency factor 4.00" in text
    target = next(line for line in text.splitlines() if line.startswith("| decode GEMM, M = 8-64"))
    assert f"| {want:.0%} of 900 GB/s | >= 80% | {'yes' if want >= 0.8 else 'NO'} |" in target
