"""The tables of bench/v100_projection.py (issue 18): the loaded-latency factor fitted on the model-step cases,
then the per-kernel, model-step and configuration tables, from the per-case results of a run or of its raw dump
(``results_from_raw``)."""
from __future__ import annotations

import json

import v100_kernels as reg

from catengine.tools import sass_model as sm

PATHS = ("h200", "fma", "hmma")     # sm_90 as run here; sm_70 without / with the HMMA.884 kernels


def _case_id(op_key, shape):
    return json.dumps([op_key, {k: v for k, v in shape.items() if k not in ("label", "touched")}], sort_keys=True)


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


def by_kernel(r: dict, factor: float) -> str:
    """A projected path's latency-aware time per kernel, longest first, each marked HMMA.884 (a Gluon kernel) or
    CUDA cores (a tl.dot kernel: FMA on sm_70): where a mixed path (GDN's tl.dot WY beside its HMMA.884 stages)
    spends its time."""
    tot, gluon, local = {}, {}, {}
    for (kernel, lm), x in zip(r["models"], r["raw"]):
        tot[kernel] = tot.get(kernel, 0.0) + lm.time(factor)[0]
        gluon[kernel] = gluon.get(kernel, False) or bool(x.get("gluon"))
        local[kernel] = local.get(kernel, 0.0) + x["programs"] * x["warps"] * x["counts"].get("local_bytes", 0.0)

    def spills(k):   # local-memory traffic is in no bound: what it would add if it all went to L2
        return (f", spills {local[k] / 1e9:,.2f} GB through local memory = {local[k] / sm.V100.l2_bps * 1e6:,.0f} us "
                f"at the V100's L2 rate, not in the figure" if local[k] else "")
    return ", ".join(f"{k} {t * 1e6:,.1f} us ({'HMMA.884' if gluon[k] else 'CUDA cores'}{spills(k)})"
                     for k, t in sorted(tot.items(), key=lambda kv: -kv[1]))


def target_lines(cases, steps, results, step_tok) -> list[str]:
    """Issue 18's targets against the HMMA.884 path's latency-aware projection, each with its calibration."""
    rows = []

    def pct(x):
        return "-" if x is None else f"{x:+.0%}"
    for op_key, shape, kind in cases:
        r = results.get(_case_id(op_key, shape), {})
        if kind != "kernel" or "error" in r or not r or not r.get("hmma_present"):
            continue
        t = r["hmma"]["lat"]["s"]
        tf = reg.OPS[op_key].flops(shape) / t / 125e12
        op = reg.OPS[op_key]
        bw = (op.bytes(shape) if op.bytes else sum(x["dram"] for x in r["hmma"]["raw"])) / t / 900e9
        if op_key == "w4a16" and shape["M"] >= 256:
            rows.append(("W4A16 GEMM, M >= 256", shape["label"], f"{tf:.0%} of 125 TFLOP/s", ">= 70%", tf >= 0.7,
                         r["calib"]))
        elif op_key == "w4a16" and 8 <= shape["M"] <= 64:
            rows.append(("decode GEMM, M = 8-64", shape["label"], f"{bw:.0%} of 900 GB/s", ">= 80%", bw >= 0.8,
                         r["calib"]))
        elif op_key == "attn" and shape["q"] > 8:
            rows.append(("prefill attention", shape["label"], f"{tf:.0%} of 125 TFLOP/s", ">= 60%", tf >= 0.6,
                         r["calib"]))
    tok, calib, ceiling = step_tok.get(("27B", "prefill 8K"), (None, None, None))
    if tok is not None:
        rows.append(("27B AWQ prefill 8K, one V100", "model step", f"{tok:,.0f} tok/s (its ops' flops at 100% of "
                     f"125 TFLOP/s: {ceiling:,.0f})", ">= 2,500 tok/s", tok >= 2500, calib))
    if not rows:
        return []
    out = ["", "## Against issue 18's targets (HMMA.884 path, latency-aware; calib as in the tables above)", "",
           "| target | case | projected | target | met | calib |", "|---|---|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} | {'yes' if e else 'NO'} | {pct(f)} |" for a, b, c, d, e, f in rows]
    return out


