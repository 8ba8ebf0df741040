"""Quantize a trained demo model to AWQ 4-bit (``catengine quantize``, group 128; embedding, norms, conv, GDN
gates and the MTP head stay bf16) into ``catengine/demo_model``, where ``Engine(model=None)`` finds it, and check
the git size budget. ``python -m catengine.tools.train_demo.ship SRC [--dst DIR]``."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from ..demo import TRAINED_DIR
from ..quantize import quantize_checkpoint

MAX_SHIPPED_BYTES = 20_000_000


def ship(src: Path, dst: Path = TRAINED_DIR, max_bytes: int = MAX_SHIPPED_BYTES) -> int:
    src, dst = Path(src), Path(dst)
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        out = Path(tmp) / "awq"
        quantize_checkpoint(src, out, "awq", 128, progress=False)
        total = sum(p.stat().st_size for p in out.iterdir())
        for p in sorted(out.iterdir()):
            print(f"  {p.name:28s} {p.stat().st_size / 1e6:8.2f} MB")
        print(f"  total {total / 1e6:.2f} MB (budget {max_bytes / 1e6:.0f} MB)")
        if total > max_bytes:
            print(f"ship: {total} bytes exceed the {max_bytes}-byte budget; train a smaller model", file=sys.stderr)
            return 1
        for p in out.iterdir():
            p.chmod(0o644)   # safetensors writes 0600; the files go into git and a shared install
        if dst.exists():
            shutil.rmtree(dst)
        shutil.move(str(out), str(dst))
    print(f"ship: wrote {dst}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m catengine.tools.train_demo.ship", description=__doc__.split("\n")[0])
    ap.add_argument("src", help="model directory written by catengine.tools.train_demo")
    ap.add_argument("--dst", default=str(TRAINED_DIR))
    a = ap.parse_args(argv)
    return ship(Path(a.src), Path(a.dst))


if __name__ == "__main__":
    raise SystemExit(main())
