"""Rank 0 -> workers messages (one per model call) and worker -> rank 0 replies, over the TCP store.

The store, not a collective, carries them: a worker idles in ``store.wait`` for as long as the engine has
no work (a collective would time out), and it sees rank 0 vanish at once (the store's socket closes).
Messages are numbered; a worker reads them in order. Rank 0 deletes the ones every worker has read
(everything before a call that ran a collective: a worker joins a collective only after reading all that
came before).
"""
from __future__ import annotations

import datetime
import pickle
import time

import torch.distributed as dist

_IDLE_WAIT = datetime.timedelta(days=1)


def _timed_out(e: Exception) -> bool:
    return "timeout" in str(e).lower()


class Channel:
    def __init__(self, store: dist.TCPStore, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.seq = 0          # next message number
        self.trimmed = 0      # messages below this are deleted

    # rank 0 --------------------------------------------------------------
    def send(self, message) -> int:
        seq, self.seq = self.seq, self.seq + 1
        self.store.set(f"m/{seq}", pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        return seq

    def trim(self, upto: int) -> None:
        """Drop messages below ``upto`` (every worker has read them)."""
        for seq in range(self.trimmed, upto):
            self.store.delete_key(f"m/{seq}")
        self.trimmed = max(self.trimmed, upto)

    def replies(self, seq: int, poll) -> list:
        """Each worker's reply to message ``seq``, rank order; ``poll()`` runs while waiting (it raises when a
        worker died, so a lost reply never hangs start-up). Polled with ``check`` and a sleep: a timed-out
        ``wait`` logs a C++ warning each time."""
        out = []
        for rank in range(1, self.world_size):
            key = f"r/{seq}/{rank}"
            while not self.store.check([key]):
                poll()
                time.sleep(0.02)
            out.append(pickle.loads(self.store.get(key)))
            self.store.delete_key(key)
        return out

    # workers -------------------------------------------------------------
    def recv(self) -> tuple[int, object]:
        """(number, message) of the next message, waiting as long as it takes."""
        key = f"m/{self.seq}"
        while True:
            try:
                self.store.wait([key], _IDLE_WAIT)
                break
            except dist.DistStoreError as e:
                if not _timed_out(e):
                    raise
        seq, self.seq = self.seq, self.seq + 1
        return seq, pickle.loads(self.store.get(key))

    def reply(self, seq: int, value) -> None:
        self.store.set(f"r/{seq}/{self.rank}", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
