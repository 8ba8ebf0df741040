"""``catengine quantize SRC DST``: the flags; the quantizer is :mod:`catengine.tools.quantize`."""
from __future__ import annotations

import argparse
import sys

from ..errors import CatEngineError
from ..tools.quantize import FORMATS, quantize_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="fp16/bf16/fp32 Hugging Face model directory")
    parser.add_argument("dst", metavar="DST", help="output directory (new or empty)")
    parser.add_argument("--format", choices=FORMATS, default="awq",
                        help="on-disk format: AutoAWQ GEMM or compressed-tensors pack-quantized (default awq)")
    parser.add_argument("--group-size", type=int, default=128, help="input channels per scale (default 128)")
    parser.add_argument("--symmetric", action="store_true",
                        help="symmetric quantization (zero point 8) instead of per-group zero points")
    parser.add_argument("--device", default="cpu", help="where to compute the rounding (e.g. cuda; default cpu)")


def run(args: argparse.Namespace) -> int:
    try:
        quantize_checkpoint(args.src, args.dst, args.format, args.group_size, args.symmetric, device=args.device)
    except CatEngineError as e:
        print(f"catengine quantize: error: {e}", file=sys.stderr)
        return 2
    return 0
