"""The main loop of an AOT build, from its SASS: how many instructions one iteration issues, which ones, and where
in the loop body the loads, barriers and shared stores sit (ptxas reorders what the PTX issues in order). No GPU:
the cubin comes from common/aot.py's build, the SASS from the cuobjdump Triton ships (one that takes the target).

    PYTHONPATH=. python bench/sass_loop.py catengine.kernels.w4a16.gemm_wgmma "R2 BT32 pdl g128 split1" [--cc 90]

The loop is the longest backward branch's span. bench/NOTES.md (session 16) quotes it for the register-A W4A16
kernels under Triton 3.6 (put it first on PYTHONPATH: the H100/H200 runs use 3.6).
"""
from __future__ import annotations

import argparse
import collections
import importlib
import re

from catengine.kernels.common import aot

MARKS = ("LDG", "LDGSTS", "BAR", "STSM", "STS", "CCTL", "DEPBAR", "HGMMA", "WARPGROUP")


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) of every SASS line, predicates kept."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def longest_loop(ins: list[tuple[int, str]]) -> list[str]:
    """The instructions between the target and the source of the longest backward branch."""
    best = None
    for addr, text in ins:
        m = re.search(r"BRA\s+(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            span = (int(m.group(1), 16), addr)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return []
    return [t for a, t in ins if best[0] <= a <= best[1]]


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("module")
    ap.add_argument("config", help="a substring of the AOT configuration's name (the first match is taken)")
    ap.add_argument("--cc", type=int, default=90)
    a = ap.parse_args()
    mod = importlib.import_module(a.module)
    cfg = next((c for c in mod.aot_configs(a.cc) if a.config in c.name), None)
    if cfg is None:
        raise SystemExit(f"no AOT configuration of {a.module} for sm_{a.cc} has {a.config!r} in its name")
    k = aot.build(mod, cfg, a.cc)
    sass = aot.disassemble(k.asm["cubin"], a.cc)
    if sass is None:
        raise SystemExit(f"the cuobjdump here does not take sm_{a.cc} cubins")
    res = aot.cubin_resources(k.asm["cubin"], k.metadata.name)
    body = longest_loop(instructions(sass))
    print(f"{cfg.name} (sm_{a.cc}): {res['registers']} registers, stack {res['stack']} bytes, shared "
          f"{k.metadata.shared} bytes; loop body {len(body)} instructions")
    for op, n in collections.Counter(opcode(t) for t in body).most_common():
        print(f"  {op:28s} {n}")
    print("where in the loop body (fraction of its instructions):")
    for i, t in enumerate(body):
        if opcode(t).split(".")[0] in MARKS:
            print(f"  {i / len(body):.2f}  {t}")


if __name__ == "__main__":
    main()
