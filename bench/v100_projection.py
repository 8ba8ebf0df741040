"""V100 projection from sm_70 SASS, never a claim of measured V100 speed (issue 18).

    PYTHONPATH=. python3 bench/v100_projection.py [--out DIR] [--budget-s 200] [--kernels-only]
    PYTHONPATH=. python3 bench/v100_projection.py --dry-cpu [--factor 4.27] [--kernels-only] [--only attn,gdn_chunk]
        # CPU: record (the V100's grids and HMMA.884 choices, arch.RECORD_ONLY_CPU) + compile + count, no timing;
        # sm_70 SASS needs CATENGINE_SM70_CUOBJDUMP pointing at Triton 3.5/3.6's cuobjdump where Triton is 3.9
    PYTHONPATH=. python3 bench/v100_projection.py --from-raw OUT/v100_projection_raw.json   # a run's tables again

For every op and shape of the registry (bench/v100_kernels.py) the launches are recorded three times: on the
H200's own sm_90 row (run, then timed: CUDA-graph replays over three input copies), on the sm_70 row as a V100 gets it (HMMA.884 where the
family has an sm_70 kernel; recorded, not run) and on the sm_70 row without its HMMA kernels (tl.dot, which is
FMA on sm_70; recorded, not run). Each recorded configuration is compiled ahead of time through
catengine/kernels/common/aot.py for its architecture, disassembled (Triton's cuobjdump; 3.6's reads sm_70) and
counted by catengine/tools/sass_model.py with the trip counts of the shape; the V100 time is the largest of the
issue / pipe / tensor-core / shared-memory / DRAM bounds (80 SMs x 4 schedulers x 1.53 GHz, 125 TFLOP/s,
900 GB/s), and, latency-aware (sass_model.launch_time's terms), also of the rounds of resident programs times
a global load's latency per loop trip, the L2's bandwidth, plus a fixed cost per launch. The same model on the
sm_90 SASS with the H200's rates measured in this run predicts the H200 time; ``calib`` is predicted / measured
- 1 on the H200 (negative: the model is optimistic). One constant is fitted: the loaded-latency factor (a global
load's latency under load over its public unloaded figure), on the *model-step* cases only (the shapes of the
27B and 35B-A3B steps); the per-kernel table's shapes are not in that fit (its calib is held out; a shape that
is in both is marked), and the step table's calib is in-sample. The launch cost is measured, not fitted (an
empty kernel replayed from a CUDA graph, as the ops are). The HMMA.884 kernels are emulated on the H200
(never timed), so an HMMA row's calibration is that of the family's tl.dot kernel at the same shape. Tables go
to stdout and to OUT/v100_projection.md (OUT: --out or $OUT).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import v100_kernels as reg  # noqa: E402
from v100_record import arch_row, recording  # noqa: E402
from v100_tables import PATHS, _case_id, latency_aware, results_from_raw, tables  # noqa: E402,F401

from catengine.tools import sass_model as sm  # noqa: E402

CC = {"h200": 90, "fma": 70, "hmma": 70}


# ---------------------------------------------------------------- ahead-of-time compile (worker processes)
def compile_sass(module: str, cfg, cc: int) -> dict:
    """Worker: compile one recorded configuration for sm_cc through aot.py and return its SASS."""
    import importlib

    from catengine.kernels.common import aot
    try:
        k = aot.build(importlib.import_module(module), cfg, cc)
        sass = aot.disassemble(k.asm["cubin"], cc)
        return {"sass": sass, "shared": k.metadata.shared, "gluon": aot._is_gluon(getattr(
            importlib.import_module(module), cfg.kernel)), "error": None if sass else "no disassembler for sm_%d" % cc}
    except Exception as e:   # a config that does not build is a row of the table, not the end of the run
        return {"sass": None, "shared": None, "gluon": None, "error": f"{type(e).__name__}: {str(e)[:300]}"}


def config_key(launch, cc: int) -> str:
    cfg = launch.aot_config()
    return json.dumps([launch.module, cfg.kernel, cfg.signature, {k: repr(v) for k, v in cfg.constexprs.items()},
                       cfg.num_warps, cfg.num_stages, cfg.divisible_by_16, cc], sort_keys=True)


# ---------------------------------------------------------------- recording and timing
def record_case(op_key: str, shape: dict, time_it: bool, bench_ms) -> dict:
    op = reg.OPS[op_key]
    call = op.make(shape)
    out = {}
    with recording(run=time_it) as l90:
        call()
    out["h200"] = l90
    with arch_row(70), recording(run=False) as l70:
        call()
    out["hmma"] = l70
    with arch_row(70), reg.fma_path(), recording(run=False) as l70f:
        call()
    out["fma"] = l70f
    out["ms"], out["timer"] = time_call(op, shape, call, bench_ms) if time_it else (None, None)
    del call
    return out


# weight copies a timed case cycles over: the H200's 50 MB L2 holds one 27B gate_up (45 MB of int4), and the
# model's DRAM bound assumes it does not
COPIES = 3


def time_call(op, shape: dict, call, bench_ms) -> tuple[float, str]:
    """(ms, how) for one call: replayed from a CUDA graph over COPIES input copies, so that neither the host's
    launch overhead (the compile workers share its CPU) nor a warm L2 is in the time; with CUDA events around
    single calls where the op cannot be captured."""
    from common import graph_ms, rotated
    calls = [call] + [op.make(dict(shape)) for _ in range(COPIES - 1)]
    try:
        return graph_ms(rotated(calls, lambda c: c())), "graph"
    except Exception:
        torch.cuda.synchronize()
        return bench_ms(call), "events"


@triton.jit
def _empty(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 0)


def launch_cost_ms(bench_ms) -> tuple[float, float]:
    """(floor, per launch) in ms, for the ops' own timers: replayed from a CUDA graph, an empty kernel costs one
    launch and there is no floor (the graph's start is spread over its calls); with CUDA events around single
    calls, an empty kernel timed alone is the floor plus one launch (``events_floor_ms``)."""
    from common import graph_ms, rotated
    x = torch.zeros(1, device="cuda")
    return 0.0, graph_ms(rotated([x], lambda t: _empty[(1,)](t)))


def events_floor_ms(bench_ms, launch_ms: float) -> float:
    x = torch.zeros(1, device="cuda")
    return max(0.0, bench_ms(lambda: _empty[(1,)](x)) - launch_ms)


# ---------------------------------------------------------------- the model over recorded launches
def project(launches, shape, compiled, cc, chip) -> dict:
    """Seconds of a list of launches on chip (roofline: the largest throughput bound per launch), the binding
    resource of the longest, what was not modelled, and each launch's LaunchModel for the latency-aware time."""
    total, worst, notes, models, raw = 0.0, (0.0, "", ""), [], [], []
    for ln in launches:
        if ln.programs == 0:      # an empty grid (a window with no chunks): launched, nothing runs
            continue
        res = compiled.get(config_key(ln, cc))
        if res is None or res["sass"] is None:
            notes.append(f"{ln.kernel}: {res['error'] if res else 'not compiled'}")
            continue
        try:
            funcs = sm.parse_sass(res["sass"])
            instrs = funcs.get(ln.kernel) or next(iter(funcs.values()), [])
            trips, modelled = reg.trips_of(ln, shape)
            counts = sm.count(instrs, trips)
            if not modelled and counts.loops:
                notes.append(f"{ln.kernel}: loops without trip counts (counted once)")
            depth = sm.prefetch_depth(cc, ln.num_stages, bool(res.get("gluon")))
            lm = sm.launch_model(counts, ln.programs, ln.num_warps, chip, reg.dram_bytes(ln, shape),
                                 sm.registers(instrs), res.get("shared") or 0, depth)
            t, res_name = sm.bound_time(lm.throughput)
        except Exception as e:   # one kernel the model cannot take is a note, not the end of the tables
            notes.append(f"{ln.kernel}: {type(e).__name__}: {str(e)[:100]}")
            continue
        total += t
        models.append((ln.kernel, lm))
        raw.append({"kernel": ln.kernel, "programs": ln.programs, "warps": ln.num_warps, "regs": sm.registers(instrs),
                    "shared": res.get("shared") or 0, "dram": reg.dram_bytes(ln, shape), "prefetch": depth,
                    "cc": cc, "stages": ln.num_stages, "gluon": bool(res.get("gluon")),
                    "counts": dataclasses.asdict(counts)})
        if t > worst[0]:
            worst = (t, res_name, ln.kernel)
    return {"s": total, "bound": worst[1], "kernel": worst[2], "notes": notes, "models": models, "raw": raw}


def has_hmma(launches, compiled) -> bool:
    return any((compiled.get(config_key(ln, 70)) or {}).get("gluon") for ln in launches)


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop timing new cases after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=215.0,
                    help="write the tables after this many seconds, with what has compiled by then")
    ap.add_argument("--kernels-only", action="store_true", help="the per-kernel table only, no model steps")
    ap.add_argument("--only", default="", help="comma-separated registry ops (w4a16, moe, attn, gdn_chunk, gdn_rec)")
    ap.add_argument("--dry-cpu", action="store_true", help="CPU: record and compile, no timing, no calibration")
    ap.add_argument("--jobs", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--factor", type=float, default=None, help="use this loaded-latency factor instead of fitting "
                    "one (a dry run has no H200 times to fit it on; session 10's fit was 4.27)")
    ap.add_argument("--from-raw", default="", help="rebuild the tables from a run's v100_projection_raw.json with "
                    "this tree's model (no GPU, no compiles; the configuration table is the run's own)")
    args = ap.parse_args()
    t0 = time.time()
    os.environ.pop("TRITON_INTERPRET", None)   # the workers compile; nothing here runs in the interpreter
    dry = args.dry_cpu
    raw_in = None
    if args.from_raw:
        with open(args.from_raw) as f:
            raw_in = json.load(f)
        chip90 = sm.Chip(**raw_in["chip90"])
        floor_ms, launch_ms, ev_floor_ms = raw_in["floor_ms"], raw_in["launch_ms"], raw_in["events_floor_ms"]
        header = raw_in.get("header", "a run's raw dump") + f"; tables rebuilt from {os.path.basename(args.from_raw)}"
    elif dry:
        reg.DEVICE = "cpu"
        # the sm_70 launchers' "CUDA only" checks let the CPU tensors through: the HMMA.884 launches are recorded
        from catengine.kernels.common import arch as arch_mod
        arch_mod.RECORD_ONLY_CPU = True
        chip90 = sm.h200(989e12, 4.2e12)
        bench_ms = None
        floor_ms, launch_ms, ev_floor_ms = 0.0, 0.0, 0.0
        header = ("CPU dry run: launches recorded on CPU tensors with each row's reference SM count (V100 80, H200 "
                  "132), no H200 timing")
    else:
        from common import bench_ms as _bench, copy_bandwidth_gbs, device_header, matmul_tflops
        props = torch.cuda.get_device_properties(0)
        clock = getattr(props, "clock_rate", 0) * 1e3 or 1.98e9
        bench_ms = lambda fn: _bench(fn, warmup_ms=5, rep_ms=20)   # noqa: E731
        floor_ms, launch_ms = launch_cost_ms(bench_ms)
        ev_floor_ms = events_floor_ms(bench_ms, launch_ms)
        chip90 = sm.h200(matmul_tflops() * 1e12, copy_bandwidth_gbs() * 1e9, clock, props.multi_processor_count,
                         launch_s=launch_ms * 1e-3)
        header = (device_header() + f", model clock {clock / 1e9:.2f} GHz, launch {launch_ms * 1e3:.1f} us in a "
                  f"graph, events floor {ev_floor_ms * 1e3:.1f} us")
    if raw_in is None:
        header += f", Triton {triton.__version__}, torch {torch.__version__}"

    cases = [(k, s, "kernel") for k, s in reg.KERNEL_SHAPES]
    steps = []
    if not args.kernels_only:
        for preset, short in (("qwen3.5-27b", "27B"), ("qwen3.6-35b-a3b", "35B-A3B")):
            steps.append((short, "prefill 8K", 8192, 1, reg.model_step(preset, 8192, 1, 8192)))
            for b in (1, 8, 32):
                steps.append((short, f"decode B={b} ctx 8K", 1 * b, 1, reg.model_step(preset, 1, b, 8192)))
        cases += [(k, s, "step") for *_, rows in steps for k, s, _ in rows]
    if args.only:
        keep = set(args.only.split(","))
        cases = [c for c in cases if c[0] in keep]
        steps = [st for st in steps if all(k in keep for k, _, _ in st[4])]
    v100 = dataclasses.replace(sm.V100, launch_s=launch_ms * 1e-3)   # assumed: the H200's launch cost
    if raw_in is not None:
        compiled, results = {}, results_from_raw(raw_in, chip90, v100)
    else:
        # configurations compile in worker processes while the main process records and times the next cases
        pool = cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"))
        jobs: dict = {}

        def submit(rec):
            for path in PATHS:
                for ln in rec.get(path, []):
                    key = config_key(ln, CC[path])
                    if key not in jobs:
                        jobs[key] = pool.submit(compile_sass, ln.module, ln.aot_config(), CC[path])

        seen, records = {}, {}
        for op_key, shape, _ in cases:
            cid = _case_id(op_key, shape)
            if cid in seen:
                continue
            seen[cid] = shape
            try:
                time_it = not dry and time.time() - t0 < args.budget_s
                records[cid] = record_case(op_key, shape, time_it, bench_ms)
                submit(records[cid])
            except Exception as e:
                records[cid] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            if not dry:
                torch.cuda.empty_cache()
        print(f"recorded {len(records)} cases in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        compiled = {}
        try:
            for f in cf.as_completed(list(jobs.values()), timeout=max(1.0, args.deadline_s - (time.time() - t0))):
                pass
        except cf.TimeoutError:
            pass
        for key, f in jobs.items():
            compiled[key] = f.result() if f.done() else {"sass": None, "shared": None, "gluon": None,
                                                         "error": "compile not finished by --deadline-s"}
        for proc in list(getattr(pool, "_processes", {}).values()):   # workers still compiling past the deadline
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        print(f"compiled {sum(1 for r in compiled.values() if r['sass'])} of {len(compiled)} configurations "
              f"in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

        results = {}
        for cid, rec in records.items():
            if "error" in rec:
                results[cid] = {"error": rec["error"]}
                continue
            shape = seen[cid]
            try:
                r = {p: project(rec[p], shape, compiled, CC[p], chip90 if p == "h200" else v100) for p in PATHS}
            except Exception as e:
                results[cid] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                continue
            r["ms"] = rec["ms"]
            r["timer"] = rec["timer"]
            r["floor_ms"] = ev_floor_ms if rec["timer"] == "events" else floor_ms
            r["hmma_present"] = has_hmma(rec["hmma"], compiled)
            r["calib_roof"] = (r["h200"]["s"] * 1e3 / rec["ms"] - 1) if rec["ms"] else None
            results[cid] = r

    text, factor, fit_ids, kernel_ids = tables(cases, steps, results, compiled, header, launch_ms, ev_floor_ms,
                                              COPIES, args.factor)
    os.makedirs(args.out, exist_ok=True)
    # what the model saw, per case and path, so that a model change can be re-evaluated without a GPU
    with open(os.path.join(args.out, "v100_projection_raw.json"), "w") as f:
        json.dump({"header": header, "floor_ms": floor_ms, "events_floor_ms": ev_floor_ms, "launch_ms": launch_ms, "factor": factor,
                   "chip90": dataclasses.asdict(chip90),
                   "fit_ids": fit_ids, "kernel_ids": sorted(kernel_ids),
                   "cases": {cid: {"ms": r.get("ms"), "error": r.get("error"), "timer": r.get("timer"),
                                   "floor_ms": r.get("floor_ms"), "hmma_present": r.get("hmma_present"),
                                   "notes": {p: r[p]["notes"] for p in PATHS if p in r},
                                   "roof": {p: [r[p]["s"], r[p]["bound"], r[p]["kernel"]] for p in PATHS if p in r},
                                   **{p: r[p]["raw"] for p in PATHS if p in r}} for cid, r in results.items()}}, f)
    with open(os.path.join(args.out, "v100_projection.md"), "w") as f:
        f.write(text + "\n")
    # the configuration table first, so that the projection tables end the output (a tail shows them)
    cut = text.index("\n## Configurations compiled")
    print(text[cut:] + "\n\n" + text[:cut], flush=True)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
