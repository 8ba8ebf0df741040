"""Rank 0's side of tensor parallelism: start the workers, then stand in for the model and its caches.

:class:`TPExecutor` spawns ranks 1..N-1 (or, with "external_launcher", waits for the ones a launcher
started), loads rank 0's shard in this process and hands the runner a :class:`RemoteModel`. Every
model call the runner makes (forward, logits, MTP, cache allocation, block and state-slot copies) is
announced to the workers first, then run here: all ranks run the same step on their shards and meet
in the layers' all-reduces. Sampling runs once, here, on the gathered logits.

A worker that exits, or a collective that fails, makes every later call raise EngineDead; the other
workers are stopped (SIGTERM, then SIGKILL), so no rank outlives the failure.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import weakref
from pathlib import Path

import torch

from ..errors import CatEngineError, ConfigError, EngineDead
from .channel import Channel
from .launch import DistSpec, host_store, make_group, rank_device, set_no_multicast_env
from .worker import report, spawned_main

log = logging.getLogger("catengine")


def _cpu(value):
    """Tensors (also inside a BatchMetadata) as host tensors, for the message."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if hasattr(value, "__dataclass_fields__"):
        return type(value)(**{n: _cpu(getattr(value, n)) for n in value.__dataclass_fields__})
    return value


def _stop(procs: list, grace_s: float = 5.0) -> None:
    """Join the worker processes, SIGTERM after ``grace_s``, SIGKILL a second later."""
    for p in procs:
        p.join(grace_s)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)


class TPExecutor:
    def __init__(self, path: Path, config, device: torch.device, *, load_mtp: bool = False):
        """``config``: the resolved EngineConfig (tensor_parallel_size, distributed_executor_backend, dtype)."""
        from ..models import ModelConfig
        from ..models.sharding import check_tp_size

        n = config.tensor_parallel_size
        ep = config.enable_expert_parallel
        check_tp_size(ModelConfig.from_pretrained(path), n, ep)   # before any process starts
        set_no_multicast_env()   # before any NCCL call here and before the workers are spawned (they inherit it)
        self.world_size, self.procs, self.dead = n, [], None
        self._next_cache, self._freed = 0, []
        if device.type == "cuda" and torch.cuda.device_count() < n:
            raise ConfigError(f"tensor_parallel_size {n} needs {n} GPUs, this machine has "
                              f"{torch.cuda.device_count()}; lower tensor_parallel_size")
        if config.distributed_executor_backend == "external_launcher":
            spec = DistSpec.from_env()
            if spec.rank != 0 or spec.world_size != n:
                raise ConfigError(f"the engine runs on RANK 0 of WORLD_SIZE {n} (tensor_parallel_size); the "
                                  f"environment says RANK {spec.rank} of {spec.world_size}: start "
                                  "'python -m catengine.distributed.worker' on the other ranks")
            self.store = host_store(spec.master_addr, spec.master_port, n)
        else:
            self.store = host_store("127.0.0.1", 0, n)
            ctx = mp.get_context("spawn")
            for rank in range(1, n):
                p = ctx.Process(target=spawned_main, name=f"catengine-tp{rank}", daemon=True,
                                args=(DistSpec("127.0.0.1", self.store.port, rank, n, rank), os.getpid()))
                p.start()
                self.procs.append(p)
        # the processes die with this object even if close() is never called
        self._finalizer = weakref.finalize(self, _stop, self.procs, 0.0)
        try:
            self.chan = Channel(self.store, 0, n)
            seq = self.chan.send(("init", {"path": str(path), "dtype": config.torch_dtype, "device": str(device),
                                           "load_mtp": load_mtp, "expert_parallel": ep,
                                           "one_shot": config.enable_one_shot_all_reduce}))
            self.chan.replies(seq, self.check_alive)   # every worker is up (a crashed one is seen here)
            self.group = make_group(self.store, 0, n, rank_device(device, 0), config.enable_one_shot_all_reduce)
            from ..models import load_model
            local = load_model(path, dtype=config.torch_dtype, device=device, load_mtp=load_mtp, tp=self.group,
                               expert_parallel=ep)
            # the load outcome comes as the reply to a message number no message takes: ``seq + 1`` is the next
            # one sent, read by the workers only after they replied
            for rank, (status, error) in enumerate(self.chan.replies(seq + 1, self.check_alive), 1):
                if status != "ok":
                    raise error if isinstance(error, CatEngineError) else RuntimeError(
                        f"tensor-parallel rank {rank} failed to load its shard: {error!r}")
            self.model = RemoteModel(self, local)
        except BaseException:
            self.shutdown()
            raise
        for rank, r in enumerate(self.reports()):
            log.info("tensor parallel rank %d/%d: read %.1f MB of weights, peak host RSS %.0f MB", rank, n,
                     r["read_bytes"] / 1e6, r["peak_rss_bytes"] / 1e6)

    # ------------------------------------------------------------------ liveness
    def check_alive(self, wait_s: float = 0.0) -> None:
        """EngineDead when the engine is dead or a spawned worker has exited (waiting up to ``wait_s`` for
        one to: after a failed collective the peer's exit may trail its closed sockets by a moment)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        if not self.procs:
            return
        gone = multiprocessing.connection.wait([p.sentinel for p in self.procs], timeout=wait_s)
        if gone:
            p = next(p for p in self.procs if p.sentinel in gone)
            self.fail(f"tensor-parallel worker {p.name} exited (exit code {p.exitcode})")

    def fail(self, reason: str):
        """Mark the engine dead, stop every worker, raise EngineDead."""
        if self.dead is None:
            self.dead = f"{reason}; restart the engine"
            log.error("%s: stopping all ranks", reason)
            _stop(self.procs, 0.0)
        raise EngineDead(self.dead)

    def send(self, message) -> int:
        self.check_alive()
        if self._freed:
            freed, self._freed = self._freed, []
            self.chan.send(("free", freed))
        return self.chan.send(message)

    def collective(self, seq: int, fn):
        """Run rank 0's part of the call ``seq`` announced; a failed collective kills the engine."""
        try:
            out = fn()
        except EngineDead:
            raise
        except Exception as e:  # noqa: BLE001 (gloo/NCCL raise RuntimeError subclasses on a lost peer)
            self.check_alive(wait_s=1.0)
            self.fail(f"a tensor-parallel collective failed ({type(e).__name__}: {e})")
        self.chan.trim(seq)
        return out

    # ------------------------------------------------------------------ reports and shutdown
    def reports(self) -> list[dict]:
        """Every rank's :func:`~catengine.distributed.worker.report` (rank order)."""
        seq = self.send(("report",))
        return [report(self.model.local)] + self.chan.replies(seq, self.check_alive)

    def new_cache_id(self) -> int:
        self._next_cache += 1
        return self._next_cache

    def release(self, cid: int) -> None:
        self._freed.append(cid)

    def shutdown(self) -> None:
        """Stop every worker (asked first, then signalled); idempotent."""
        if self.dead is None and hasattr(self, "chan"):
            try:
                self.chan.send(("stop",))
            except Exception:  # noqa: BLE001 (the store is gone: the workers exit on their own)
                pass
        self.dead = self.dead or "the engine was closed"
        _stop(self.procs)
        self._finalizer.detach()


