"""Memory planning: how many KV blocks and GDN state slots the cache budget holds.

The budget is ``kv_cache_memory_bytes`` when set; otherwise on CUDA it is
``gpu_memory_utilization * total - (memory in use after loading the weights) - (activation peak of a
profiled worst-case step)`` (:meth:`catengine.runner.ModelRunner.profile_step` measures the peak), and
on CPU 256 MiB. State slots come first (one per ``max_num_seqs`` plus the snapshot pool), the rest is
KV blocks, capped by the auto-trim at ``ratio * max_model_len * max_num_seqs`` tokens.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from .config import CPU_KV_CACHE_BYTES, EngineConfig
from .errors import ConfigError

log = logging.getLogger(__name__)
# Auto snapshot pool: about this fraction of the cache budget, and at most 8 per running sequence (at
# least 64 when memory allows): each prompt and each decode block boundary may want one, and a pool that
# small evicts a repeated prompt's snapshot before it comes back.
SNAPSHOT_BUDGET_FRACTION = 0.1
SNAPSHOTS_PER_SEQ = 8
MIN_SNAPSHOT_CAP = 64


@dataclass(frozen=True)
class MemoryPlan:
    num_blocks: int
    block_size: int
    num_live_slots: int
    num_snapshot_slots: int
    max_model_len: int
    kv_bytes_per_block: int
    state_bytes_per_slot: int
    budget_bytes: int            # what the plan could use
    used_bytes: int              # what the allocated caches take

    @property
    def num_state_slots(self) -> int:
        """Slots to allocate: live, snapshots, then the padding slot of the decode CUDA graphs."""
        return self.pad_state_slot + 1

    @property
    def pad_state_slot(self) -> int:
        """The slot padding rows of a replayed decode graph write to; no sequence owns it."""
        return self.num_live_slots + self.num_snapshot_slots

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Sequences of max_model_len tokens the KV cache holds at once."""
        return self.kv_capacity_tokens / self.max_model_len

    def describe(self) -> str:
        return (f"KV cache: {self.num_blocks} blocks x {self.block_size} = {self.kv_capacity_tokens} tokens "
                f"({self.max_concurrency:.2f}x max_model_len {self.max_model_len}); state slots: "
                f"{self.num_live_slots} live + {self.num_snapshot_slots} snapshots + 1 padding; "
                f"{_gib(self.used_bytes)} of a {_gib(self.budget_bytes)} budget")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def cuda_cache_budget(cfg: EngineConfig, device: torch.device, used_before_profile: int, activation_peak: int) -> int:
    """Bytes left for caches on CUDA: utilization x total, minus everything in use after loading
    (weights, CUDA context, other processes), minus the profiled step's activation peak."""
    total = torch.cuda.get_device_properties(device).total_memory
    budget = int(cfg.gpu_memory_utilization * total) - used_before_profile - activation_peak
    log.info("GPU memory: total %s, in use after loading %s, activation peak %s, cache budget %s",
             _gib(total), _gib(used_before_profile), _gib(activation_peak), _gib(max(budget, 0)))
    return budget


