"""``catengine doctor``: the flags; the checks are :mod:`catengine.tools.doctor`."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the ahead-of-time sm_70 compile that checks Triton's ptxas (a few seconds)")


def run(args) -> int:
    from ..tools.doctor import run_doctor
    return run_doctor(as_json=args.json, probe=not args.no_compile)
