"""Tensor parallelism: one process per rank, rank 0 runs the engine and broadcasts each model call.

- :mod:`.group`: :class:`TPGroup`, the collectives the sharded model calls (passed to it explicitly).
- :mod:`.launch`: :class:`DistSpec` (address, port, rank, world size) from a config or torchrun-style env
  vars, and the process groups built from it.
- :mod:`.channel`: rank 0 -> workers step messages and worker -> rank 0 replies over the TCP store.
- :mod:`.worker`: the loop every rank > 0 runs (``python -m catengine.distributed.worker`` for launchers).
- :mod:`.executor`: rank 0's side: spawns the workers and stands in for the model and its caches.
"""
from .group import TPGroup

__all__ = ["TPGroup"]
