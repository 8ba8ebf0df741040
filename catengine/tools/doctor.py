"""``catengine doctor``: can this machine run catengine, and which path does each op take here (issue 18).

Facts first (:func:`gather_facts`: GPUs and compute capability, torch and the architectures its CUDA kernels were
built for, Triton and whether its ptxas still targets sm_70, the ``CATENGINE_ARCH`` switch), then
:func:`diagnose`: every problem with the exact command or setting that fixes it, and :func:`op_paths`: per op of
the registry, the kernel it runs on this machine. Facts and judgement are separate so that tests can hand in the
facts of a machine they are not on (a V100 with a CUDA-13 torch).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch

from ..errors import ConfigError

# torch 2.9-2.10's CUDA 12.8 wheels and every CUDA 12.6 wheel have sm_70 kernels (PyTorch's RELEASE.md support
# matrix); CUDA 13 wheels, and 2.11's CUDA 12.8 ones, start at Turing. Triton 3.5 (pinned by torch 2.9) is what
# V100 users run.
TORCH_FIX = "pip install torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128"
PROBE_MODULE = "catengine.tools.doctor_probe"
PROBE_TIMEOUT_S = 180
# ops whose work is matrix products: the ones that want tensor cores (the rest are row, scan or gather kernels)
MATMUL_OPS = ("w4a16_linear", "skinny_linear", "fused_moe", "paged_attention", "chunk_gated_delta_rule")
# ops that launch no kernel: host-side sizing for another op
HOST_OPS = ("skinny_counters",)


@dataclass(frozen=True)
class Problem:
    problem: str
    fix: str


# ----------------------------------------------------------------------------- facts
def _gpus() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "cc": 10 * p.major + p.minor, "sms": p.multi_processor_count,
                    "memory_gib": round(p.total_memory / 2**30, 1)})
    return out


def _nvidia_smi_gpus() -> list[str]:
    """GPU names the driver lists (to tell 'no GPU' from 'a torch that cannot see it')."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def ptxas_sm70_probe(timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Compile :mod:`catengine.tools.doctor_probe` ahead of time for sm_70 in a subprocess (without
    TRITON_INTERPRET, which replaces the kernel with an object the compiler cannot take)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "catengine.kernels.common.aot", PROBE_MODULE, "70"]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "detail": f"the sm_70 compile did not finish in {timeout:.0f} s"}
    if out.returncode == 0 and any(line.startswith("{") for line in out.stdout.splitlines()):
        return {"ok": True, "detail": "compiled a kernel for sm_70"}
    tail = [line for line in out.stderr.strip().splitlines() if line.strip()][-3:]
    return {"ok": False, "detail": " | ".join(tail) or f"exit code {out.returncode}"}


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _forced() -> tuple[int | None, str | None]:
    from ..kernels.common import arch
    try:
        return arch.forced_arch(), None
    except ConfigError as e:
        return None, str(e)


def gather_facts(probe: bool = True) -> dict:
    """Everything :func:`diagnose` and :func:`op_paths` judge, as plain JSON-able values."""
    from ..kernels.common import arch
    forced, forced_error = _forced()
    triton_version = _triton_version()
    gpus = _gpus()
    return {
        "gpus": gpus,
        "driver_gpus": [] if gpus else _nvidia_smi_gpus(),
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda,
                  "arch_list": list(torch.cuda.get_arch_list()) if torch.version.cuda else []},
        "triton": {"version": triton_version,
                   "ptxas_sm70": ptxas_sm70_probe() if probe and triton_version else None},
        "catengine_arch": {"value": arch.ARCH_OVERRIDE, "forced": forced, "error": forced_error},
        "kernels_env": os.environ.get("CATENGINE_KERNELS", ""),
    }


# ----------------------------------------------------------------------------- judgement
def torch_runs_on(arch_list: list[str], cc: int) -> bool:
    """Whether a torch built for ``arch_list`` has kernels a GPU of ``cc`` can run: a cubin of the same major
    and a minor at most its own (sm_70 runs on 7.x), or PTX of an architecture at most ``cc`` (JIT-compiled)."""
    for a in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)a?", a)
        if not m:
            continue
        built = int(m.group(2))
        if m.group(1) == "sm" and built // 10 == cc // 10 and built <= cc:
            return True
        if m.group(1) == "compute" and built <= cc:
            return True
    return False


def _version_tuple(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v or "")[:2])


