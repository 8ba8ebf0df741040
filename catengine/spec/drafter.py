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
In the steady state (every sequence drafts k and its previous step committed at most k+1 rows) the passes
replay one CUDA graph (:mod:`.draft_graphs`) instead; other steps run them eagerly as above.

The test hooks (:class:`ScriptedDrafter`) propose from known outputs: always right, or never.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import ops
from ..models.batch import BatchMetadata
from ..scheduler import SchedulerOutput


class Drafter:
    """Interface: ``propose`` fills ``draft_tokens`` of every scheduled item with ``num_drafts``; ``record``
    sees the step's target hidden states and what was accepted (row -> tokens)."""

    def propose(self, out: SchedulerOutput, caches) -> None:
        raise NotImplementedError

    def record(self, out: SchedulerOutput, hidden: torch.Tensor, accepted: dict[int, list[int]]) -> None:
        pass

    def take_device_drafts(self) -> torch.Tensor | None:
        """Drafts [b, k] that ``propose`` left on the device for the b scheduled items (their draft_tokens are
        then unset until :func:`fill_drafts`), or None when every item's draft_tokens are filled. Taken once."""
        return None


def fill_drafts(items, drafts: torch.Tensor | list) -> None:
    """Set the items' draft_tokens from device drafts (one host copy) or their host lists."""
    for it, d in zip(items, drafts.tolist() if isinstance(drafts, torch.Tensor) else drafts):
        it.draft_tokens = d


@dataclass
class _Kept:
    start: int   # position of the first kept row
    first: int   # its row in the drafter's ``rows``
    n: int       # rows kept: positions start .. start+n-1

    @property
    def end(self) -> int:
        return self.start + self.n


class MTPDrafter(Drafter):
    def __init__(self, model, device, draft_vocab: torch.Tensor | None = None):
        """``draft_vocab``: sorted token ids the draft lm_head scores (:mod:`.vocab`); None: all of them."""
        self.model, self.device = model, torch.device(device)
        self.kept: dict[int, _Kept] = {}      # seq_id -> rows of its last step (only sequences that may draft)
        self.rows: torch.Tensor | None = None  # [n, H] every kept row of the last step, one copy
        self.num_passes = 0                   # MTP forwards run (tests, stats)
        self.graphs = None                    # DraftGraphs of steady-state steps (the runner captures them)
        self.device_drafts: torch.Tensor | None = None   # the graph path's drafts, until the runner takes them
        self.draft_ids = self.draft_head = None
        if draft_vocab is not None:
            # the lm_head rows of the subset, gathered once (int8 weights and their scales when quantized)
            self.draft_ids = draft_vocab.to(self.device)
            if model.lm_head_int8 is not None:
                q, s = model.lm_head_int8
                self.draft_head = (q.index_select(0, self.draft_ids).contiguous(),
                                   s.index_select(0, self.draft_ids).contiguous())
            else:
                self.draft_head = model.lm_head.index_select(0, self.draft_ids).contiguous()

    def _batch(self, q_lens, seq_lens, tables, block_size):
        batch = BatchMetadata.build(q_lens, seq_lens, tables, block_size, [0] * len(q_lens), self.device)
        return batch, BatchMetadata.positions(q_lens, seq_lens, self.device)

    def greedy(self, h: torch.Tensor) -> torch.Tensor:
        """[n] int64 argmax tokens, left on the device: the next pass reads them there, and the host sees all the
        drafts of the step in one copy (one sync per step, not one per pass)."""
        if self.draft_ids is None:
            return self.model.compute_logits(h).argmax(-1)
        if isinstance(self.draft_head, tuple):
            logits = ops.w8a16_linear(h, *self.draft_head)
        else:
            logits = F.linear(h, self.draft_head)
        return self.draft_ids[logits.argmax(-1)]

    def _graph_steps(self, out: SchedulerOutput, kept: dict[int, _Kept]):
        """(steps, block tables) for :meth:`DraftGraphs.run` when this step is the steady state it covers:
        every sequence drafts k and continues from at most k+1 kept rows; else None."""
        g = self.graphs
        if g is None or len(out.scheduled) > g.max_batch:
            return None
        steps, tables = [], []
        for it in out.scheduled:
            kp = kept.get(it.seq.seq_id)
            if it.num_drafts != g.num_drafts or kp is None or kp.end != it.start or kp.n > g.query_len:
                return None
            steps.append((kp.start, kp.first, it.seq.token_ids[kp.start + 1:kp.end + 1], it.start, it.seq.block_table))
            tables.append(it.seq.block_table)
        width = max(len(t) for t in tables)
        if not g.can_run(len(steps), width, max(it.start for it in out.scheduled) + g.num_drafts):
            return None
        return steps, torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)

    def propose(self, out: SchedulerOutput, caches) -> None:
        kept, self.kept = self.kept, {}
        rows, self.rows = self.rows, None
        graph = self._graph_steps(out, kept) if rows is not None else None
        if graph is not None:
            # one replay; the drafts stay on the device: the verify graph reads them there and the acceptance
            # copies them to the host with the target's tokens, so the host never waits for the drafting alone
            self.device_drafts = self.graphs.run(*graph, rows)
            self.num_passes += self.graphs.num_drafts
            return
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
            batch, pos = self._batch([k.n for _, k in items], [k.end for _, k in items],
                                     [it.seq.block_table for it, _ in items], bs)
            src = torch.tensor([r for _, k in items for r in range(k.first, k.first + k.n)], device=self.device)
            h = self.model.mtp_forward(torch.tensor(ids, dtype=torch.int64, device=self.device), pos,
                                       rows.index_select(0, src), batch, caches)
            self.num_passes += 1
            ends = list(itertools.accumulate(k.n for _, k in items))   # host-side: no sync
            want = [(it, ends[i] - 1) for i, (it, _) in enumerate(items) if it.num_drafts]
            if want:
                last_rows = h.index_select(0, torch.tensor([r for _, r in want], device=h.device))
                for (it, _), row, tok in zip(want, last_rows, self.greedy(last_rows)):
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
            for it, row, tok, p in zip(step, h, self.greedy(h), positions):
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

    def take_device_drafts(self) -> torch.Tensor | None:
        drafts, self.device_drafts = self.device_drafts, None
        return drafts

    def record(self, out: SchedulerOutput, hidden: torch.Tensor, accepted: dict[int, list[int]]) -> None:
        offset = row = 0
        index: list[int] = []
        for it in out.scheduled:
            n = len(accepted[row]) if it.num_drafts else it.num_new   # committed positions of this step
            if it.seq.can_draft:
                self.kept[it.seq.seq_id] = _Kept(it.start, len(index), n)
                index.extend(range(offset, offset + n))
            offset += it.num_new
            row += it.num_samples
        if index:
            # a copy: on the CUDA graph path ``hidden`` is the graph's static output, overwritten by the next replay
            self.rows = hidden.index_select(0, torch.tensor(index, dtype=torch.int64).to(hidden.device))


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
