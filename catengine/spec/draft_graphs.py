"""CUDA graphs for the MTP draft passes of a steady-state step: every scheduled sequence drafts k tokens and
its previous step left it at most k+1 committed rows (a uniform verify step, or the decode step before it). One
graph per padded batch size B runs all k passes and the greedy argmax on the device, static buffers in,
[B, k] draft ids out, so a drafting step is one replay and one host copy instead of k eager MTP forwards, each
with its own full-vocabulary lm_head and launches.

Layout of the catch-up pass (pass 1): every sequence gets q = k+1 query rows; its n <= q committed rows come
first, the rest are padding rows that write no KV (slot -1), attend only to keys at or before their own position
(causal, inside the sequence's blocks) and whose outputs are dropped: the real rows never see them, so the real
rows compute what the eager packed pass computes. ``last_rows`` picks each sequence's last real row, whose
argmax is draft 1. Passes 2..k run one row per sequence at host-computed positions and slots. Padding sequences
write no KV either (slot -1) and attend to one key of block 0, as in decode graphs.

``capture=False`` runs the same padded buffers eagerly: the CPU tests check the layout that way.
"""
from __future__ import annotations

import torch

from ..cuda_graphs import DecodeGraphs
from ..models.batch import BatchMetadata


class DraftGraphs(DecodeGraphs):
    kind = "MTP draft"

    def __init__(self, model, caches, *, batch_sizes, num_drafts: int, greedy, hidden_size: int, dtype,
                 max_model_len: int, pad_state_slot: int, device, capture: bool = True):
        """``greedy`` maps MTP hidden rows [n, H] to draft ids [n] int64 on the device (the drafter's lm_head,
        full or reduced vocabulary)."""
        self.num_drafts = k = num_drafts
        self.query_len = q = k + 1
        self.greedy = greedy
        super().__init__(model, caches, batch_sizes=batch_sizes, max_model_len=max_model_len,
                         pad_state_slot=pad_state_slot, device=device, capture=capture)
        n, z = self.max_batch, dict(device=self.device)
        # pass 1 (catch-up): q rows per sequence
        self.cu_ids = torch.zeros(n * q, dtype=torch.int64, **z)
        self.cu_pos = torch.zeros(n * q, dtype=torch.int64, **z)
        self.cu_hidden = torch.zeros(n * q, hidden_size, dtype=dtype, **z)
        self.cu_slots = torch.full((n * q,), -1, dtype=torch.int64, **z)
        self.cu_qsl = torch.arange(n + 1, dtype=torch.int32, **z) * q
        self.cu_seq_lens = torch.full((n,), q, dtype=torch.int32, **z)
        self.last_rows = torch.arange(n, dtype=torch.int64, **z) * q
        # passes 2..k: one row per sequence (row j - 2 of these)
        self.p_pos = torch.zeros(max(k - 1, 1), n, dtype=torch.int64, **z)
        self.p_seq_lens = torch.ones(max(k - 1, 1), n, dtype=torch.int32, **z)
        self.p_slots = torch.full((max(k - 1, 1), n), -1, dtype=torch.int64, **z)

    def can_run(self, num_seqs: int, block_table_width: int, max_seq_len: int) -> bool:
        return (num_seqs <= self.max_batch and max_seq_len <= self.max_model_len
                and block_table_width <= self.block_tables.shape[1])

    def _meta(self, size, qsl, seq_lens, slots, max_query_len, decode_only) -> BatchMetadata:
        # state_slots / has_initial_state are unused by the MTP layer (full attention), but part of the batch
        return BatchMetadata(query_start_loc=qsl, seq_lens=seq_lens, block_tables=self.block_tables[:size],
                             slot_mapping=slots, state_slots=self.state_slots[:size],
                             has_initial_state=self.has_initial_state[:size], max_query_len=max_query_len,
                             max_seq_len=self.max_model_len, decode_only=decode_only)

    def _forward(self, size: int) -> torch.Tensor:
        q, mtp = self.query_len, self.model.mtp_forward
        batch = self._meta(size, self.cu_qsl[: size + 1], self.cu_seq_lens[:size], self.cu_slots[: size * q], q, False)
        h = mtp(self.cu_ids[: size * q], self.cu_pos[: size * q], self.cu_hidden[: size * q], batch, self.caches)
        h = h.index_select(0, self.last_rows[:size])
        tok = self.greedy(h)
        drafts = [tok]
        for j in range(self.num_drafts - 1):
            batch = self._meta(size, self.query_start_loc[: size + 1], self.p_seq_lens[j, :size],
                               self.p_slots[j, :size], 1, True)
            h = mtp(tok, self.p_pos[j, :size], h, batch, self.caches)
            tok = self.greedy(h)
            drafts.append(tok)
        return torch.stack(drafts, dim=1)

    @torch.inference_mode()
    def run(self, steps, block_tables: torch.Tensor, kept_rows: torch.Tensor) -> torch.Tensor:
        """Drafts [b, k] (device, int64) of the b sequences ``steps``: (first kept position, first row in
        ``kept_rows``, the n committed token ids after the kept positions, verify start, block table), with
        ``block_tables`` [b, width] int32 on the host."""
        q, k, bs = self.query_len, self.num_drafts, self.caches.block_size
        b = len(steps)
        size = self.padded_size(b)
        ids, pos, slots, src = [0] * (size * q), [0] * (size * q), [-1] * (size * q), [0] * (size * q)
        seq_lens, last = [q] * size, [i * q for i in range(size)]
        p_pos, p_lens, p_slots = [[0] * size for _ in range(k - 1)], [[1] * size for _ in range(k - 1)], \
            [[-1] * size for _ in range(k - 1)]
        for i, (kstart, first, tokens, start, table) in enumerate(steps):
            n, r = len(tokens), i * q
            ids[r:r + n] = tokens
            pos[r:r + q] = range(kstart, kstart + q)
            slots[r:r + n] = [table[p // bs] * bs + p % bs for p in range(kstart, kstart + n)]
            src[r:r + n] = range(first, first + n)
            seq_lens[i], last[i] = kstart + q, r + n - 1
            for j in range(k - 1):   # pass j + 2 reads draft j + 1 at position start + j
                p = start + j
                p_pos[j][i], p_lens[j][i], p_slots[j][i] = p, p + 1, table[p // bs] * bs + p % bs
        nb = dict(non_blocking=True)
        self.cu_ids[: size * q].copy_(torch.tensor(ids, dtype=torch.int64), **nb)
        self.cu_pos[: size * q].copy_(torch.tensor(pos, dtype=torch.int64), **nb)
        self.cu_slots[: size * q].copy_(torch.tensor(slots, dtype=torch.int64), **nb)
        self.cu_seq_lens[:size].copy_(torch.tensor(seq_lens, dtype=torch.int32), **nb)
        self.last_rows[:size].copy_(torch.tensor(last, dtype=torch.int64), **nb)
        if k > 1:
            self.p_pos[:, :size].copy_(torch.tensor(p_pos, dtype=torch.int64), **nb)
            self.p_seq_lens[:, :size].copy_(torch.tensor(p_lens, dtype=torch.int32), **nb)
            self.p_slots[:, :size].copy_(torch.tensor(p_slots, dtype=torch.int64), **nb)
        self.block_tables[:b, : block_tables.shape[1]].copy_(block_tables, **nb)
        torch.index_select(kept_rows, 0, torch.tensor(src, dtype=torch.int64).to(self.device, **nb),
                           out=self.cu_hidden[: size * q])
        self.num_runs += 1
        if not self.capture:
            return self._forward(size)[:b]
        graph, out = self._graphs[size]
        graph.replay()
        return out[:b]


def build_draft_graphs(runner, drafter, capture: bool = True, num_drafts: int | None = None) -> DraftGraphs | None:
    """Capture ``drafter``'s draft-pass graphs for ``runner`` (the verify graphs' batch sizes, k drafts or
    ``num_drafts``); None when nothing is to capture or the capture failed (logged: drafting then runs eagerly)."""
    import logging

    from ..cuda_graphs import capture_sizes
    cfg, plan, model = runner.config, runner.memory_plan, runner.model
    sizes = capture_sizes(cfg.cuda_graph_sizes, min(cfg.max_num_seqs, cfg.speculative_disable_by_batch_size))
    if not sizes:
        return None
    graphs = DraftGraphs(model, runner.caches, batch_sizes=sizes, num_drafts=num_drafts or cfg.num_speculative_tokens,
                         greedy=drafter.greedy, hidden_size=model.config.hidden_size, dtype=model.dtype,
                         max_model_len=plan.max_model_len, pad_state_slot=plan.pad_state_slot, device=runner.device,
                         capture=capture)
    try:
        graphs.capture_all()
    except Exception:   # drafting eagerly beats not serving; the log says why it is slower
        logging.getLogger("catengine").exception("MTP draft CUDA graph capture failed; draft passes run eagerly")
        return None
    return graphs