class RemoteCaches:
    """Rank 0's caches, whose copies are mirrored on every worker's caches of the same id."""

    def __init__(self, executor: TPExecutor, cid: int, local):
        self.executor, self.cid, self.local = executor, cid, local
        weakref.finalize(self, executor.release, cid)

    def __getattr__(self, name):
        return getattr(self.local, name)

    def copy_state_slot(self, src: int, dst: int) -> None:
        self.executor.send(("copy_state", self.cid, src, dst))
        self.local.copy_state_slot(src, dst)

    def copy_blocks(self, copies) -> None:
        self.executor.send(("copy_blocks", self.cid, copies))
        self.local.copy_blocks(copies)


class RemoteModel:
    """The model the runner sees at TP > 1: rank 0's shard, every call announced to the workers."""

    def __init__(self, executor: TPExecutor, local):
        self.executor, self.local = executor, local

    def __getattr__(self, name):   # config, dtype, device, layout, sizes: rank 0's answers are every rank's
        return getattr(self.local, name)

    def allocate_caches(self, num_blocks: int, block_size: int, num_state_slots: int, kv_cache_dtype: str = "auto",
                        device=None, ssm_dtype: torch.dtype = torch.float32) -> RemoteCaches:
        cid = self.executor.new_cache_id()
        self.executor.send(("alloc", cid, (num_blocks, block_size, num_state_slots, kv_cache_dtype), ssm_dtype))
        return RemoteCaches(self.executor, cid, self.local.allocate_caches(
            num_blocks, block_size, num_state_slots, kv_cache_dtype, device, ssm_dtype=ssm_dtype))

    def quantize_lm_head(self, kind: str) -> None:   # every rank quantises its own vocab slice
        self.executor.send(("quantize_lm_head", kind))
        self.local.quantize_lm_head(kind)

    def __call__(self, input_ids, positions, batch, caches: RemoteCaches):
        ex = self.executor
        seq = ex.send(("forward", caches.cid, _cpu(input_ids), _cpu(positions), _cpu(batch)))
        return ex.collective(seq, lambda: self.local(input_ids, positions, batch, caches.local))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        ex, hidden = self.executor, hidden.contiguous()
        seq = ex.send(("logits", tuple(hidden.shape), hidden.dtype))
        return ex.collective(seq, lambda: self.local.compute_logits(ex.group.broadcast(hidden)))

    def build_graphs(self, cls, caches: RemoteCaches, **kwargs):
        """``cls`` (DecodeGraphs, VerifyGraphs) on every rank: see distributed/graphs.py."""
        from .graphs import build_graphs
        return build_graphs(self.executor, cls, self.local, caches, **kwargs)

    def mtp_forward(self, input_ids, positions, hidden_prev, batch, caches: RemoteCaches):
        ex, hidden_prev = self.executor, hidden_prev.contiguous()
        seq = ex.send(("mtp", caches.cid, _cpu(input_ids), _cpu(positions), tuple(hidden_prev.shape),
                       hidden_prev.dtype, _cpu(batch)))
        return ex.collective(seq, lambda: self.local.mtp_forward(input_ids, positions, ex.group.broadcast(hidden_prev),
                                                                 batch, caches.local))