def plan_memory(cfg: EngineConfig, *, kv_bytes_per_block: int, state_bytes_per_slot: int, hybrid: bool,
                max_position_embeddings: int, budget_bytes: int | None = None) -> MemoryPlan:
    """Split the cache budget. ``cfg`` is resolved (max_num_seqs set); ``budget_bytes`` is the
    profiled CUDA budget (None: ``kv_cache_memory_bytes`` or the CPU default)."""
    bs, seqs = cfg.block_size, cfg.max_num_seqs
    explicit_budget = cfg.kv_cache_memory_bytes is not None
    budget = cfg.kv_cache_memory_bytes if explicit_budget else (
        budget_bytes if budget_bytes is not None else CPU_KV_CACHE_BYTES)
    want_len = cfg.max_model_len or max_position_embeddings
    # a drafting sequence holds k more live slots: the verify forward writes the state after each of its k+1
    # tokens to its own slot and the sequence continues from the accepted one (rollback without copies); at most
    # speculative_disable_by_batch_size sequences draft at once (SchedulerConfig.num_live_slots agrees)
    live = seqs + min(seqs, cfg.speculative_disable_by_batch_size) * cfg.num_speculative_tokens
    live_bytes = (live + 1) * state_bytes_per_slot   # + the padding slot (see MemoryPlan.pad_state_slot)

    if cfg.enable_prefix_caching and hybrid and state_bytes_per_slot:
        if cfg.num_state_snapshots is not None:
            snapshots = cfg.num_state_snapshots
        else:
            snapshots = max(1, min(max(SNAPSHOTS_PER_SEQ * seqs, MIN_SNAPSHOT_CAP),
                                    int(SNAPSHOT_BUDGET_FRACTION * max(budget, 0)) // state_bytes_per_slot))
    else:
        snapshots = 0

    def blocks_with(num_snapshots: int) -> int:
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        left = budget - live_bytes - num_snapshots * state_bytes_per_slot
        if kv_bytes_per_block == 0:
            # no full-attention layer: blocks cost nothing (the scheduler still counts tokens in them), so
            # every sequence gets max_model_len, as long as the state slots fit
            return -(-want_len * seqs // bs) if left >= 0 else 0
        return max(0, left) // kv_bytes_per_block

    need = -(-want_len // bs)
    num_blocks = blocks_with(snapshots)
    if num_blocks < need and cfg.num_state_snapshots is None and snapshots > 1:
        # the snapshot pool is an optimisation: shrink it before shrinking what a sequence can hold
        snapshots = 1
        num_blocks = blocks_with(snapshots)
    if num_blocks < need:
        if cfg.max_model_len is None and num_blocks >= 1:
            max_model_len = num_blocks * bs
            log.warning("the KV cache holds %d tokens, fewer than the model's %d positions: max_model_len set to "
                        "%d (give the cache more memory for longer sequences)", max_model_len, want_len,
                        max_model_len)
            want_len, need = max_model_len, num_blocks
        else:
            raise _too_small(cfg, want_len, need, num_blocks, budget, kv_bytes_per_block,
                             live_bytes + snapshots * state_bytes_per_slot)
    if cfg.kv_cache_auto_trim_ratio > 0 and not explicit_budget and cfg.num_kv_blocks is None:
        cap = max(need, math.ceil(cfg.kv_cache_auto_trim_ratio * want_len * seqs / bs))
        num_blocks = min(num_blocks, cap)
    used = num_blocks * kv_bytes_per_block + live_bytes + snapshots * state_bytes_per_slot
    return MemoryPlan(num_blocks=num_blocks, block_size=bs, num_live_slots=live, num_snapshot_slots=snapshots,
                      max_model_len=want_len, kv_bytes_per_block=kv_bytes_per_block,
                      state_bytes_per_slot=state_bytes_per_slot, budget_bytes=budget, used_bytes=used)


def _too_small(cfg: EngineConfig, max_model_len: int, need: int, have: int, budget: int, kv_bytes_per_block: int,
               state_bytes: int) -> ConfigError:
    if cfg.num_kv_blocks is not None:
        return ConfigError(f"num_kv_blocks={cfg.num_kv_blocks} holds {cfg.num_kv_blocks * cfg.block_size} tokens but "
                           f"max_model_len is {max_model_len} ({need} blocks); raise num_kv_blocks or lower "
                           f"max_model_len")
    if kv_bytes_per_block == 0:
        return ConfigError(
            f"the {cfg.max_num_seqs} GDN state slots and the snapshot pool take {_gib(state_bytes)}, more than the "
            f"{_gib(max(budget, 0))} cache budget; lower max_num_seqs or raise {_budget_knob(cfg)}")
    needed = need * kv_bytes_per_block + state_bytes
    fits = max(0, budget - state_bytes) // kv_bytes_per_block * cfg.block_size
    where = _budget_knob(cfg)
    fp8 = " or kv_cache_dtype='fp8_e5m2' (halves the KV size)" if cfg.kv_cache_dtype == "auto" else ""
    if fits == 0:
        return ConfigError(
            f"the {cfg.max_num_seqs} GDN state slots and the snapshot pool take {_gib(state_bytes)}, leaving no room "
            f"for KV blocks in the {_gib(max(budget, 0))} cache budget; lower max_num_seqs or raise {where}")
    return ConfigError(
        f"max_model_len {max_model_len} needs {_gib(needed)} for one sequence's KV ({need} blocks of "
        f"{kv_bytes_per_block} bytes) plus {cfg.max_num_seqs} state slots and the snapshot pool, but only "
        f"{_gib(max(budget, 0))} is available for caches (room for {fits} tokens, {have} blocks). Lower max_model_len "
        f"to at most {max(fits, 0)}, lower max_num_seqs, raise {where}{fp8}.")


def _budget_knob(cfg: EngineConfig) -> str:
    return ("kv_cache_memory_bytes" if cfg.kv_cache_memory_bytes is not None
            else "the CPU cache budget (set kv_cache_memory_bytes)" if cfg.device == "cpu"
            else "gpu_memory_utilization")
