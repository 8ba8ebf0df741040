"""Async scheduling's share of the scheduler: a step's bookkeeping in two halves, so that the next step can be
scheduled while this one still runs on the GPU.

:func:`advance` (when the step is launched) assumes its outcome: every scheduled sequence has computed its
tokens, and each sampled one gets a *placeholder* token ``-1 - row`` (the row of the step's sampled-token
tensor; the runner swaps it for the real id on the device when the next step reads it as its input).
:func:`resolve` (when the step's tokens reach the host, one step later) writes the real ids over the
placeholders. A sequence the engine then finds finished (EOS, stop string, abort) may already be in the next
step: :func:`discard` undoes that step's :func:`advance` for it, so :meth:`Scheduler.finish` frees what it
would have freed without the overlap. Steps that fork (n > 1), verify drafts or need the token history on
the host never take this path (catengine/step_loop.py decides).
"""
from __future__ import annotations

from dataclasses import dataclass

from .request import Sequence
from .step_types import ScheduledSeq, SchedulerOutput


def placeholder(row: int) -> int:
    """The stand-in for the token sampled in row ``row`` of a step still running (negative: never a real id)."""
    return -1 - row


def advance(sched, out: SchedulerOutput) -> None:
    """Apply a launched step as :meth:`Scheduler.update` would, its sampled tokens still unknown (forks and drafts
    excluded: such steps are synchronous). Its computed blocks and state snapshots are offered to the cache now
    (the GPU writes them before any later step reads them), except blocks that hold a placeholder."""
    row = 0
    for item in out.scheduled:
        assert not item.num_drafts and item.num_samples <= 1, "async scheduling got a fork or verify step"
        seq = item.seq
        seq.num_computed = item.end
        sched.blocks.register_full_blocks(seq)
        if item.num_samples:
            seq.token_ids.append(placeholder(row))
            seq.num_unresolved += 1
            row += 1
    commit_snapshots(sched, out, final=False)


def resolve(sched, out: SchedulerOutput, sampled: list[int]) -> list[tuple[Sequence, int, int]]:
    """The step's real tokens over its placeholders; returns (sequence, token, row) for the sequences still
    live, as :meth:`Scheduler.update` does. The blocks that held a placeholder go to the prefix cache now."""
    events = []
    row = 0
    for item in out.scheduled:
        seq = item.seq
        if item.num_samples:
            if not seq.is_finished:
                # the placeholder sits right after the tokens this step computed, whatever happened since
                # (a later step's placeholder after it, a preemption that reset num_computed)
                assert seq.token_ids[item.end] == placeholder(row), (seq, item)
                seq.token_ids[item.end] = sampled[row]
                seq.num_unresolved -= 1
                events.append((seq, sampled[row], row))
            row += 1
        if not seq.is_finished:
            sched.blocks.register_full_blocks(seq)
    return events


def discard(item: ScheduledSeq) -> None:
    """Undo :func:`advance` for ``item``'s sequence, which turned out to be finished before the step ran: its
    extra token is dropped (the GPU still computes it, into blocks and a slot freed after it in stream order)."""
    seq = item.seq
    seq.num_computed = item.start
    if item.num_samples:
        assert seq.token_ids[-1] < 0 and seq.num_unresolved, seq
        seq.token_ids.pop()
        seq.num_unresolved -= 1


@dataclass(frozen=True, eq=False)
class UnknownKey:
    """The key of a state snapshot whose block ends in a placeholder (``seq.token_ids[end - 1]``): the snapshot
    slot is reserved under this stand-in, unique by identity, and takes the block's key once the token is known."""
    seq: Sequence
    end: int


def commit_snapshots(sched, out: SchedulerOutput, final: bool = True) -> None:
    """The step's state snapshots become visible (or are given back when their block is not cached). A snapshot
    whose block key is unknown waits (``final`` False: the step was just launched) or, on the final call (the
    step before was resolved), takes its key (:class:`UnknownKey`); one still unknown then is given back (its
    token never came: not reachable through the engine, which schedules no finished sequence, but a slot
    must not leak)."""
    left = []
    for key in out.snapshot_keys:
        if isinstance(key, UnknownKey):
            seq, end, bs = key.seq, key.end, sched.block_size
            if end > seq.num_resolved:
                if not final:
                    left.append(key)
                else:
                    sched.states.cancel(key)
                continue
            real = seq.compute_hashes(end // bs, bs)[end // bs - 1]
            if not sched.states.rekey(key, real):
                continue
            key = real
        if key in sched.blocks.cached:
            sched.states.commit(key)
        else:
            sched.states.cancel(key)
    out.snapshot_keys = left
