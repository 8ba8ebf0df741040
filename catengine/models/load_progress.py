"""The loader's progress line on stderr (split from loader.py)."""
from __future__ import annotations

import sys
import time


class Progress:
    """One stderr line: bytes read / total and the shard being read. Shown for checkpoints over 1 GB
    (``enabled=True``) or always (``enabled="always"``); redrawn in place on a terminal, a line per shard
    (and every 10 s) otherwise."""

    THRESHOLD = 1 << 30

    def __init__(self, tensors: list[TensorInfo], enabled: bool | str):
        self.total = sum(t.nbytes for t in tensors)
        self.files = list(dict.fromkeys(t.file for t in tensors))
        self.on = enabled == "always" or (bool(enabled) and self.total > self.THRESHOLD)
        self.stream = sys.stderr
        self.tty = self.on and self.stream.isatty()
        self.done, self.last, self.file = 0, 0.0, None

    def __enter__(self) -> "Progress":
        return self

    def advance(self, info: TensorInfo) -> None:
        if not self.on:
            return
        self.done += info.nbytes
        now, new_file = time.monotonic(), info.file != self.file
        self.file = info.file
        if not (new_file or self.done == self.total or now - self.last > (0.2 if self.tty else 10.0)):
            return
        self.last = now
        line = (f"catengine: loading {info.file.name} ({self.files.index(info.file) + 1}/{len(self.files)}) "
                f"{self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB ({100 * self.done / max(self.total, 1):.0f}%)")
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def __exit__(self, *exc) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
