"""Drafters: what proposes a verify step's draft tokens.

:class:`MTPDrafter` drives the checkpoint's MTP head. The MTP layer at position t reads the target's final
hidden state at t and the token at t+1 and predicts the token at t+2 (its KV lives in the MTP layer's own paged
cache, at the slot of position t, under the sequence's block table). A step's target hidden rows are kept
until the sequence's next step, when the token after the last of them (the one just sampled) is known:
1. catch-up: one MTP pass over every position the previous step committed (a prompt chunk, or the accepted
   drafts and the pending token), which fills the MTP KV there; its last row gives draft 1;
2. drafts 2..m: one MTP pass per draft over one position each, the previous pass's output as the hidden state
   (vLLM's scheme for MTP), at the positions the coming verify forward will recompute with the target's own
   hidden states. Their KV slots are inside the blocks the scheduler allocated for the verify step.
A sequence asked to verify drafts without kept rows (its first step after a fork or a preemption) gets
filler drafts: any token is safe, the verify step accepts only what the target itself would produce.

The test hooks (:class:`ScriptedDrafter`) propose from known outputs: always right, or never.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..models.batch import BatchMetadata
from ..scheduler import SchedulerOutput


class Drafter:
    """Interface: ``propose`` fills ``draft_tokens`` of every scheduled item with ``num_drafts``; ``record``
    sees the step's target hidden states and what was accepted (row -> tokens)."""

    def propose(self, out: SchedulerOutput, caches) -> None:
        raise NotImplementedError

    def record(self, out: SchedulerOutput, hidden: torch.Tensor, accepted: dict[int, list[int]]) -> None:
        pass


@dataclass
class _Kept:
    start: int             # position of the first kept row
    hidden: torch.Tensor   # [n, H] target final-norm hidden states of positions start .. start+n-1

    @property
    def end(self) -> int:
        return self.start + self.hidden.shape[0]