def diagnose(facts: dict) -> list[Problem]:
    problems = []
    ce = facts["catengine_arch"]
    if ce["error"]:
        problems.append(Problem(ce["error"], "unset CATENGINE_ARCH, or set it to 70, 80 or 90"))
    t = facts["torch"]
    if not facts["gpus"] and facts["driver_gpus"]:
        what = "is built without CUDA" if not t["cuda"] else "cannot reach them (driver too old for its CUDA?)"
        problems.append(Problem(f"the driver lists {len(facts['driver_gpus'])} GPU(s) but torch {t['version']} "
                                f"{what}", TORCH_FIX if any("V100" in g for g in facts["driver_gpus"])
                                else "install a CUDA build of torch: see https://pytorch.org/get-started/locally/"))
    for g in facts["gpus"]:
        if not torch_runs_on(t["arch_list"], g["cc"]):
            fix = TORCH_FIX if g["cc"] < 75 else "install a torch built for this GPU: https://pytorch.org/get-started/locally/"
            problems.append(Problem(f"GPU {g['index']} ({g['name']}, sm_{g['cc']}): torch {t['version']} (CUDA "
                                    f"{t['cuda']}) has no kernels for it (built for {' '.join(t['arch_list']) or 'none'})",
                                    f"{fix}, then `pip install -e .` again"))
    tr = facts["triton"]
    if tr["version"] is None:
        problems.append(Problem("Triton is not installed", "pip install -e . (it brings the Triton your torch pins)"))
    elif tr["ptxas_sm70"] is not None and not tr["ptxas_sm70"]["ok"]:
        # only a problem where an sm_70 build is needed: a V100 here, or the switch forcing the sm_70 row
        if any(g["cc"] < 80 for g in facts["gpus"]) or ce["forced"] == 70:
            problems.append(Problem(f"Triton {tr['version']}'s ptxas cannot build for sm_70 "
                                    f"({tr['ptxas_sm70']['detail']})",
                                    "point TRITON_PTXAS_PATH at a CUDA 12.x ptxas (e.g. "
                                    "/usr/local/cuda-12.8/bin/ptxas), or install the Triton your torch pins: "
                                    f"{TORCH_FIX}"))
    return problems


def _family_of(op: str) -> str:
    from ..kernels import ops
    return ops.REGISTRY.twin(op).__module__.split(".")[-2]


def _matmul_path(op: str, row: int, dot: str) -> str:
    """The path of a matrix-product op on launch-table row ``row``, read from the tables and switches its
    dispatch reads (so it says what runs, not which files exist): the HMMA.884 kernels only where the row picks
    them, with the sizes and dtypes they take; ``dot`` is what tl.dot becomes on this row and Triton."""
    hmma = "HMMA.884 Gluon"
    if op == "w4a16_linear":
        from ..kernels.w4a16.dequant import DEQUANT_MIN_M
        from ..kernels.w4a16.launch import TABLES
        key = f"sm{row}"
        t, big = TABLES[key], DEQUANT_MIN_M[key]
        parts = [f"M <= {t.gemv_max_m}: GEMV on CUDA cores"]
        lo = t.gemv_max_m + 1
        if t.mma:
            top = t.mma[-1][0]
            rows = t.wgmma_split
            split = "".join(f"; M {rows[i - 1][0] + 1 if i else lo}-{b}: wgmma where its pick splits K"
                            for i, (b, ts) in enumerate(rows) if ts)
            parts.append(f"M {lo}-{top}: mma.sync m16n8k16 Gluon (fp16, groups 32/64/128; else {dot}{split})")
            lo = top + 1
        if t.wgmma:
            top = t.wgmma[-1][0]
            parts.append(f"M {lo}-{top}: wgmma Gluon (fp16, groups 32/64/128, N % 16 == 0; else {dot})")
            lo = top + 1
        if t.hmma_min_m is not None and t.hmma_min_m < big:
            if t.hmma_min_m > lo:
                parts.append(f"M {lo}-{t.hmma_min_m - 1}: {dot}")
            parts.append(f"M {t.hmma_min_m}-{big - 1}: {hmma} (fp16, groups 32/64/128; else {dot})")
        else:
            parts.append(f"M {lo}-{big - 1}: {dot}")
        return "; ".join(parts + [f"from M = {big}: dequantise + cuBLAS"])
    if op == "skinny_linear":
        from ..kernels.skinny.skinny import TABLES
        t = TABLES[f"sm{row}"]
        if t is None:
            return "cuBLAS (F.linear; the row has no skinny table)"
        return (f"fp16/bf16, M <= {t.max_m}, N <= {t.max_n}, K >= {t.k_min}: {dot}, split K reduced in-kernel "
                "(one launch); else cuBLAS (F.linear)")
    if op == "fused_moe":
        from ..kernels.moe.fused import TABLES
        t = TABLES[f"sm{row}"]
        big = f"{hmma} (fp16 W4A16 experts, groups 32/64/128; else {dot})" if t.hmma else dot
        if t.mma:
            return (f"T x top_k <= {t.row_max}: row kernels on CUDA cores; up to {t.mma[-1][0]}: mma.sync m16n8k16 "
                    f"Gluon (fp16 W4A16 experts, groups 32/64/128; else {dot}); above: {big}")
        return f"T x top_k <= {t.row_max}: row kernels on CUDA cores; above: {big}"
    if op == "paged_attention":
        from ..kernels.attention import paged_sm70
        if row == 70 and paged_sm70.ENABLED:
            dims = "/".join(map(str, sorted(paged_sm70.PREFILL_SM70)))
            return f"{hmma} (fp16 queries, fp16 or e5m2 cache, head dims {dims}; else {dot})"
        off = " (its HMMA.884 kernel is off: attention/paged_sm70.ENABLED)" if row == 70 else ""
        return dot + off
    if op == "chunk_gated_delta_rule":
        from ..kernels.gdn.table import TABLE
        t = TABLE[row]
        if t.prefill != "split":
            return f"{dot} (the row runs the scan form" + ("; its HMMA.884 stages are the split form's)"
                                                          if t.o_hmma or t.h_hmma or t.wy_hmma else ")")
        wy, state, output = (hmma + " (fp16)" if on else dot for on in (t.wy_hmma, t.h_hmma, t.o_hmma))
        if wy == state == output == dot:
            return f"{dot} (split form)"
        return f"split form: WY {wy}; state {state}; output {output}"
    raise AssertionError(f"{op} is not one of MATMUL_OPS")


