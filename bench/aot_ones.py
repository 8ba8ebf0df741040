"""Rebuild every AOT configuration with one run-time int at a time set to the constant 1: a launch that passes 1
gets that argument specialised into a constant by Triton (``native_specialize_impl(1)`` -> ``('constexpr', 1)``), a
different build from the AOT list's, where it stays a run-time int (batch-1 ``M``, decode ``T``, one-sequence ``B``,
``n_split`` 1, ``NKV`` 1 at TP 4). Prints each build that fails; strides and ints the launchers keep at multiples of
16 are left as they are.

    PYTHONPATH=<triton 3.6>:. python bench/aot_ones.py --cc 70,90 [--only w4a16]

~10 minutes for the whole suite on 2 CPU cores; results in bench/NOTES.md (session 19)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import pkgutil
import time

import catengine.kernels as kernels
from catengine.kernels.common import aot


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cc", default="70,90")
    p.add_argument("--only", default="", help="substring of the module names to rebuild")
    a = p.parse_args()
    builds = fails = 0
    t0 = time.time()
    for info in pkgutil.walk_packages(kernels.__path__, "catengine.kernels."):
        if a.only not in info.name:
            continue
        mod = importlib.import_module(info.name)
        configs = getattr(mod, "aot_configs", None)
        if configs is None:
            continue
        for cc in (int(c) for c in a.cc.split(",")):
            seen = set()
            for c in configs(cc):
                for arg, kind in c.signature.items():
                    if kind != "i32" or arg.startswith("stride") or arg in c.divisible_by_16 or arg in c.ones:
                        continue
                    key = (c.kernel, arg, tuple(sorted((k, str(v)) for k, v in c.constexprs.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    one = dataclasses.replace(c, ones=c.ones + (arg,))
                    builds += 1
                    try:
                        aot.build(mod, one, cc)
                    except Exception as e:     # ptxas / compiler failures: report and go on
                        fails += 1
                        last = str(e).strip().splitlines()
                        print(f"FAIL sm_{cc} {info.name} {c.name} {arg}=1: {type(e).__name__} "
                              f"{last[-1][:150] if last else ''}", flush=True)
        print(f"{info.name}: {builds} builds so far, {fails} failed ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
