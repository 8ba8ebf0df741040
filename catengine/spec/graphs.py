"""CUDA graphs for verify steps: every sequence of the step verifies the same number of drafts (q = k+1 new
tokens each, the steady state of speculative decoding), padded to a captured batch size as decode is
(:mod:`catengine.cuda_graphs`). Other verify steps (fewer drafts near max_tokens, a prompt chunk in the step)
run eagerly. The runner hands a covered step's items straight to :meth:`VerifyGraphs.run_items`, which fills
two packed input buffers per graph (two host-to-device copies and the block tables) instead of the runner's
generic host_batch and one copy per field.

Padding sequences write no KV (slot -1), start their GDN state from zeros and write it, and every per-token
state and conv window, to the padding state slot; the saved-entry list (BatchMetadata.intermediate_targets) is
padded to B * q entries the same way, so its length is static.
"""
from __future__ import annotations

import torch

from ..cuda_graphs import DecodeGraphs, build_graphs
from ..models.batch import BatchMetadata


class VerifyGraphs(DecodeGraphs):
    kind = "verify"

    def __init__(self, model, caches, *, batch_sizes, query_len: int, max_model_len: int, pad_state_slot: int,
                 device, capture: bool = True):
        self.query_len = q = query_len
        super().__init__(model, caches, batch_sizes=batch_sizes, max_model_len=max_model_len,
                         pad_state_slot=pad_state_slot, device=device, capture=capture)
        # per captured size s, two packed buffers the host fills in one copy each (a verify step's inputs are
        # rebuilt from the scheduled items, without the runner's host_batch):
        # int64 [ids | positions | slot_mapping | saved-state slots], s * q each; int32 [seq_lens | state_slots
        # | intermediate slots (s x q)]. The saved-entry rows are every b * q + j (all entries saved: padding
        # entries to the padding slot), a constant.
        z = dict(device=self.device)
        self._i64 = {s: torch.zeros(4 * s * q, dtype=torch.int64, **z) for s in self.batch_sizes}
        self._i32 = {s: torch.zeros(s * (2 + q), dtype=torch.int32, **z) for s in self.batch_sizes}
        self.target_rows = torch.arange(self.max_batch * q, dtype=torch.int64, **z)
        for size in self.batch_sizes:   # all padding: the capture's warm-up run writes no KV and no live state
            self._load(size, *self._host(size, [], None)[:2])

    def covers(self, items) -> bool:
        """Whether a step of these scheduled items is a uniform verify step a captured graph covers: every
        sequence verifies q - 1 drafts."""
        q = self.query_len
        return (0 < len(items) <= self.max_batch
                and all(it.num_drafts + 1 == q and it.num_new == q for it in items)
                and max(it.start for it in items) + q <= self.max_model_len
                and max(len(it.seq.block_table) for it in items) <= self.block_tables.shape[1])

    def _batch(self, size: int) -> BatchMetadata:
        q, i64, i32 = self.query_len, self._i64[size], self._i32[size]
        n = size * q
        seq_lens = i32[:size]
        return BatchMetadata(
            query_start_loc=self.cu_qsl(size), seq_lens=seq_lens, block_tables=self.block_tables[:size],
            slot_mapping=i64[2 * n:3 * n], state_slots=i32[size:2 * size],
            has_initial_state=seq_lens > q,   # real sequences continue a state (start > 0); padding: seq_len q
            max_query_len=q, max_seq_len=self.max_model_len, decode_only=False,
            intermediate_state_slots=i32[2 * size:].view(size, q),
            intermediate_targets=(self.target_rows[:n], i64[3 * n:]))

    def cu_qsl(self, size: int) -> torch.Tensor:
        return self.query_start_loc[: size + 1] * self.query_len

    def _forward(self, size: int) -> torch.Tensor:
        n, i64 = size * self.query_len, self._i64[size]
        return self.model(i64[:n], i64[n:2 * n], self._batch(size), self.caches)

    def _host(self, size: int, items, drafts) -> tuple[list[int], list[int], list[list[int]]]:
        """The packed int64 and int32 contents of graph ``size`` for ``items`` (padding rows after them) and
        their block tables."""
        q, k, bs, slot = self.query_len, self.query_len - 1, self.caches.block_size, self.pad_state_slot
        ids, pos, slots, saved = [], [], [], []
        seq_lens, states, tables = [], [], []
        for it in items:
            seq, st = it.seq, it.start
            table = seq.block_table
            ids.append(seq.token_ids[st])
            ids.extend(it.draft_tokens if drafts is None else [0] * k)
            pos.extend(range(st, st + q))
            slots.extend([table[p // bs] * bs + p % bs for p in range(st, st + q)])
            # tokens 0..k-1 save their state to the spare slots, the last draft's goes to the live slot
            saved.extend(seq.spare_slots[:k])
            saved.append(seq.state_slot)
            seq_lens.append(st + q)
            states.append(seq.state_slot)
            tables.append(table)
        # padding sequences: no KV written (slot -1), positions 0..q-1 under seq_len q, every state to the
        # padding slot
        pad = size - len(items)
        pad_t = pad * q
        i64 = ids + [0] * pad_t + pos + list(range(q)) * pad + slots + [-1] * pad_t + saved + [slot] * pad_t
        i32 = seq_lens + [q] * pad + states + [slot] * pad + saved + [slot] * pad_t
        return i64, i32, tables

    def _load(self, size: int, i64: list[int], i32: list[int]) -> None:
        nb = dict(non_blocking=True)
        self._i64[size].copy_(torch.tensor(i64, dtype=torch.int64), **nb)
        self._i32[size].copy_(torch.tensor(i32, dtype=torch.int32), **nb)

    def pack(self, items, drafts: torch.Tensor | None = None):
        """The host inputs of a uniform verify step (:meth:`covers`): (graph size, sequences, packed int64,
        packed int32, block tables [b, width]). Plain host data: at TP > 1 it is what every rank is sent."""
        b = len(items)
        size = self.padded_size(b)
        i64, i32, tables = self._host(size, items, drafts)
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        return size, b, i64, i32, table

    @torch.inference_mode()
    def run_packed(self, size: int, b: int, i64: list[int], i32: list[int], table: torch.Tensor,
                   drafts: torch.Tensor | None = None) -> torch.Tensor:
        q = self.query_len
        self._load(size, i64, i32)
        if drafts is not None:
            self._i64[size][: b * q].view(b, q)[:, 1:].copy_(drafts)
        self.block_tables[:b, : table.shape[1]].copy_(table, non_blocking=True)
        return self._replay(size, b * q)

    def run_items(self, items, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [b * q, H] of a uniform verify step (:meth:`covers`), its inputs built here from the
        items: token rows b * q + j are sequence b's pending token (j = 0) and drafts, the items' draft_tokens
        or ``drafts`` [b, q - 1] on the device (copied in there, no host round trip)."""
        return self.run_packed(*self.pack(items, drafts), drafts)

def build_verify_graphs(runner, capture: bool = True, num_drafts: int | None = None) -> VerifyGraphs | None:
    """Capture the verify graphs of ``runner`` (batch sizes up to the drafting limit, q = k+1, or
    ``num_drafts`` + 1); None when nothing is to capture or the capture failed (logged: verify steps then run
    eagerly)."""
    from ..cuda_graphs import capture_sizes, captured
    cfg, plan = runner.config, runner.memory_plan
    limit = min(cfg.max_num_seqs, cfg.speculative_disable_by_batch_size)
    sizes = capture_sizes(cfg.cuda_graph_sizes, limit)
    if not sizes or runner.drafter is None:
        return None
    graphs = build_graphs(VerifyGraphs, runner.model, runner.caches, batch_sizes=sizes,
                          query_len=(num_drafts or cfg.num_speculative_tokens) + 1, max_model_len=plan.max_model_len,
                          pad_state_slot=plan.pad_state_slot, device=runner.device, capture=capture)
    return captured(graphs, "verify steps")