def tables(cases, steps, results, compiled, header, launch_ms, ev_floor_ms, copies, given_factor=None):
    """(markdown, factor, fit case ids, per-kernel case ids): fits the latency factor on the step cases that are
    not per-kernel shapes, then renders every table."""
    # the one fitted constant: on the step cases that are not per-kernel shapes, each measured time less the
    # timer's floor (the model's launches carry their own cost)
    kernel_ids = {_case_id(k, s_) for k, s_, kind in cases if kind == "kernel"}
    fit_ids = [cid for cid, r in results.items() if cid not in kernel_ids and "error" not in r and r["ms"]
               and r["h200"]["models"] and r["ms"] > r["floor_ms"]]
    pairs = [([m for _, m in results[cid]["h200"]["models"]], (results[cid]["ms"] - results[cid]["floor_ms"]) * 1e-3)
             for cid in fit_ids]
    factor = given_factor or (sm.fit_factor(pairs, *FIT_RANGE) if pairs else 1.0)
    at_bound = not given_factor and (factor <= FIT_RANGE[0] * 1.01 or factor >= FIT_RANGE[1] / 1.01)
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
             f"{'Given (--factor), not fitted' if given_factor else 'Fitted'}: loaded-latency factor {factor:.2f} (x the public unloaded latency: {factor * 480:.0f} "
             f"cycles on the H200, {factor * sm.V100.mem_latency_cycles:.0f} on the V100) on {len(pairs)} model-step "
             f"cases{' (AT THE BOUND OF ITS RANGE: the model form does not fit these cases)' if at_bound else ''}; "
             f"measured, not fitted: launch {launch_ms * 1e3:.1f} us in a CUDA graph (the V100 is given the same), "
             f"events floor {ev_floor_ms * 1e3:.1f} us. H200 times: CUDA-graph replays over {copies} input copies "
             "(L2 cold for the weights, no host gaps) unless the notes say 'events'.", ""]

    def cell(x, unit=1e6):
        return "-" if x is None else f"{x * unit:,.1f}"

    def pct(x):
        return "-" if x is None else f"{x:+.0%}"

    lines += ["## Per kernel (one V100, microseconds; calib held out of the fit unless marked)", "",
              "HMMA of peak: the op's flops over the HMMA path's time against 125 TFLOP/s, and the bytes it must move "
              "(GEMM: int4 weights, scales, zeros, x, y; attention: the K/V context, q, out; no split-K partials, no "
              "re-reads; other ops: their launches' tensors) against 900 GB/s.", "",
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
            moved = op.bytes(shape) if op.bytes else sum(x["dram"] for x in r["hmma"]["raw"])
            peak = (f"{100 * op.flops(shape) / hm['s'] / 125e12:.0f}% of 125 TFLOP/s, "
                    f"{100 * moved / hm['s'] / 900e9:.0f}% of 900 GB/s")
            hcell, hbound, roof = cell(hm["s"]), f"{hm['bound']} ({hm['kernel']})", cell(r["hmma"]["s"])
        else:   # a decode GEMV, the MoE's decode kernels, the GDN recurrence: no matrix product, CUDA cores by design
            hcell, hbound, peak, roof = (cell(hm["s"]), f"{hm['bound']} (no HMMA.884 kernel on this path: CUDA cores)",
                                         "-", cell(r["hmma"]["s"]))
        notes = "; ".join(sorted(set(r["fma"]["notes"] + r["hmma"]["notes"] + r["h200"]["notes"])))
        notes = f"HMMA path: {by_kernel(r['hmma'], factor)}" + (f"; {notes}" if notes else "")
        if cid in fit_ids:
            notes = "in the fit set; " + notes
        if r["timer"] == "events":
            notes = "events (not capturable); " + notes
        lines.append(f"| {op.name} | {shape['label']} | {cell(r['fma']['lat']['s'])} | {r['fma']['lat']['bound']} | "
                     f"{hcell} | {hbound} | {roof} | {peak} | {cell(r['ms'], 1e3)} | {cell(r['h200_lat_s'])} | "
                     f"{pct(r['calib'])} | {pct(r['calib_roof'])} | {notes} |")
    step_tok = {}
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
            # projected whenever every op was (H200 timings only feed calib)
            flops = sum(calls * reg.OPS[k].flops(sh) for k, sh, calls in rows)
            step_tok[(short, name)] = (tokens / tot["hmma"] if tot["hmma"] and not bad else None,
                                       tot["h200"] / tot["ms"] - 1 if ok else None, tokens * 125e12 / flops)
            lines.append(f"| {short} | {name} | {tot['fma'] * 1e3:,.1f} | {tot['hmma'] * 1e3:,.1f} | "
                         f"{tokens / tot['hmma'] if tot['hmma'] else 0:,.0f} | {tot['roof'] * 1e3:,.1f} | "
                         f"{tot['ms'] * 1e3:,.2f} | {tot['h200'] * 1e3:,.2f} | "
                         f"{pct(tot['h200'] / tot['ms'] - 1) if ok else '-'} | "
                         f"{pct(tot['roof90'] / tot['ms'] - 1) if ok else '-'} | "
                         f"{', '.join(sorted(missing)) or '-'} | {'; '.join(bad) or '-'} |")
    lines += target_lines(cases, steps, results, step_tok)
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
    return "\n".join(lines), factor, fit_ids, kernel_ids
