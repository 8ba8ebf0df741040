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
        z = dict(device=self.device)
        # per captured size s, every int64 input in one packed buffer the host fills in one copy:
        # [catch-up ids | positions | slots | kept-row index] (s * q each), last real row (s),
        # [positions | slots] of passes 2..k ((k - 1) * s each); the seq_lens are derived in the graph
        self._i64 = {s: torch.zeros(4 * s * q + s + 2 * (k - 1) * s, dtype=torch.int64, **z) for s in self.batch_sizes}
        self.cu_hidden = torch.zeros(self.max_batch * q, hidden_size, dtype=dtype, **z)
        self._views = {s: self._fields(s) for s in self.batch_sizes}
        for size in self.batch_sizes:   # all padding: the capture's warm-up run writes no KV
            self._i64[size].copy_(torch.tensor(self._host(size, []), dtype=torch.int64))

    def _fields(self, size: int):
        q, k, buf = self.query_len, self.num_drafts, self._i64[size]
        n, m = size * q, (k - 1) * size
        cu_ids, cu_pos, cu_slots, src = (buf[i * n:(i + 1) * n] for i in range(4))
        last = buf[4 * n:4 * n + size]
        p_pos = buf[4 * n + size:4 * n + size + m].view(k - 1, size)
        p_slots = buf[4 * n + size + m:].view(k - 1, size)
        return cu_ids, cu_pos, cu_slots, src, last, p_pos, p_slots

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
        cu_ids, cu_pos, cu_slots, _, last, p_pos, p_slots = self._views[size]
        seq_lens = (cu_pos.view(size, q)[:, 0] + q).to(torch.int32)   # kstart + q (padding: positions 0..q-1)
        batch = self._meta(size, self.query_start_loc[: size + 1] * q, seq_lens, cu_slots, q, False)
        h = mtp(cu_ids, cu_pos, self.cu_hidden[: size * q], batch, self.caches)
        h = h.index_select(0, last)
        tok = self.greedy(h)
        drafts = [tok]
        for j in range(self.num_drafts - 1):
            batch = self._meta(size, self.query_start_loc[: size + 1], (p_pos[j] + 1).to(torch.int32), p_slots[j],
                               1, True)
            h = mtp(tok, p_pos[j], h, batch, self.caches)
            tok = self.greedy(h)
            drafts.append(tok)
        return torch.stack(drafts, dim=1)

    def _host(self, size: int, steps) -> list[int]:
        """The packed int64 contents of graph ``size`` for ``steps`` (see :meth:`run`), padding after them."""
        q, k, bs = self.query_len, self.num_drafts, self.caches.block_size
        b = len(steps)
        ids, pos, slots, src, last = [], [], [], [], []
        p_pos, p_slots = [[] for _ in range(k - 1)], [[] for _ in range(k - 1)]
        for i, (kstart, first, tokens, start, table) in enumerate(steps):
            n, pad = len(tokens), q - len(tokens)
            ids += tokens + [0] * pad
            pos.extend(range(kstart, kstart + q))
            slots += [table[p // bs] * bs + p % bs for p in range(kstart, kstart + n)] + [-1] * pad
            src += list(range(first, first + n)) + [first] * pad
            last.append(i * q + n - 1)
            for j in range(k - 1):   # pass j + 2 reads draft j + 1 at position start + j
                p = start + j
                p_pos[j].append(p)
                p_slots[j].append(table[p // bs] * bs + p % bs)
        # padding sequences: no KV written (slot -1), catch-up positions 0..q-1 (seq_len q), passes at 0
        pad, pad_t = size - b, (size - b) * q
        flat = (ids + [0] * pad_t + pos + list(range(q)) * pad + slots + [-1] * pad_t + src + [0] * pad_t
                + last + [i * q for i in range(b, size)])
        for row in p_pos:
            flat += row + [0] * pad
        for row in p_slots:
            flat += row + [-1] * pad
        return flat

    @torch.inference_mode()
    def run(self, steps, block_tables: torch.Tensor, kept_rows: torch.Tensor) -> torch.Tensor:
        """Drafts [b, k] (device, int64) of the b sequences ``steps``: (first kept position, first row in
        ``kept_rows``, the n committed token ids after the kept positions, verify start, block table), with
        ``block_tables`` [b, width] int32 on the host."""
        b = len(steps)
        size = self.padded_size(b)
        flat = self._host(size, steps)
        nb = dict(non_blocking=True)
        self._i64[size].copy_(torch.tensor(flat, dtype=torch.int64), **nb)
        self.block_tables[:b, : block_tables.shape[1]].copy_(block_tables, **nb)
        torch.index_select(kept_rows, 0, self._views[size][3], out=self.cu_hidden[: size * self.query_len])
        return self._replay(size, b)


def build_draft_graphs(runner, drafter, capture: bool = True, num_drafts: int | None = None) -> DraftGraphs | None:
    """Capture ``drafter``'s draft-pass graphs for ``runner`` (the verify graphs' batch sizes, k drafts or
    ``num_drafts``); None when nothing is to capture or the capture failed (logged: drafting then runs eagerly)."""
    import logging

    from ..cuda_graphs import capture_sizes, captured
    cfg, plan, model = runner.config, runner.memory_plan, runner.model
    sizes = capture_sizes(cfg.cuda_graph_sizes, min(cfg.max_num_seqs, cfg.speculative_disable_by_batch_size))
    if not sizes:
        return None
    if hasattr(model, "build_graphs"):
        # TP > 1: a graph of rank 0's MTP passes alone would replay its all-reduces without the other ranks;
        # the draft passes run eagerly there, each announced to every rank
        logging.getLogger("catengine").info("MTP draft passes run eagerly at tensor_parallel_size > 1")
        return None
    graphs = DraftGraphs(model, runner.caches, batch_sizes=sizes, num_drafts=num_drafts or cfg.num_speculative_tokens,
                         greedy=drafter.greedy, hidden_size=model.config.hidden_size, dtype=model.dtype,
                         max_model_len=plan.max_model_len, pad_state_slot=plan.pad_state_slot, device=runner.device,
                         capture=capture)
    return captured(graphs, "MTP draft passes")