def op_paths(facts: dict) -> dict[str, dict]:
    """op -> {family, path}: the torch twin without a CUDA GPU (or under CATENGINE_KERNELS=reference); on a GPU
    the Triton kernel, and for the matrix-product ops what their dispatch picks on the launch-table row in use."""
    from ..kernels import ops
    from ..kernels.common.arch import arch_from_cc
    gpus, forced = facts["gpus"], facts["catengine_arch"]["forced"]
    # ops run their twins on CPU tensors whatever the switch says (ops.use_triton)
    row = (forced or min(arch_from_cc(g["cc"]) for g in gpus)) if gpus else None
    if row == 70:
        fma = _version_tuple(facts["triton"]["version"]) >= (3, 3)
        dot = "tl.dot -> FMA" if fma else "tl.dot (HMMA via Triton < 3.3)"
    else:
        dot = "tl.dot (tensor cores)"
    out = {}
    for op in ops.REGISTRY.names():
        if row is None or facts["kernels_env"] == "reference":
            path = "torch twin"
        elif op in HOST_OPS:
            path = "host only (no kernel)"
        elif op not in MATMUL_OPS:
            path = "Triton (no matrix product)"
        else:
            path = _matmul_path(op, row, dot)
        out[op] = {"family": _family_of(op), "path": path}
    return out


# ----------------------------------------------------------------------------- report
def build_report(facts: dict) -> dict:
    problems = diagnose(facts)
    return {**facts, "ops": op_paths(facts), "problems": [asdict(p) for p in problems],
            "ok": not problems}


def format_report(r: dict) -> str:
    lines = []
    if r["gpus"]:
        for g in r["gpus"]:
            lines.append(f"GPU {g['index']}: {g['name']}, sm_{g['cc']}, {g['sms']} SMs, {g['memory_gib']} GiB")
    else:
        lines.append("GPU: none visible to torch: every op runs its torch twin on the CPU")
    t = r["torch"]
    lines.append(f"torch {t['version']}, CUDA {t['cuda'] or 'none (CPU build)'}, kernels for: "
                 f"{' '.join(t['arch_list']) or 'none'}; sm_70: {'yes' if torch_runs_on(t['arch_list'], 70) else 'no'}")
    tr = r["triton"]
    probe = tr["ptxas_sm70"]
    lines.append(f"Triton {tr['version'] or 'not installed'}; ptxas for sm_70: "
                 + ("not checked" if probe is None else ("yes" if probe["ok"] else f"no ({probe['detail']})")))
    ce = r["catengine_arch"]
    if ce["value"]:
        lines.append(f"CATENGINE_ARCH={ce['value']}: " + (f"every device takes the sm_{ce['forced']} row"
                                                          if ce["forced"] else "invalid"))
    if any(v["path"].find("tl.dot -> FMA") >= 0 for v in r["ops"].values()):
        lines.append("tl.dot -> FMA: Triton >= 3.3 lowers tl.dot to fp32 FMA on sm_70 (no tensor cores); the HMMA.884 "
                     "kernels are Gluon")
    lines.append("ops:")
    width = max(map(len, r["ops"]))
    lines += [f"  {op:<{width}}  {v['family']:<9} {v['path']}" for op, v in r["ops"].items()]
    if r["problems"]:
        lines.append(f"{len(r['problems'])} problem(s):")
        for p in r["problems"]:
            lines += [f"  - {p['problem']}", f"    fix: {p['fix']}"]
    else:
        lines.append("no problems found")
    return "\n".join(lines)


def run_doctor(as_json: bool = False, probe: bool = True, file=None) -> int:
    """Print the report; 0 when no problem was found, 1 otherwise."""
    r = build_report(gather_facts(probe=probe))
    print(json.dumps(r, indent=2) if as_json else format_report(r), file=file or sys.stdout)
    return 0 if r["ok"] else 1
