"""The loop of every rank > 0: load this rank's shard, then run each model call rank 0 announces.

Spawned by rank 0 (distributed_executor_backend "mp") or started by a launcher on any host with
torchrun-style env vars (``python -m catengine.distributed.worker``, "external_launcher"). Either way
the worker learns the model and settings from rank 0's first message, so it takes no arguments.

A worker never outlives rank 0: spawned ones get SIGKILL when their parent dies (Linux
PR_SET_PDEATHSIG), and every worker exits when the store's socket closes. Any error in a step ends the
worker (rank 0 sees its sockets close and raises EngineDead); Ctrl+C is left to rank 0, which stops
the workers in order.
"""
from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import sys
import traceback

import torch

from .channel import Channel
from .graphs import handle as graph_message
from .launch import DistSpec, join_store, make_group, rank_device, set_no_multicast_env

log = logging.getLogger("catengine.distributed")


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def spawned_main(spec: DistSpec, parent_pid: int) -> None:
    """Entry of a worker spawned by rank 0."""
    _die_with_parent()
    if os.getppid() != parent_pid:   # the parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the terminal's Ctrl+C goes to rank 0, which stops us
    run(spec)


def _to(value, device: torch.device):
    """Tensors (also inside a BatchMetadata) onto this rank's device."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            setattr(value, name, _to(getattr(value, name), device))
    return value


def run(spec: DistSpec) -> None:
    set_no_multicast_env()   # a launcher's worker too, before any CUDA or NCCL call
    store = join_store(spec)
    chan = Channel(store, spec.rank, spec.world_size)
    seq, (op, init) = chan.recv()
    assert op == "init", op
    device = rank_device(torch.device(init["device"]), spec.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:   # the ranks of one host share its cores (rank 0 keeps its own setting)
        torch.set_num_threads(max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // spec.world_size)))
    chan.reply(seq, "joined")   # rank 0 waits for this (watching the processes) before the group forms
    group = make_group(store, spec.rank, spec.world_size, device, init["one_shot"])
    from ..models import load_model

    try:
        model = load_model(init["path"], dtype=init["dtype"], device=device, load_mtp=init["load_mtp"],
                           progress=False, tp=group, expert_parallel=init["expert_parallel"])
    except Exception as e:  # noqa: BLE001 (rank 0 raises it: the user sees one error, from the engine)
        chan.reply(seq + 1, ("error", e))
        return
    chan.reply(seq + 1, ("ok", None))
    caches: dict[int, object] = {}
    graphs: dict[int, object] = {}   # the runner's CUDA graphs, this rank's (distributed/graphs.py)
    with torch.inference_mode():
        while True:
            seq, msg = chan.recv()
            op = msg[0]
            if op == "stop":
                return
            if op == "alloc":
                caches[msg[1]] = model.allocate_caches(*msg[2], device=device, ssm_dtype=msg[3])
            elif op == "quantize_lm_head":
                model.quantize_lm_head(msg[1])
            elif op == "free":
                for cid in msg[1]:
                    caches.pop(cid, None)
                    graphs.pop(cid, None)
            elif op == "forward":
                _, cid, ids, pos, batch = msg
                model(_to(ids, device), _to(pos, device), _to(batch, device), caches[cid])
            elif op == "logits":
                model.compute_logits(group.broadcast(torch.empty(msg[1], dtype=msg[2], device=device)))
            elif op == "mtp":
                _, cid, ids, pos, shape, dtype, batch = msg
                hidden = group.broadcast(torch.empty(shape, dtype=dtype, device=device))
                model.mtp_forward(_to(ids, device), _to(pos, device), hidden, _to(batch, device), caches[cid])
            elif op == "copy_blocks":
                caches[msg[1]].copy_blocks(msg[2])
            elif op == "copy_state":
                caches[msg[1]].copy_state_slot(msg[2], msg[3])
            elif op == "report":
                chan.reply(seq, {**report(model), "graph_runs": {gid: g.num_runs for gid, g in graphs.items()}})
            else:
                graph_message(msg, model, caches, graphs, device, chan, seq)


def report(model) -> dict:
    """What this rank read and holds (tests and the start-up log)."""
    from .launch import NO_MULTICAST_ENV
    return {"reads": model.load_reads, "read_bytes": sum(r[-1] for r in model.load_reads),
            "peak_rss_bytes": peak_rss_bytes(), "env": {k: os.environ.get(k) for k in NO_MULTICAST_ENV},
            "one_shot": model.group.oneshot is not None}


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux carries that across fork and exec,
    so a spawned worker would report its parent's peak."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(DistSpec.from_env())
    except Exception:  # noqa: BLE001 (a launcher only sees the exit code; the log says why)
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    # exit as a spawned worker does (multiprocessing ends its children with os._exit): an interpreter teardown
    # with the gloo / NCCL group and the store client still alive can race their native threads' destructors
    # ("terminate called without an active exception", SIGABRT: seen under load in the torchrun-style test)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
