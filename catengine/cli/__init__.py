"""`catengine serve | generate | quantize | bench | doctor`: each subcommand lives in its own module of this package (its
flags and its ``run``); what a subcommand does beyond parsing lives in the runtime (serve, generate) or in
:mod:`catengine.tools` (quantize, bench, doctor)."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help). Each module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS = {
    "serve": ("catengine.cli.serve", "start the OpenAI-compatible server (no --model: the demo model)"),
    "generate": ("catengine.cli.generate", "generate once from a prompt and print the text"),
    "quantize": ("catengine.cli.quantize", "write a round-to-nearest 4-bit AWQ or compressed-tensors checkpoint"),
    "bench": ("catengine.cli.bench", "end-to-end benchmark on random-weight checkpoints (GPU)"),
    "doctor": ("catengine.cli.doctor", "check GPUs, torch, Triton and the kernel path of each op; print fixes"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="catengine", description="Qwen3.5/3.6 inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:  # import only the module that runs: startup stays fast
            try:
                modules[name] = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if e.name != module_name:
                    raise
                parser.error(f"'catengine {name}' is not available in this build")
            modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)
