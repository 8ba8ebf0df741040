"""Continuous-batching scheduler: who runs this step and with how many tokens.

Each step, under a token budget (``max_num_batched_tokens``) and ``max_num_seqs``:
1. running sequences that want one token (decodes), oldest first;
2. running sequences still in a prompt (chunked prefill, or a recompute after preemption);
3. waiting sequences, FCFS, each starting from its longest usable prefix-cache hit.
When KV blocks run out, the newest running sequence is preempted (its blocks and state slot are
freed; it goes back to waiting and later recomputes everything) until the older one fits; a prompt
chunk first shrinks to the blocks there are. With speculative decoding a decode also verifies up to k drafts
(``ScheduledSeq.num_drafts``; :meth:`Scheduler.update` takes the accepted tokens and rolls the GDN state back
by swapping live slots). Nothing here touches a GPU tensor: the runner performs
the block/state copies listed in :class:`SchedulerOutput`.
"""
from __future__ import annotations

import bisect
import itertools

from ..errors import CapacityExceeded, ContextTooLong, InvalidRequest
from .block_manager import BlockManager
from .drafts import commit_verify, take_draft_slots
from .in_flight import UnknownKey, commit_snapshots
from .request import Sequence, SeqStatus, hash_block
from .state_cache import StateCache
from .step_types import ScheduledSeq, SchedulerConfig, SchedulerOutput, SchedulerStats


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = c = config
        self.caching = c.enable_prefix_caching
        self.blocks = BlockManager(c.num_blocks, c.block_size, c.enable_prefix_caching)
        self.states = StateCache(c.num_live_slots, c.num_snapshot_slots if c.enable_prefix_caching else 0)
        self.blocks.on_evict.append(self.states.drop)
        self.waiting: list[Sequence] = []   # sorted by sort_key (FCFS)
        self.running: list[Sequence] = []   # sorted by sort_key: running[-1] is the newest
        self.requests: dict[str, list[Sequence]] = {}
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        # fork copies decided after a step, performed before the next forward:
        # (child, its preemption count then, "block" | "state", src, dst)
        self._fork_copies: list[tuple[Sequence, int, str, int, int]] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.num_preemptions = 0

    @property
    def block_size(self) -> int:
        """Tokens per KV block: the block manager's (from the memory plan through SchedulerConfig)."""
        return self.blocks.block_size

    # ------------------------------------------------------------------ requests
    def check_fits(self, num_prompt_tokens: int, max_total_tokens: int) -> None:
        """Raise if a sequence of this size could never run (called before anything is queued)."""
        c = self.config
        if num_prompt_tokens < 1:
            raise InvalidRequest("the prompt is empty; send at least one token")
        if max_total_tokens > c.max_model_len:
            raise ContextTooLong(
                f"prompt ({num_prompt_tokens} tokens) plus max_tokens ({max_total_tokens - num_prompt_tokens}) is "
                f"{max_total_tokens} tokens, more than max_model_len ({c.max_model_len}); shorten the prompt or "
                f"lower max_tokens")
        need = self.blocks.blocks_for(max_total_tokens)
        if need > c.num_blocks:
            raise CapacityExceeded(
                f"a sequence of {max_total_tokens} tokens needs {need} KV blocks but the cache has {c.num_blocks}; "
                f"lower max_tokens or give the KV cache more memory")

    def add(self, request_id: str, prompt_token_ids: list[int], max_total_tokens: int, *, params=None,
            seed: int = 0, forks: list[tuple[int, object]] | None = None, skip_prefix_cache: bool = False
            ) -> Sequence:
        """Queue a request's leader sequence. ``forks``: (seed, params) of completions 1..n-1, forked
        from the leader once its prompt is computed. ``skip_prefix_cache``: compute every prompt
        position (its blocks are still offered to the cache for others)."""
        if request_id in self.requests:
            raise InvalidRequest(f"request id {request_id!r} is already in use; pick a unique id")
        self.check_fits(len(prompt_token_ids), max_total_tokens)
        seq = Sequence(seq_id=next(self._ids), request_id=request_id, index=0, token_ids=list(prompt_token_ids),
                       num_prompt_tokens=len(prompt_token_ids), max_total_tokens=max_total_tokens,
                       arrival=next(self._arrivals), params=params, seed=seed, forks=list(forks or []),
                       skip_prefix_cache=skip_prefix_cache)
        self.requests[request_id] = [seq]
        self.waiting.append(seq)  # the newest arrival sorts last
        return seq

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (stop, length or abort): free its blocks and slot. Idempotent."""
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        else:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_status = reason
        seqs = self.requests.get(seq.request_id)
        if seqs is not None and all(s.is_finished and not s.forks for s in seqs):
            del self.requests[seq.request_id]

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every live sequence of a request (and cancel its pending forks); returns them."""
        seqs = self.requests.get(request_id, [])
        live = [s for s in seqs if not s.is_finished]
        for s in seqs:
            s.forks.clear()
        for s in live:
            self.finish(s, "abort")
        self.requests.pop(request_id, None)
        return live

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    # ------------------------------------------------------------------ scheduling
    def _chunk(self, seq: Sequence, start: int, limit: int) -> int:
        """How many of ``seq``'s pending tokens from ``start`` to run, at most ``limit``. With prefix
        caching on a hybrid model a chunk ends on the last block boundary before the final token (so
        the GDN state there is saved and a later prompt sharing the prefix hits; a hit always leaves
        one token to compute) and at ``seq.save_point``, and a chunk cut short by ``limit`` ends on
        a block boundary when it can."""
        total = seq.num_tokens
        end = start + min(total - start, limit)
        if self.caching and self.config.hybrid:
            bs = self.block_size
            for boundary in (seq.save_point, (total - 1) // bs * bs):
                if start < boundary < end:
                    end = boundary
            if end < total and start < end // bs * bs:
                end = end // bs * bs
        return end - start

    def _release(self, seq: Sequence) -> None:
        self.blocks.free_seq(seq)
        if seq.state_slot is not None:
            self.states.release_live(seq.state_slot)
            seq.state_slot = None
        for slot in seq.spare_slots:
            self.states.release_live(slot)
        seq.spare_slots = []

    def _num_drafts(self, seq: Sequence, budget: int, drafting: bool) -> int:
        c = self.config
        # every sequence that could still be admitted keeps a live slot
        reserve = c.max_num_seqs - len(self.running)
        return take_draft_slots(seq, self.states, c.num_speculative_tokens if drafting else 0, budget, reserve)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

    def _prefix_hit(self, seq: Sequence) -> tuple[list[int], tuple[int, int] | None]:
        """Cached blocks ``seq`` can start from, and (key, snapshot slot) of the state to restore.
        At least one token is always left to compute: its logits give the next token.

        On a hybrid model the usable prefix ends at the last cached block whose state snapshot
        exists. When the cached KV prefix reaches further (a prefix shared with an earlier prompt,
        such as a system prompt, whose state was not saved at its end), ``seq.save_point`` makes
        this sequence's prefill stop there once so that the next prompt sharing it hits."""
        if not self.caching or not seq.reads_prefix_cache:
            return [], None   # a recompute after the first token may hit: the prompt's logprobs are out
        max_blocks = (seq.num_tokens - 1) // self.block_size
        keys = seq.compute_hashes(max_blocks, self.block_size)[:max_blocks]
        hits = self.blocks.lookup(keys)
        if not self.config.hybrid:
            return hits, None
        seq.save_point = len(hits) * self.block_size
        for j in range(len(hits), 0, -1):
            slot = self.states.lookup(keys[j - 1])
            if slot is not None:
                return hits[:j], (keys[j - 1], slot)
        return [], None

    def schedule(self) -> SchedulerOutput:
        c, bs = self.config, self.block_size
        budget = c.max_num_batched_tokens
        chosen: dict[Sequence, int] = {}
        out = SchedulerOutput(scheduled=[])
        restores: list[tuple[int, int]] = []

        drafts: dict[Sequence, int] = {}
        drafting = 0 < c.num_speculative_tokens and len(self.running) <= c.spec_disable_batch_size
        for decode_pass in (True, False):
            for seq in list(self.running):
                if budget == 0:
                    break
                if seq.status is not SeqStatus.RUNNING or seq in chosen or (seq.num_pending == 1) != decode_pass:
                    continue
                if seq.num_tokens >= seq.max_total_tokens:
                    continue   # its last token is still on the GPU (async scheduling): it ends when that comes
                num_new = self._chunk(seq, seq.num_computed, budget)
                if decode_pass:
                    # a verify step computes the pending token and its drafts; short of blocks, drop the drafts
                    # before preempting anyone
                    m = self._num_drafts(seq, budget, drafting) if drafting or seq.spare_slots else 0
                    if m and self.blocks.allocate(seq, seq.num_computed + 1 + m):
                        drafts[seq] = m
                        num_new = 1 + m
                while not self.blocks.allocate(seq, seq.num_computed + num_new):
                    room = (len(seq.block_table) + self.blocks.num_available) * bs - seq.num_computed
                    if not decode_pass and room > 0:
                        num_new = self._chunk(seq, seq.num_computed, min(budget, room))
                        continue
                    victim = self.running[-1]
                    budget += chosen.pop(victim, 0)
                    self._preempt(victim)
                    out.preempted.append(victim)
                    drafts.pop(victim, None)
                    if victim is seq:
                        num_new = 0
                        break
                if num_new:
                    chosen[seq] = num_new
                    budget -= num_new

        while self.waiting and budget > 0 and len(self.running) < c.max_num_seqs and self.states.num_free_live:
            seq = self.waiting[0]
            hits, snapshot = self._prefix_hit(seq)
            start = len(hits) * bs
            room = (len(hits) + self.blocks.num_available - self.blocks.num_evictable_among(hits)) * bs - start
            if min(room, budget) <= 0:
                break  # FCFS: nobody overtakes the head of the queue
            num_new = self._chunk(seq, start, min(room, budget))
            self.waiting.pop(0)
            self.blocks.take_cached(seq, hits)
            seq.num_computed = start
            allocated = self.blocks.allocate(seq, start + num_new)
            assert allocated, "admission computed room wrongly"
            seq.state_slot = self.states.allocate_live()
            if snapshot is not None:
                self.states.touch(snapshot[0])
                restores.append((snapshot[1], seq.state_slot))
            # a sequence that may not read the cache made no query (vLLM counts it neither)
            self.prefix_queries += seq.num_tokens if self.caching and seq.reads_prefix_cache else 0
            self.prefix_hits += start
            if not seq.admitted:
                seq.num_cached_tokens, seq.admitted = start, True
            seq.status = SeqStatus.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.sort_key)
            chosen[seq] = num_new
            budget -= num_new

        for child, preemptions, kind, src, dst in self._fork_copies:
            # a child preempted (or finished) since its fork recomputes instead: its copies are void
            if child.status is SeqStatus.RUNNING and child.num_preemptions == preemptions:
                (out.block_copies if kind == "block" else out.state_copies).append((src, dst))
        self._fork_copies.clear()
        out.state_copies.extend(restores)  # after the fork copies: a restore may reuse a finished parent's slot

        for seq in self.running:  # batch order = FCFS order
            num_new = chosen.get(seq)
            if num_new is None:
                continue
            start = seq.num_computed
            end = start + num_new
            m = drafts.get(seq, 0)
            samples = 0 if end - m < seq.num_tokens else 1 + len(seq.forks)
            out.scheduled.append(ScheduledSeq(seq, start, num_new, samples, num_drafts=m))
            # a verify step's end depends on the acceptance: it saves no snapshot (generated text only)
            if self.caching and c.hybrid and end % bs == 0 and not m:
                # a block ending in a token still on the GPU (async scheduling) gets its key when that comes
                key = (seq.compute_hashes(end // bs, bs)[end // bs - 1] if end <= seq.num_resolved
                       else UnknownKey(seq, end))
                # prompt chunks may evict older snapshots; a decode step only fills a free slot, so
                # generated text never pushes out the prompt prefixes (system prompts) other requests hit
                slot = self.states.reserve(key, evict=num_new > 1)
                if slot is not None:
                    out.state_saves.append((seq.state_slot, slot))
                    out.snapshot_keys.append(key)
        return out

    # ------------------------------------------------------------------ after the step
    def update(self, out: SchedulerOutput, sampled: list[int],
               accepted: dict[int, list[int]] | None = None) -> list[tuple[Sequence, int, int]]:
        """Advance the sequences of ``out`` after the runner ran it. ``sampled`` holds one token per
        sample row (rows in ``out.scheduled`` order; a forking leader's rows are leader, child 1, ...);
        ``accepted[row]``, for a verify step's row, its accepted drafts then the bonus token.
        Returns (sequence, new token, row) for every new token, children included, in order."""
        events: list[tuple[Sequence, int, int]] = []
        row = 0
        for item in out.scheduled:
            seq = item.seq
            if seq.is_finished:   # ended (stop, abort) while this step ran: async scheduling learns it late
                row += item.num_samples if not item.num_drafts else 1
                continue
            if item.num_drafts:
                for token in commit_verify(seq, item.start, item.num_drafts, accepted[row]):
                    events.append((seq, token, row))
                self.blocks.register_full_blocks(seq)
                row += 1
                continue
            seq.num_computed = item.end
            self.blocks.register_full_blocks(seq)
            if not item.num_samples:
                continue
            seq.append_token(sampled[row])
            events.append((seq, sampled[row], row))
            for i, (seed, params) in enumerate(seq.forks, start=1):
                events.append((self._fork(seq, i, seed, params, sampled[row + i]), sampled[row + i], row + i))
            seq.forks = []
            row += item.num_samples
        commit_snapshots(self, out)
        return events

    def _fork(self, parent: Sequence, index: int, seed: int, params, token: int) -> Sequence:
        """Completion ``index`` of ``parent``'s request: its prompt and first token ``token``. It shares
        the parent's prompt blocks and copies its state when a slot and a block are free; otherwise it
        waits and recomputes (mostly from the prefix cache)."""
        child = Sequence(seq_id=next(self._ids), request_id=parent.request_id, index=index,
                         token_ids=parent.token_ids[:parent.num_prompt_tokens] + [int(token)],
                         num_prompt_tokens=parent.num_prompt_tokens, max_total_tokens=parent.max_total_tokens,
                         arrival=parent.arrival, params=params, seed=seed, admitted=True,
                         num_cached_tokens=parent.num_cached_tokens)
        self.requests[parent.request_id].append(child)
        child.can_draft = parent.can_draft
        partial = parent.num_computed % self.block_size != 0
        if (len(self.running) < self.config.max_num_seqs and self.states.num_free_live
                and self.blocks.num_available >= int(partial)):
            copy = self.blocks.fork(parent, child)
            child.num_computed = parent.num_computed
            child.state_slot = self.states.allocate_live()
            if copy is not None:
                self._fork_copies.append((child, 0, "block", *copy))
            self._fork_copies.append((child, 0, "state", parent.state_slot, child.state_slot))
            child.status = SeqStatus.RUNNING
            bisect.insort(self.running, child, key=lambda s: s.sort_key)
        else:
            bisect.insort(self.waiting, child, key=lambda s: s.sort_key)
        return child

    # ------------------------------------------------------------------ introspection
    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting), kv_cache_usage=self.blocks.usage,
            num_blocks=self.blocks.num_blocks, num_free_blocks=self.blocks.num_available,
            num_cached_blocks=len(self.blocks.cached), num_evictable_blocks=len(self.blocks.evictable),
            prefix_cache_queries=self.prefix_queries,
            prefix_cache_hits=self.prefix_hits, num_preemptions=self.num_preemptions,
            num_state_snapshots=len(self.states.snapshots))

    def check_integrity(self) -> None:
        """AssertionError unless blocks, slots and queues are consistent (used by the tests)."""
        for seq in self.waiting:
            assert seq.status is SeqStatus.WAITING and not seq.block_table and seq.state_slot is None, seq
        for seq in self.running:
            assert seq.status is SeqStatus.RUNNING and seq.state_slot is not None, seq
            assert len(seq.block_table) * self.block_size >= seq.num_computed, seq
        bs = self.block_size
        for seq in self.running + self.waiting:   # keys are of the real tokens (async scheduling's placeholders)
            assert len(seq.block_hashes) * bs <= seq.num_resolved, seq
            parent = None
            for i, key in enumerate(seq.block_hashes):
                parent = hash_block(parent, tuple(seq.token_ids[i * bs:(i + 1) * bs]))
                assert key == parent, (seq, i)
        assert not set(map(id, self.waiting)) & set(map(id, self.running)), "a sequence is waiting and running"
        assert self.waiting == sorted(self.waiting, key=lambda s: s.sort_key), "waiting queue out of FCFS order"
        assert self.running == sorted(self.running, key=lambda s: s.sort_key), "running list out of order"
        assert len(self.running) <= self.config.max_num_seqs
        self.blocks.check_integrity(self.running)
        self.states.check_integrity(slot for s in self.running for slot in [s.state_slot, *s.spare_slots])
