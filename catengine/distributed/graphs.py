"""CUDA graphs at TP > 1: every rank captures the same graphs and replays the same one each step.

A graph records one rank's launches, the collectives inside it included (NCCL calls are capturable; a
replayed all-reduce meets the other ranks' replays of theirs). So rank 0 cannot capture for everyone:
:class:`RemoteGraphs` stands in for the runner's :class:`~catengine.cuda_graphs.DecodeGraphs` (or
:class:`~catengine.spec.graphs.VerifyGraphs`) and announces each use to the workers, which hold graphs of
the same class, sizes and padding slot on their own model and caches:

- ``("graphs", gid, cls, cid, kwargs)``: build them (``kwargs`` as the runner built rank 0's; the device
  is the worker's own);
- ``("graphs_capture", gid)``: capture every size, largest first, on every rank; each worker replies
  whether it succeeded, and a failure anywhere drops them on all ranks (``graphs_drop``): the runner
  then runs those steps eagerly, every rank alike;
- ``("graphs_run", gid, host)``: copy the step's host tensors into the static buffers and replay the
  graph of the same padded size (every rank picks it from the same batch size); ``("graphs_run_packed", gid,
  packed)``, the same for a uniform verify step from the inputs rank 0 packed (VerifyGraphs.pack).

gloo collectives cannot be captured: on the CPU the graphs run with ``capture=False`` (their static
buffers, eagerly), which is how the tests check that every rank gets and acts on the same messages.
"""
from __future__ import annotations

import torch

from ..spec.drafter import fill_drafts


def build_graphs(executor, cls, local_model, caches, **kwargs):
    """``cls``'s graphs on rank 0 (``local_model``, ``caches``: a RemoteCaches) and on every worker."""
    gid = executor.new_cache_id()   # one id space with the caches: the workers free both by id
    executor.send(("graphs", gid, cls, caches.cid, {k: v for k, v in kwargs.items() if k != "device"}))
    return RemoteGraphs(executor, gid, cls(local_model, caches.local, **kwargs))


class RemoteGraphs:
    def __init__(self, executor, gid: int, local):
        import weakref

        self.executor, self.gid, self.local = executor, gid, local
        weakref.finalize(self, executor.release, gid)

    def __getattr__(self, name):   # sizes, can_run, padded_size, num_runs: rank 0's are every rank's
        return getattr(self.local, name)

    def capture_all(self) -> None:
        ex = self.executor
        seq = ex.send(("graphs_capture", self.gid))
        error = None
        try:
            self.local.capture_all()
        except Exception as e:  # noqa: BLE001 (the workers' outcome is awaited either way: they reply)
            error = e
        failed = [f"rank {r}: {why}" for r, (ok, why) in enumerate(ex.chan.replies(seq, ex.check_alive), 1) if not ok]
        if error is not None or failed:
            ex.send(("graphs_drop", self.gid))
            if error is not None:
                raise error
            raise RuntimeError(f"{self.local.kind} CUDA graph capture failed on {', '.join(failed)}")

    def run(self, host: dict[str, torch.Tensor]) -> torch.Tensor:
        ex = self.executor
        seq = ex.send(("graphs_run", self.gid, host))
        return ex.collective(seq, lambda: self.local.run(host))

    def run_items(self, items, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """A uniform verify step (VerifyGraphs): rank 0 packs the items' inputs, every rank replays from them.
        Drafts on the device (the draft graphs', which TP > 1 does not capture) go to the items first."""
        if drafts is not None:
            fill_drafts(items, drafts)
        packed = self.local.pack(items)
        ex = self.executor
        seq = ex.send(("graphs_run_packed", self.gid, packed))
        return ex.collective(seq, lambda: self.local.run_packed(*packed))


def handle(msg, model, caches: dict, graphs: dict, device, chan, seq) -> None:
    """A worker's side of the messages above."""
    op = msg[0]
    if op == "graphs":
        _, gid, cls, cid, kwargs = msg
        graphs[gid] = cls(model, caches[cid], device=device, **kwargs)
    elif op == "graphs_capture":
        try:
            graphs[msg[1]].capture_all()
            chan.reply(seq, (True, None))
        except Exception as e:  # noqa: BLE001 (rank 0 drops the graphs on every rank and runs eagerly)
            chan.reply(seq, (False, f"{type(e).__name__}: {e}"))
    elif op == "graphs_drop":
        graphs.pop(msg[1], None)
    elif op == "graphs_run":
        graphs[msg[1]].run(msg[2])
    elif op == "graphs_run_packed":
        graphs[msg[1]].run_packed(*msg[2])
    else:
        raise RuntimeError(f"unknown tensor-parallel message {op!r}")
