"""The engine's step loop: schedule, launch on the device, take the tokens back, and turn them into outputs.

Synchronous, each step is scheduled, run and finished (its tokens detokenized, stops checked, sequences freed)
before the next is scheduled: the GPU idles while the host works. With async scheduling (``EngineConfig.
async_scheduling``, vLLM's name; SGLang calls it the overlap scheduler) one step stays in flight: while the GPU
runs step n the host schedules and launches step n+1, then finishes step n-1. Step n+1 is scheduled as if each
sequence of step n got its token (a placeholder, :mod:`catengine.scheduler.in_flight`), and its input ids read
step n's sampled ids on the device (:func:`catengine.models.batch.resolve_placeholders`). A sequence found
finished one step late (EOS, stop string, max_tokens, abort) has the extra step undone for it
(:func:`in_flight.discard`) before :meth:`Scheduler.finish` frees its blocks and slot; the GPU's extra work for
it goes to blocks and a slot that nothing reads before they are written again (all in one stream's order).

A step runs synchronously (finished before the next is scheduled) when the next one would need its tokens on
the host: forks of n > 1 (a child starts from its leader's token), speculative verification (the accepted
count decides the next step; async scheduling is off while speculating), and sample rows whose next
draw reads the token history (repetition / presence / frequency penalties) or a grammar's state (structured
outputs). Outputs are the same either way, token for token (tests/test_async_scheduling.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .step_result import PendingStep
from .scheduler import SchedulerOutput, Sequence
from .scheduler import in_flight
from .spec.stats import count_spec


def needs_history(seq: Sequence) -> bool:
    """Whether ``seq``'s next draw reads its previous tokens on the host (penalties, a grammar's state)."""
    p = seq.params
    return seq.grammar is not None or (p is not None and (
        p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0))


def must_sync(out: SchedulerOutput) -> bool:
    """Whether the step after ``out`` needs ``out``'s tokens on the host before it is scheduled."""
    return any(it.num_drafts or it.num_samples > 1 or (it.num_samples and needs_history(it.seq))
               for it in out.scheduled)


@dataclass
class Step:
    out: SchedulerOutput
    pending: PendingStep
    sync: bool            # finished before the next step is scheduled (else advanced with placeholders)


class StepLoop:
    def __init__(self, engine, overlap: bool):
        self.engine = engine
        self.overlap = overlap
        self.in_flight: Step | None = None   # launched and advanced, its tokens not taken yet (overlap only)
        self.num_overlapped = 0              # steps launched while the one before was still in flight

    def advance(self) -> None:
        """One scheduler step when there is work; then the outputs of the step before it (overlap) or of
        this one (synchronous) are applied to the engine's requests."""
        sched = self.engine.scheduler
        prev, self.in_flight = self.in_flight, None
        step = None
        if sched.has_unfinished():
            out = sched.schedule()
            if not out.is_empty:
                step = self._launch(out, prev)
            elif prev is None:
                raise RuntimeError("the scheduler has work but scheduled nothing; this is a bug")
        if prev is not None:
            self._finish(prev, step)
        if step is not None:
            if step.sync or not sched.has_unfinished():   # nothing left to overlap with: no step left behind
                self._finish(step, None)
            else:
                self.in_flight = step

    def drop(self) -> None:
        """Forget the step in flight (the engine is closing: its sequences were aborted)."""
        self.in_flight = None

    # ------------------------------------------------------------------ the two halves of a step
    def _launch(self, out: SchedulerOutput, prev: Step | None) -> Step:
        e = self.engine
        now = time.time()
        for item in out.scheduled:
            metrics = e._requests[item.seq.request_id].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        sync = not self.overlap or must_sync(out)
        pending = e.runner.launch(out, prev.pending.tokens if prev is not None else None)
        self.num_overlapped += prev is not None
        if not sync:
            in_flight.advance(e.scheduler, out)
        e._counters["num_steps"] += 1
        return Step(out, pending, sync)

    def _finish(self, step: Step, next_step: Step | None) -> None:
        """Take ``step``'s tokens and apply them: detokenize, stops, finishes. ``next_step``: the step launched
        after it (async scheduling), for which a sequence found finished here is discarded."""
        e, sched, out = self.engine, self.engine.scheduler, step.out
        result = step.pending.result()
        for seq, first, entries in result.prompt_logprobs:   # before the tokens: the first delta carries them
            e._requests[seq.request_id].add_prompt_logprobs(first, entries)
        if step.sync:
            events = sched.update(out, result.token_ids, result.accepted)
        else:
            events = in_flight.resolve(sched, out, result.token_ids)
            if next_step is not None and not next_step.sync:   # its snapshots of blocks ending in these tokens
                in_flight.commit_snapshots(sched, next_step.out)
        count_spec(e._counters, out, result.accepted)
        later = None   # next_step's items by sequence, built when a sequence finishes
        now = time.time()
        max_len = e.config.max_model_len
        for seq, token, row in events:
            if seq.is_finished:
                continue   # a stop inside an accepted run of drafts: the tokens after it are dropped
            state = e._requests[seq.request_id]
            c = state.completions[seq.index]
            c.seq = seq
            seq.grammar = c.grammar   # a fork's first token came from its leader's mask; its own from now on
            if state.metrics.first_token_time is None:
                state.metrics.first_token_time = now
                state.num_cached_tokens = seq.num_cached_tokens
                e._counters["prompt_tokens_total"] += len(state.prompt_token_ids)
            state.metrics.last_token_time = now
            e._counters["generation_tokens_total"] += 1
            reason = c.add_token(token, result.logprobs[row], max_len, len(state.prompt_token_ids))
            if reason is not None:
                if next_step is not None and not next_step.sync:
                    if later is None:
                        later = {it.seq: it for it in next_step.out.scheduled}
                    if seq in later:
                        in_flight.discard(later[seq])
                sched.finish(seq, reason)
                e._finish_reasons[reason] += 1
                if state.finished:
                    state.metrics.finished_time = now
            e._touched[state.request_id] = state
