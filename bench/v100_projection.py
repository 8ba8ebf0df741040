"""V100 projection from sm_70 SASS, never a claim of measured V100 speed (issue 18).

    PYTHONPATH=. python3 bench/v100_projection.py [--out DIR] [--budget-s 200] [--kernels-only]
    PYTHONPATH=. python3 bench/v100_projection.py --dry-cpu      # CPU: record + compile + count, no timing

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

from catengine.tools import sass_model as sm  # noqa: E402

PATHS = ("h200", "fma", "hmma")     # sm_90 as run here; sm_70 without / with the HMMA.884 kernels
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


def _case_id(op_key, shape):
    return json.dumps([op_key, {k: v for k, v in shape.items() if k not in ("label", "touched")}], sort_keys=True)


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
                    "cc": cc, "stages": ln.num_stages,
                    "counts": dataclasses.asdict(counts)})
        if t > worst[0]:
            worst = (t, res_name, ln.kernel)
    return {"s": total, "bound": worst[1], "kernel": worst[2], "notes": notes, "models": models, "raw": raw}


FIT_RANGE = (0.25, 16.0)


def results_from_raw(raw: dict, chip90, v100) -> dict:
    """The per-case results of a run, rebuilt from its raw dump with this tree's sass_model (counts as counted
    then: a parser change needs a new run)."""
    out = {}
    for cid, c in raw["cases"].items():
        if c.get("error") or "h200" not in c:
            out[cid] = {"error": c.get("error") or "not in the dump"}
            continue
        r = {}
        for p in PATHS:
            chip = chip90 if p == "h200" else v100
            models = [(x["kernel"], sm.launch_model(sm.Counts(**x["counts"]), x["programs"], x["warps"], chip,
                                                    x["dram"], x["regs"], x["shared"], x.get("prefetch", 1)))
                      for x in c[p]]
            s_, bound, kernel = c["roof"][p]
            r[p] = {"s": s_, "bound": bound, "kernel": kernel, "notes": c["notes"][p], "models": models, "raw": c[p]}
        r.update(ms=c["ms"], timer=c["timer"], floor_ms=c["floor_ms"], hmma_present=c["hmma_present"])
        r["calib_roof"] = (r["h200"]["s"] * 1e3 / r["ms"] - 1) if r["ms"] else None
        out[cid] = r
    return out


def latency_aware(r: dict, factor: float) -> dict:
    """The latency-aware time of a projected path: each launch's fixed cost plus its largest bound, latency
    scaled by the fitted factor; the binding term of the longest launch."""
    total, worst = 0.0, (0.0, "", "")
    for kernel, lm in r["models"]:
        t, name = lm.time(factor)
        total += t
        if t > worst[0]:
            worst = (t, name, kernel)
    return {"s": total, "bound": worst[1], "kernel": worst[2]}


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
        chip90 = sm.h200(989e12, 4.2e12)
        bench_ms = None
        floor_ms, launch_ms, ev_floor_ms = 0.0, 0.0, 0.0
        header = "CPU dry run: launches recorded on CPU tensors (4 SMs on every row), no H200 timing"
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

    # the one fitted constant: on the step cases that are not per-kernel shapes, each measured time less the
    # timer's floor (the model's launches carry their own cost)
    kernel_ids = {_case_id(k, s_) for k, s_, kind in cases if kind == "kernel"}
    fit_ids = [cid for cid, r in results.items() if cid not in kernel_ids and "error" not in r and r["ms"]
               and r["h200"]["models"] and r["ms"] > r["floor_ms"]]
    pairs = [([m for _, m in results[cid]["h200"]["models"]], (results[cid]["ms"] - results[cid]["floor_ms"]) * 1e-3)
             for cid in fit_ids]
    factor = sm.fit_factor(pairs, *FIT_RANGE) if pairs else 1.0
    at_bound = factor <= FIT_RANGE[0] * 1.01 or factor >= FIT_RANGE[1] / 1.01
    for cid, r in results.items():
        if "error" in r:
            continue
        for p in PATHS:
            r[p]["lat"] = latency_aware(r[p], factor)
        r["h200_lat_s"] = r["h200"]["lat"]["s"] + r["floor_ms"] * 1e-3
        r["calib"] = (r["h200_lat_s"] * 1e3 / r["ms"] - 1) if r["ms"] else None

    lines = [f"# V100 projection ({header})", "",
             "Bounds from SASS counts x trip counts (catengine/tools/sass_model.py); V100: 80 SMs x 4 schedulers x "
             "1.53 GHz, 125 TFLOP/s HMMA, 900 GB/s, 128 B/clk/SM shared memory, 2.1 TB/s L2, 64 warps / 64K "
             "registers / 96 KB per SM, a global load 400 cycles unloaded. *Roofline*: the largest throughput bound "
             "per launch. *Latency-aware* (the main figures): per launch its fixed cost plus the largest of the "
             "throughput bounds, the L2 and the rounds of resident programs x (loop trips + 2) x the loaded "
             "latency. calib = H200 model / H200 measured - 1 on the sm_90 SASS (the HMMA.884 kernels are emulated "
             "there and never timed: an HMMA row carries the calibration of its family's tl.dot kernel).",
             f"Fitted: loaded-latency factor {factor:.2f} (x the public unloaded latency: {factor * 480:.0f} "
             f"cycles on the H200, {factor * sm.V100.mem_latency_cycles:.0f} on the V100) on {len(pairs)} model-step "
             f"cases{' (AT THE BOUND OF ITS RANGE: the model form does not fit these cases)' if at_bound else ''}; "
             f"measured, not fitted: launch {launch_ms * 1e3:.1f} us in a CUDA graph (the V100 is given the same), "
             f"events floor {ev_floor_ms * 1e3:.1f} us. H200 times: CUDA-graph replays over {COPIES} input copies "
             "(L2 cold for the weights, no host gaps) unless the notes say 'events'.", ""]

    def cell(x, unit=1e6):
        return "-" if x is None else f"{x * unit:,.1f}"

    def pct(x):
        return "-" if x is None else f"{x:+.0%}"

    lines += ["## Per kernel (one V100, microseconds; calib held out of the fit unless marked)", "",
              "| op | shape | FMA path | bound | HMMA.884 path | bound | HMMA roofline | HMMA of peak | "
              "H200 measured | H200 model | calib | calib roofline | notes |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for op_key, shape, kind in cases:
        if kind != "kernel":
            continue
        cid = _case_id(op_key, shape)
        r = results.get(cid, {"error": "not recorded"})
        op = reg.OPS[op_key]
        if "error" in r:
            lines.append(f"| {op.name} | {shape['label']} | error: {r['error']} |||||||||||")
            continue
        hm = r["hmma"]["lat"]
        if r["hmma_present"]:
            moved = sum(x["dram"] for x in r["hmma"]["raw"])
            peak = (f"{100 * op.flops(shape) / hm['s'] / 125e12:.0f}% of 125 TFLOP/s, "
                    f"{100 * moved / hm['s'] / 900e9:.0f}% of 900 GB/s")
            hcell, hbound, roof = cell(hm["s"]), f"{hm['bound']} ({hm['kernel']})", cell(r["hmma"]["s"])
        else:
            hcell, hbound, peak, roof = "missing", "no sm_70 HMMA kernel on this path", "-", "-"
        notes = "; ".join(sorted(set(r["fma"]["notes"] + r["hmma"]["notes"] + r["h200"]["notes"])))
        if cid in fit_ids:
            notes = "in the fit set; " + notes
        if r["timer"] == "events":
            notes = "events (not capturable); " + notes
        lines.append(f"| {op.name} | {shape['label']} | {cell(r['fma']['lat']['s'])} | {r['fma']['lat']['bound']} | "
                     f"{hcell} | {hbound} | {roof} | {peak} | {cell(r['ms'], 1e3)} | {cell(r['h200_lat_s'])} | "
                     f"{pct(r['calib'])} | {pct(r['calib_roof'])} | {notes} |")
    if steps:
        lines += ["", "## Model steps (one V100; linears, MoE, attention, GDN; norms, RoPE, routing, sampling and the "
                  "lm_head left out; calib in-sample: these cases fit the latency factor)", "",
                  "| model | step | FMA path ms | HMMA path ms | HMMA tok/s | HMMA roofline ms | H200 measured ms | "
                  "H200 model ms | calib | calib roofline | ops with no HMMA.884 launch (CUDA cores) | not modelled |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for short, name, tokens, _, rows in steps:
            tot = dict.fromkeys(("fma", "hmma", "h200", "roof", "roof90", "ms"), 0.0)
            missing, bad, complete = set(), [], True
            for op_key, shape, calls in rows:
                r = results.get(_case_id(op_key, shape), {"error": "not recorded"})
                if "error" in r:
                    bad.append(f"{shape['label']}: {r['error']}")
                    complete = False
                    continue
                for p in ("fma", "hmma"):
                    tot[p] += calls * r[p]["lat"]["s"]
                tot["h200"] += calls * r["h200_lat_s"]
                tot["roof"] += calls * r["hmma"]["s"]
                tot["roof90"] += calls * r["h200"]["s"]
                if r["ms"] is None:
                    complete = False
                else:
                    tot["ms"] += calls * r["ms"] * 1e-3
                if not r["hmma_present"]:
                    missing.add(reg.OPS[op_key].name)
            ok = complete and tot["ms"]
            lines.append(f"| {short} | {name} | {tot['fma'] * 1e3:,.1f} | {tot['hmma'] * 1e3:,.1f} | "
                         f"{tokens / tot['hmma'] if tot['hmma'] else 0:,.0f} | {tot['roof'] * 1e3:,.1f} | "
                         f"{tot['ms'] * 1e3:,.2f} | {tot['h200'] * 1e3:,.2f} | "
                         f"{pct(tot['h200'] / tot['ms'] - 1) if ok else '-'} | "
                         f"{pct(tot['roof90'] / tot['ms'] - 1) if ok else '-'} | "
                         f"{', '.join(sorted(missing)) or '-'} | {'; '.join(bad) or '-'} |")
    lines += ["", "## Configurations compiled", "", "| kernel | cc | shared B | registers | HMMA | FFMA | HFMA2 | LDG | LDS | "
              "STS | static instructions | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, res in sorted(compiled.items()):
        k = json.loads(key)
        if res["sass"]:
            funcs = sm.parse_sass(res["sass"])
            ins = funcs.get(k[1]) or next(iter(funcs.values()), [])
            c = sm.count(ins).classes
            row = [sm.registers(ins), c["hmma"], c["ffma"], c["hfma2"], c["ldg"], c["lds"], c["sts"], len(ins)]
        else:
            row = ["-"] * 8
        lines.append(f"| {k[1]} {json.dumps(k[3])[:120]} w{k[4]} s{k[5]} | {k[7]} | {res['shared']} | "
                     + " | ".join(str(int(v)) if v != "-" else v for v in row) + f" | {res['error'] or ''} |")
    text = "\n".join(lines)
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
