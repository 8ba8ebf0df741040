"""Where the ranks meet: a :class:`DistSpec` (from the engine or from torchrun-style env vars), the TCP
store rank 0 hosts, and the tensor-parallel process group (gloo on CPU, NCCL on CUDA).

No process-group singleton: the groups are built from the store with the backend classes directly
(not ``torch.distributed.init_process_group``), so several engines can live in one process one after
another and nothing global is left behind when one closes.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError
from .group import TPGroup

# A collective that waits this long has a dead or wedged peer; gloo and NCCL raise after it, so a step
# never hangs forever (a killed peer is seen at once: its sockets close). Start-up (loading a shard of a
# 60 GB checkpoint from a slow disk) gets the long one.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)
STARTUP_TIMEOUT = datetime.timedelta(minutes=30)
ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
# No NVLink multicast (NVLS) anywhere: NCCL's NVLS algorithms, torch symmetric memory and NVSHMEM would
# each map multicast objects, which the shared GPUs of the device runs must not (issue 23); set in every
# rank's process before any CUDA or NCCL call, and inherited by spawned workers
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def set_no_multicast_env() -> None:
    os.environ.update(NO_MULTICAST_ENV)


@dataclass(frozen=True)
class DistSpec:
    master_addr: str
    master_port: int
    rank: int
    world_size: int
    local_rank: int = 0

    @classmethod
    def from_env(cls, env=None) -> "DistSpec":
        """torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, optional LOCAL_RANK)."""
        env = os.environ if env is None else env
        missing = [k for k in ENV_VARS if not env.get(k)]
        if missing:
            raise ConfigError(f"distributed_executor_backend 'external_launcher' reads {', '.join(ENV_VARS)} from the "
                              f"environment (torchrun sets them); {', '.join(missing)} not set")
        try:
            rank, world, port = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["MASTER_PORT"])
            local = int(env.get("LOCAL_RANK", rank))
        except ValueError as e:
            raise ConfigError(f"RANK, WORLD_SIZE, MASTER_PORT and LOCAL_RANK must be integers ({e})") from None
        if not 0 <= rank < world:
            raise ConfigError(f"RANK {rank} is outside WORLD_SIZE {world}")
        return cls(env["MASTER_ADDR"], port, rank, world, local)


def host_store(addr: str, port: int, world_size: int) -> dist.TCPStore:
    """Rank 0's store (port 0: any free one, read back as ``store.port``)."""
    return dist.TCPStore(addr, port, world_size, True, timeout=STARTUP_TIMEOUT, wait_for_workers=False)


def join_store(spec: DistSpec) -> dist.TCPStore:
    return dist.TCPStore(spec.master_addr, spec.master_port, spec.world_size, False, timeout=STARTUP_TIMEOUT)


def make_group(store: dist.TCPStore, rank: int, size: int, device: torch.device, one_shot: bool = False) -> TPGroup:
    """The TP group over ``store`` (every rank calls this; it returns once all have joined). ``one_shot``: try
    the symmetric-memory all-reduce for small messages (distributed/oneshot.py; NCCL / gloo if it fails)."""
    prefixed = dist.PrefixStore("tp", store)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = COLLECTIVE_TIMEOUT
        pg = dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    else:
        pg = dist.ProcessGroupGloo(prefixed, rank, size, COLLECTIVE_TIMEOUT)
    group = TPGroup(rank, size, pg)
    if one_shot:
        from .oneshot import setup
        group.oneshot = setup(store.host, store.port, rank, size, device, pg)
    return group


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """Rank ``local_rank``'s device on its host: cuda:local_rank, or the CPU."""
    return torch.device("cuda", local_rank) if device.type == "cuda" else torch.device("cpu")