class MTPDrafter(Drafter):
    def __init__(self, model, device):
        self.model, self.device = model, torch.device(device)
        self.kept: dict[int, _Kept] = {}    # seq_id -> rows of its last step (only sequences that may draft)
        self.num_passes = 0                 # MTP forwards run (tests, stats)

    def _batch(self, q_lens, seq_lens, tables, block_size):
        batch = BatchMetadata.build(q_lens, seq_lens, tables, block_size, [0] * len(q_lens), self.device)
        return batch, BatchMetadata.positions(q_lens, seq_lens, self.device)

    def _greedy(self, h: torch.Tensor) -> torch.Tensor:
        """[n] int64 argmax tokens, left on the device: the next pass reads them there, and the host sees all the
        drafts of the step in one copy (one sync per step, not one per pass)."""
        return self.model.compute_logits(h).argmax(-1)

    def propose(self, out: SchedulerOutput, caches) -> None:
        kept, self.kept = self.kept, {}
        bs = caches.block_size
        drafting = [it for it in out.scheduled if it.num_drafts]
        for it in drafting:
            it.draft_tokens = []
        drafts: dict[int, list[torch.Tensor]] = {}       # seq_id -> its drafts so far (0-d device tensors)
        last: dict[int, tuple[torch.Tensor, int]] = {}   # seq_id -> (MTP hidden of its last pass, position)
        # 1. catch-up over the rows each sequence's previous step committed
        items = [(it, k) for it in out.scheduled if (k := kept.get(it.seq.seq_id)) is not None and k.end == it.start]
        if items:
            ids = [t for it, k in items for t in it.seq.token_ids[k.start + 1:k.end + 1]]
            batch, pos = self._batch([k.hidden.shape[0] for _, k in items], [k.end for _, k in items],
                                     [it.seq.block_table for it, _ in items], bs)
            h = self.model.mtp_forward(torch.tensor(ids, dtype=torch.int64, device=self.device), pos,
                                       torch.cat([k.hidden for _, k in items]), batch, caches)
            self.num_passes += 1
            ends = list(itertools.accumulate(k.hidden.shape[0] for _, k in items))   # host-side: no sync
            want = [(it, ends[i] - 1) for i, (it, _) in enumerate(items) if it.num_drafts]
            if want:
                rows = h.index_select(0, torch.tensor([r for _, r in want], device=h.device))
                for (it, _), row, tok in zip(want, rows, self._greedy(rows)):
                    drafts[it.seq.seq_id] = [tok]
                    last[it.seq.seq_id] = (row, it.start)
        # 2. one pass per further draft
        for j in range(2, max((it.num_drafts for it in drafting), default=0) + 1):
            step = [it for it in drafting if it.num_drafts >= j and it.seq.seq_id in last]
            if not step:
                break
            positions = [last[it.seq.seq_id][1] for it in step]
            batch, pos = self._batch([1] * len(step), [p + 1 for p in positions], [it.seq.block_table for it in step],
                                     bs)
            ids = torch.stack([drafts[it.seq.seq_id][-1] for it in step])
            h = self.model.mtp_forward(ids, pos, torch.stack([last[it.seq.seq_id][0] for it in step]), batch, caches)
            self.num_passes += 1
            for it, row, tok, p in zip(step, h, self._greedy(h), positions):
                drafts[it.seq.seq_id].append(tok)
                last[it.seq.seq_id] = (row, p + 1)
        have = [it for it in drafting if it.seq.seq_id in drafts]
        if have:
            flat = torch.stack([t for it in have for t in drafts[it.seq.seq_id]]).tolist()
            for it in have:
                n = len(drafts[it.seq.seq_id])
                it.draft_tokens, flat = flat[:n], flat[n:]
        for it in drafting:   # no kept rows (after a fork or preemption): filler, verified like any draft
            it.draft_tokens.extend([it.seq.token_ids[-1]] * (it.num_drafts - len(it.draft_tokens)))

    def record(self, out: SchedulerOutput, hidden: torch.Tensor, accepted: dict[int, list[int]]) -> None:
        offset = row = 0
        spans = []
        for it in out.scheduled:
            n = len(accepted[row]) if it.num_drafts else it.num_new   # committed positions of this step
            if it.seq.can_draft:
                spans.append((it.seq.seq_id, it.start, offset, n))
            offset += it.num_new
            row += it.num_samples
        if not spans:
            return
        # a copy: on the CUDA graph path ``hidden`` is the graph's static output, overwritten by the next replay
        index = torch.cat([torch.arange(o, o + n) for _, _, o, n in spans]).to(hidden.device)
        rows = hidden.index_select(0, index)
        first = 0
        for seq_id, start, _, n in spans:
            self.kept[seq_id] = _Kept(start, rows[first:first + n])
            first += n


class ScriptedDrafter(Drafter):
    """Test hook: drafts from the known outputs ``expected[(prompt token ids, completion index)]`` of a run
    without speculation: the first ``correct`` drafts of every round are those tokens, the rest differ from
    them (None: all right, an oracle; 0: never accepted)."""

    def __init__(self, expected: dict[tuple[tuple[int, ...], int], list[int]], vocab_size: int,
                 correct: int | None = None):
        self.expected, self.vocab_size, self.correct = expected, vocab_size, correct

    def propose(self, out: SchedulerOutput, caches) -> None:
        for it in out.scheduled:
            if not it.num_drafts:
                continue
            seq = it.seq
            ref = self.expected.get((tuple(seq.prompt_token_ids), seq.index), [])
            # the drafts follow the pending token, the last output token: output token o onwards
            o = seq.num_output_tokens
            tokens = [ref[o + i] if o + i < len(ref) else 0 for i in range(it.num_drafts)]
            right = len(tokens) if self.correct is None else self.correct
            it.draft_tokens = [t if i < right else (t + 1) % self.vocab_size for i, t in enumerate(tokens)]
