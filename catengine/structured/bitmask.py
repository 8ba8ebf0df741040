"""The step's token bitmask: one int32 row of ceil(V / 32) words per constrained sample row.

The runner fills it on the CPU after it launched the forward (on CUDA the forward's kernels are
queued, so the fill overlaps the GPU's work up to the logits), copies it to the device from pinned
memory without waiting, and ``ops.apply_token_bitmask`` sets the disallowed logits of those rows to
-inf before sampling; free rows of the same batch are not touched.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .matcher import GrammarState


class TokenBitmasks:
    def __init__(self, vocab_size: int, device: torch.device):
        self.width = -(-vocab_size // 32)
        self.device = device
        self._host = torch.empty(0, self.width, dtype=torch.int32)

    def _buffer(self, rows: int) -> torch.Tensor:
        if self._host.shape[0] < rows:
            # grown, never shrunk: pinning is slow; the previous step's copy finished when its tokens
            # were read, so reusing the buffer is safe
            size = max(rows, 2 * self._host.shape[0])
            buf = torch.empty(size, self.width, dtype=torch.int32)
            self._host = buf.pin_memory() if self.device.type == "cuda" else buf
        return self._host[:rows]

    def fill(self, grammars: Sequence[GrammarState | None]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(rows, bitmask)`` on the device for the sample rows that have a grammar, None when none has."""
        rows = [i for i, g in enumerate(grammars) if g is not None]
        if not rows:
            return None
        host = self._buffer(len(rows))
        for j, i in enumerate(rows):
            grammars[i].fill(host, j)
        rows_t = torch.tensor(rows, dtype=torch.int64)
        if self.device.type == "cpu":
            return rows_t, host
        return rows_t.to(self.device, non_blocking=True), host.to(self.device, non_blocking=True)
