"""Optional one-shot all-reduce for small messages (decode steps), on torch's symmetric memory.

Off unless ``EngineConfig.enable_one_shot_all_reduce`` (not measured yet: issue 23 runs the multi-GPU
numbers). Each rank copies its fp32 partial sums into a buffer every rank can read (CUDA peer access,
no multicast: the GPUs are shared and NVLS is off, see :data:`catengine.distributed.launch.NO_MULTICAST_ENV`)
and one kernel, ``torch.ops.symm_mem.one_shot_all_reduce``, reads all of them and sums: one launch, no
ring. Messages above :data:`MAX_BYTES` (prefill) take NCCL.

Setting up must not hang: the V100 fork's custom all-reduce deadlocks at start-up on some TP2 V100 hosts.
The rendezvous (IPC handles swapped through the store) runs in a thread with :data:`RENDEZVOUS_TIMEOUT_S`,
over its own store client with that timeout, and the ranks then agree over the TP group (NCCL): unless
every rank succeeded, all of them use NCCL, and each says so in one log line. On the CPU (gloo) the flag
falls back the same way. The sum is fp32 (TPGroup.all_reduce widens 16-bit partials first).
"""
from __future__ import annotations

import datetime
import logging
import threading

import torch
import torch.distributed as dist

log = logging.getLogger("catengine.distributed")

MAX_BYTES = 1 << 20            # fp32 bytes: 27B decode at 51 sequences (5120 x 4 B a row)
RENDEZVOUS_TIMEOUT_S = 60.0


def within(fn, timeout_s: float):
    """``fn()``'s result, or raise TimeoutError when it has not returned after ``timeout_s`` (it is left
    running in a daemon thread, which does not keep the process alive)."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            out["error"] = e

    t = threading.Thread(target=target, name="catengine-symm-mem-rendezvous", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"symmetric-memory rendezvous did not finish in {timeout_s:.0f} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


class OneShotAllReduce:
    """fp32 sums of up to MAX_BYTES over the ranks through one symmetric buffer."""

    def __init__(self, buffer: torch.Tensor, name: str):
        self.buffer, self.name = buffer, name
        self.max_numel = buffer.numel()

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        n = y.numel()
        self.buffer[:n].copy_(y.reshape(-1))
        return torch.ops.symm_mem.one_shot_all_reduce(self.buffer[:n], "sum", self.name).view(y.shape)


def setup(addr: str, port: int, rank: int, size: int, device: torch.device, pg,
          timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> OneShotAllReduce | None:
    """The one-shot all-reduce every rank agreed on, or None (NCCL / gloo for everything; logged once per
    rank). Every rank of the group calls this at the same point."""
    why, oneshot = None, None
    if device.type != "cuda":
        why = "it needs CUDA (torch symmetric memory); this group runs on gloo"
    else:
        try:
            oneshot = within(lambda: _rendezvous(addr, port, rank, size, device, pg, timeout_s), timeout_s)
        except Exception as e:  # noqa: BLE001 (any failure: NCCL serves, never a hang)
            why = f"{type(e).__name__}: {e}"
    # every rank must take the same path: a rank summing over NCCL while another waits in the one-shot
    # kernel would hang both
    ok = torch.tensor([0.0 if why else 1.0], device=device)
    pg.allreduce([ok]).wait()
    if why is None and int(ok.item()) != size:
        why = "another rank's set-up failed"
    if why is not None:
        log.warning("one-shot all-reduce is off, falling back to %s (%s)",
                    "NCCL" if device.type == "cuda" else "gloo", why)
        return None
    log.info("one-shot all-reduce on symmetric memory for messages up to %d KB", MAX_BYTES >> 10)
    return oneshot


def _rendezvous(addr, port, rank, size, device, backend, timeout_s) -> OneShotAllReduce:
    from torch._C._distributed_c10d import ProcessGroup, _register_process_group, _SymmetricMemory
    from torch.distributed import _symmetric_memory as symm_mem

    torch.cuda.set_device(device)   # this runs in its own thread, whose current device is not the rank's
    # a store client of its own, so a lost peer times the swap out instead of the engine's 30-minute wait
    store = dist.TCPStore(addr, port, size, False, timeout=datetime.timedelta(seconds=timeout_s))
    name = f"catengine-tp-{port}"
    # the symm_mem ops look their group up by name (c10d's registry): our NCCL backend, registered under a name
    # of its own (catengine builds no global process group)
    group = ProcessGroup(dist.PrefixStore("symm_pg", store), rank, size)
    group._set_default_backend(ProcessGroup.BackendType.NCCL)
    group._register_backend(device, ProcessGroup.BackendType.NCCL, backend)
    group._set_group_name(name)
    _register_process_group(name, group)
    _SymmetricMemory.set_group_info(name, rank, size, dist.PrefixStore("symm_mem", store))
    buf = symm_mem.empty(MAX_BYTES // 4, dtype=torch.float32, device=device)
    symm_mem.rendezvous(buf, name)
    torch.cuda.synchronize(device)
    return OneShotAllReduce(buf, name)
