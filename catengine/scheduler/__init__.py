"""Continuous batching: sequences, paged KV blocks with prefix caching, GDN state slots, the scheduler.

Pure Python on host data; the runner turns a :class:`SchedulerOutput` into tensors.
"""
from .block_manager import BlockManager
from .request import Sequence, SeqStatus, hash_block
from .scheduler import ScheduledSeq, Scheduler, SchedulerConfig, SchedulerOutput, SchedulerStats
from .state_cache import StateCache

__all__ = ["BlockManager", "Sequence", "SeqStatus", "hash_block", "ScheduledSeq", "Scheduler", "SchedulerConfig",
           "SchedulerOutput", "SchedulerStats", "StateCache"]
