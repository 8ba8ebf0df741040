"""Issue 18's closing-note AOT table: every sm_70 configuration of every kernel that multiplies matrices, built ahead
of time through catengine/kernels/common/aot.py (the AOT suite's own lists, ``aot_configs(70)``), with its shared
memory, whether HMMA.884 is in its PTX (``mma.sync.aligned.m8n8k4``) and in its SASS, the registers, the stack frame
and the local-memory instructions (spills).

    PYTHONPATH=. python3 bench/aot_table.py [--out DIR] [--jobs N] [--deadline-s 55] [--only SUBSTRING]

Registers and stack come from the cubin's ELF (aot.cubin_resources: no disassembler needed, so Triton 3.9 gives
them too). The SASS columns (HMMA.884 in the SASS, its static count, STL/LDL) need a disassembler that reads sm_70:
Triton 3.5/3.6's cuobjdump does, 3.9's refuses it (point CATENGINE_SM70_CUOBJDUMP at a 3.6 copy); without one they
print "-". The tl.dot kernels are listed too: they are the sm_70 row's fall-backs (and GDN's WY stage, which has no
HMMA.884 kernel): FMA on sm_70 from Triton 3.3 on, so "no" in the HMMA columns is their expected value. Exits
non-zero if a configuration fails to build, needs more than 96 KB of shared memory, or is a Gluon kernel without
HMMA.884 in its PTX (or in its SASS where that is read).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the HMMA.884 (Gluon) modules, then the tl.dot modules whose kernels multiply matrices on the sm_70 row
MODULES = (
    "catengine.kernels.common.gemm884",
    "catengine.kernels.w4a16.gemm_sm70",
    "catengine.kernels.moe.fused_sm70",
    "catengine.kernels.attention.paged_sm70",
    "catengine.kernels.gdn.chunk_h_sm70",
    "catengine.kernels.gdn.chunk_o_sm70",
    "catengine.kernels.w4a16.gemm",
    "catengine.kernels.moe.fused",
    "catengine.kernels.attention.paged",
    "catengine.kernels.gdn.chunk",
)
# kernels in those modules that multiply no matrices (GEMVs, reductions, chunk offsets): not in the table
NO_PRODUCT = ("splitk_reduce_kernel", "w4a16_gemv_kernel", "split_reduce_kernel", "combine_kernel",
              "moe_up_decode_kernel", "moe_down_decode_kernel", "gdn_chunk_offsets_kernel")
SM70_SHARED_LIMIT = 96 * 1024


def build_row(module: str, index: int) -> dict:
    """Worker: build configuration ``index`` of ``module.aot_configs(70)`` for sm_70 and read it back."""
    import re

    from catengine.kernels.common import aot
    mod = importlib.import_module(module)
    cfg = mod.aot_configs(70)[index]
    t0 = time.time()
    row = {"module": module.rsplit(".", 2)[-2] + "." + module.rsplit(".", 1)[-1], "kernel": cfg.kernel,
           "name": cfg.name, "warps": cfg.num_warps, "stages": cfg.num_stages, "error": None}
    try:
        k = aot.build(mod, cfg, 70)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return row
    ptx, cubin = k.asm["ptx"], k.asm["cubin"]
    sass = aot.disassemble(cubin, 70)
    fn = (aot.cubin_resources(cubin, k.metadata.name) if hasattr(k.metadata, "name") else
          aot.cubin_resources(cubin, cfg.kernel))
    row.update(gluon=aot._is_gluon(getattr(mod, cfg.kernel)), shared=k.metadata.shared,
               mma884=("mma.sync.aligned.m8n8k4" in ptx),
               forbidden=[s for s in aot.SM70_FORBIDDEN_PTX if s in ptx],
               registers=fn["registers"], stack=fn["stack"],
               sass_hmma=None if sass is None else len(re.findall(r"\bHMMA\.884", sass)),
               local_ops=None if sass is None else len(re.findall(r"\b(?:STL|LDL)(?:\.\w+)*\s", sass)),
               seconds=round(time.time() - t0, 1))
    return row


def problems(row: dict) -> list[str]:
    if row.get("error"):
        return [row["error"]]
    out = []
    if row["shared"] > SM70_SHARED_LIMIT:
        out.append(f"{row['shared']} B of shared memory > 96 KB")
    if row["forbidden"]:
        out.append(f"PTX sm_70 lacks: {row['forbidden']}")
    if row["gluon"] and not row["mma884"]:
        out.append("a Gluon kernel without mma.sync.aligned.m8n8k4 in its PTX")
    if row["gluon"] and row["sass_hmma"] == 0:
        out.append("a Gluon kernel without HMMA.884 in its SASS")
    return out


def render(rows: list[dict], header: str) -> str:
    def cell(v):
        return "-" if v is None else str(v)
    lines = [f"# sm_70 AOT table ({header})", "",
             "| module | kernel | config | warps | shared B | HMMA.884 in PTX | HMMA.884 in SASS (static count) | "
             "registers | stack B | spill ops (STL/LDL) | problems |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['module']} | {r['kernel']} | {r['name']} | {r['warps']} | - | - | - | - | - | - | "
                         f"{r['error']} |")
            continue
        sass = "-" if r["sass_hmma"] is None else (f"yes ({r['sass_hmma']})" if r["sass_hmma"] else "no")
        lines.append(f"| {r['module']} | {r['kernel']} | {r['name']} | {r['warps']} | {r['shared']} | "
                     f"{'yes' if r['mma884'] else 'no (FMA)'} | {sass} | {cell(r['registers'])} | {cell(r['stack'])} | "
                     f"{cell(r['local_ops'])} | {'; '.join(problems(r)) or ''} |")
    built = [r for r in rows if not r.get("error")]
    gl = [r for r in built if r["gluon"]]
    spilled = [r for r in built if (r["stack"] or 0) > 0 or (r["local_ops"] or 0) > 0]
    lines += ["", f"{len(rows)} configurations, {len(built)} built; {len(gl)} HMMA.884 (Gluon) configurations, "
              f"{sum(r['mma884'] for r in gl)} with mma.m8n8k4 in the PTX, "
              + (f"{sum(bool(r['sass_hmma']) for r in gl)} with HMMA.884 in the SASS; "
                 if any(r["sass_hmma"] is not None for r in built) else "SASS not read (no sm_70 disassembler); ")
              + f"largest shared memory {max((r['shared'] for r in built), default=0)} B; "
              f"{len(spilled)} with a stack frame or local-memory instructions; "
              f"{sum(bool(problems(r)) for r in rows)} with problems."]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--deadline-s", type=float, default=600.0, help="print the table with what has built by then")
    ap.add_argument("--only", default="", help="modules whose name contains this")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)   # the workers compile; the interpreter's jit objects cannot be built
    import triton
    t0 = time.time()
    jobs = [(m, i, c) for m in MODULES if args.only in m
            for i, c in enumerate(importlib.import_module(m).aot_configs(70)) if c.kernel not in NO_PRODUCT]
    # the Gluon attention builds take longest: first, so that they do not finish last
    jobs.sort(key=lambda j: "paged_sm70" not in j[0])
    pool = cf.ProcessPoolExecutor(max(1, args.jobs), mp_context=mp.get_context("spawn"))
    futs = {pool.submit(build_row, m, i): (m, i, c) for m, i, c in jobs}
    try:
        for _ in cf.as_completed(futs, timeout=max(1.0, args.deadline_s - (time.time() - t0))):
            pass
    except cf.TimeoutError:
        pass
    rows = []
    for f, (m, i, c) in futs.items():
        if f.done() and f.exception() is None:
            rows.append(f.result())
        else:
            why = f"{type(f.exception()).__name__}: {f.exception()}" if f.done() else "not built by --deadline-s"
            rows.append({"module": m.rsplit(".", 2)[-2] + "." + m.rsplit(".", 1)[-1], "kernel": c.kernel,
                         "name": c.name, "warps": c.num_warps, "stages": c.num_stages, "error": why})
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    order = {m.rsplit(".", 2)[-2] + "." + m.rsplit(".", 1)[-1]: n for n, m in enumerate(MODULES)}
    rows.sort(key=lambda r: (order[r["module"]], r["kernel"], r["name"]))
    tool = os.environ.get("CATENGINE_SM70_CUOBJDUMP") or "Triton's own cuobjdump"
    text = render(rows, f"Triton {triton.__version__}, sm_70 SASS read by {tool}, {args.jobs} jobs, "
                        f"{time.time() - t0:.0f} s")
    print(text, flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "aot_table.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "aot_table.json"), "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(1 if any(problems(r) for r in rows) else 0)


if __name__ == "__main__":
    main()
