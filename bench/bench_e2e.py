"""End-to-end benchmark of issue 8 (thin wrapper: the logic is `catengine bench`, catengine/tools/bench.py).

    python3 bench/bench_e2e.py --device cuda --out bench_e2e.json              # 27B + 35B-A3B, engine sections
    python3 bench/bench_e2e.py --sections all --model-preset qwen3.5-27b       # + transformers + correctness
    python3 bench/bench_e2e.py --device cpu --quick                            # smoke run on tiny models
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from catengine.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
