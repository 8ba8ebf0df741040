"""CUDA graphs for verify steps: every sequence of the step verifies the same number of drafts (q = k+1 new
tokens each, the steady state of speculative decoding), padded to a captured batch size as decode is
(:mod:`catengine.cuda_graphs`). Other verify steps (fewer drafts near max_tokens, a prompt chunk in the step)
run eagerly.

Padding sequences write no KV (slot -1), start their GDN state from zeros and write it, and every per-token
state and conv window, to the padding state slot; the saved-entry list (BatchMetadata.intermediate_targets) is
padded to B * q entries the same way, so its length is static.
"""
from __future__ import annotations

import torch

from ..cuda_graphs import DecodeGraphs
from ..models.batch import BatchMetadata


class VerifyGraphs(DecodeGraphs):
    kind = "verify"

    def __init__(self, model, caches, *, batch_sizes, query_len: int, max_model_len: int, pad_state_slot: int,
                 device, capture: bool = True):
        self.query_len = q = query_len
        super().__init__(model, caches, batch_sizes=batch_sizes, max_model_len=max_model_len,
                         pad_state_slot=pad_state_slot, device=device, capture=capture)
        n, z = self.max_batch, dict(device=self.device)
        self.input_ids = torch.zeros(n * q, dtype=torch.int64, **z)
        self.positions = torch.zeros(n * q, dtype=torch.int64, **z)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, **z) * q
        self.seq_lens = torch.full((n,), q, dtype=torch.int32, **z)
        self.slot_mapping = torch.full((n * q,), -1, dtype=torch.int64, **z)
        self.inter = torch.full((n, q), pad_state_slot, dtype=torch.int32, **z)
        self.target_rows = torch.arange(n * q, dtype=torch.int64, **z)
        self.target_slots = torch.full((n * q,), pad_state_slot, dtype=torch.int64, **z)

    def can_run(self, shape, num_seqs: int, block_table_width: int, items=()) -> bool:
        return (num_seqs <= self.max_batch and shape.max_seq_len <= self.max_model_len
                and block_table_width <= self.block_tables.shape[1]
                and all(it.num_drafts + 1 == self.query_len and it.num_new == self.query_len for it in items))

    def _batch(self, size: int) -> BatchMetadata:
        q = self.query_len
        return BatchMetadata(
            query_start_loc=self.query_start_loc[: size + 1], seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size], slot_mapping=self.slot_mapping[: size * q],
            state_slots=self.state_slots[:size], has_initial_state=self.has_initial_state[:size],
            max_query_len=q, max_seq_len=self.max_model_len, decode_only=False,
            intermediate_state_slots=self.inter[:size],
            intermediate_targets=(self.target_rows[: size * q], self.target_slots[: size * q]))

    def _forward(self, size: int) -> torch.Tensor:
        q = self.query_len
        return self.model(self.input_ids[: size * q], self.positions[: size * q], self._batch(size), self.caches)

    @torch.inference_mode()
    def run(self, host: dict[str, torch.Tensor]) -> torch.Tensor:
        """Hidden states [b * q, H] of a uniform verify step from the runner's host tensors."""
        q = self.query_len
        b = host["seq_lens"].shape[0]
        size = self.padded_size(b)
        width = host["block_tables"].shape[1]
        pad, pad_t = size - b, (size - b) * q

        def padded(name: str, n: int, value) -> torch.Tensor:
            t = host[name]
            return torch.cat([t, torch.full((n,), value, dtype=t.dtype)]) if n else t

        slot = self.pad_state_slot
        self.input_ids[: size * q].copy_(padded("input_ids", pad_t, 0), non_blocking=True)
        self.positions[: size * q].copy_(padded("positions", pad_t, 0), non_blocking=True)
        self.seq_lens[:size].copy_(padded("seq_lens", pad, q), non_blocking=True)
        self.slot_mapping[: size * q].copy_(padded("slot_mapping", pad_t, -1), non_blocking=True)
        self.state_slots[:size].copy_(padded("state_slots", pad, slot), non_blocking=True)
        self.has_initial_state[:size].copy_(torch.arange(size) < b, non_blocking=True)
        self.block_tables[:b, :width].copy_(host["block_tables"], non_blocking=True)
        inter = host["intermediate_state_slots"]
        self.inter[:size].copy_(torch.cat([inter, torch.full((pad, q), slot, dtype=inter.dtype)]) if pad else inter,
                                non_blocking=True)
        rows, slots = host["intermediate_rows"], host["intermediate_row_slots"]
        extra = size * q - rows.shape[0]   # every real entry is saved (m = q-1 drafts): extra = pad_t
        self.target_rows[: size * q].copy_(torch.cat([rows, torch.zeros(extra, dtype=rows.dtype)]), non_blocking=True)
        self.target_slots[: size * q].copy_(torch.cat([slots, torch.full((extra,), slot, dtype=slots.dtype)]),
                                            non_blocking=True)
        self.num_runs += 1
        if not self.capture:
            return self._forward(size)[: b * q]
        graph, out = self._graphs[size]
        graph.replay()
        return out[: b * q]


def build_verify_graphs(runner, capture: bool = True, num_drafts: int | None = None) -> VerifyGraphs | None:
    """Capture the verify graphs of ``runner`` (batch sizes up to the drafting limit, q = k+1, or
    ``num_drafts`` + 1); None when nothing is to capture or the capture failed (logged: verify steps then run
    eagerly)."""
    import logging

    from ..cuda_graphs import build_graphs, capture_sizes
    cfg, plan = runner.config, runner.memory_plan
    limit = min(cfg.max_num_seqs, cfg.speculative_disable_by_batch_size)
    sizes = capture_sizes(cfg.cuda_graph_sizes, limit)
    if not sizes or runner.drafter is None:
        return None
    graphs = build_graphs(VerifyGraphs, runner.model, runner.caches, batch_sizes=sizes,
                          query_len=(num_drafts or cfg.num_speculative_tokens) + 1, max_model_len=plan.max_model_len,
                          pad_state_slot=plan.pad_state_slot, device=runner.device, capture=capture)
    try:
        graphs.capture_all()
    except Exception:   # serving eagerly beats not serving; the log says why it is slower
        logging.getLogger("catengine").exception("verify CUDA graph capture failed; verify steps run eagerly")
        return None
    return graphs
