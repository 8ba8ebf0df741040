"""CUDA graphs for decode steps: one captured model forward per padded batch size, replayed.

A decode step of a 27B model is ~1,000 kernel launches; launched one by one from Python they cost
more than the kernels of a small batch. :class:`DecodeGraphs` captures ``model(...)`` once per batch
size in :func:`graph_batch_sizes` (largest first, all in one memory pool) on static input buffers,
and a decode-only step of ``b`` sequences replays the graph of the smallest captured size ``B >= b``
after copying its inputs into the buffers' first ``b`` rows.

The ``B - b`` padding rows must not disturb anything: they write no KV (slot -1), start their GDN
state from zeros (``has_initial_state`` False) and write it to a padding state slot that no sequence
owns (the memory plan reserves it), attend to one key of block 0 (finite: caches start zeroed), and
their hidden rows are dropped. Split-KV attention is captured with ``max_seq_len = max_model_len``,
so the split count is fixed per graph; splits past a shorter context find no keys and the combine
gives them weight zero.

``capture=False`` replays nothing and runs the model eagerly on the same padded buffers: the CPU
tests check the padding that way, the GPU tests the graphs themselves.
"""
from __future__ import annotations

import logging
import time

import torch

from .models.batch import BatchMetadata, ModelCaches, resolve_placeholders

log = logging.getLogger("catengine")

MAX_GRAPH_BATCH = 256


def graph_batch_sizes(max_num_seqs: int, limit: int = MAX_GRAPH_BATCH) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to min(max_num_seqs, limit) (that bound included):
    a batch pads at most 7 rows past 8."""
    top = max(1, min(max_num_seqs, limit))
    sizes = [s for s in (1, 2, 4) if s < top] + list(range(8, top + 1, 8))
    if not sizes or sizes[-1] != top:
        sizes.append(top)
    return sizes


def capture_sizes(explicit, max_num_seqs: int) -> list[int]:
    """The batch sizes to capture: ``explicit`` (EngineConfig.cuda_graph_sizes) sorted, without those above
    max_num_seqs (a decode batch is never larger), else :func:`graph_batch_sizes`. May be empty."""
    if explicit is None:
        return graph_batch_sizes(max_num_seqs)
    return sorted({int(b) for b in explicit if b <= max_num_seqs})


def build_graphs(cls, model, caches, **kwargs):
    """``cls(model, caches, **kwargs)``; at TP > 1 the model (a RemoteModel) builds them on every rank, which
    then capture and replay the same graphs (distributed/graphs.py)."""
    remote = getattr(model, "build_graphs", None)
    return remote(cls, caches, **kwargs) if remote is not None else cls(model, caches, **kwargs)


def captured(graphs, what: str):
    """``graphs`` with every size captured, or None when the capture failed: serving eagerly beats not serving,
    and the log says why those steps (``what``: decode steps, verify steps, draft passes) are slower."""
    try:
        graphs.capture_all()
    except Exception:  # noqa: BLE001
        log.exception("%s CUDA graph capture failed; %s run eagerly", what.split()[0], what)
        return None
    return graphs


class DecodeGraphs:
    kind = "decode"   # in the capture log line

    def __init__(self, model, caches: ModelCaches, *, batch_sizes: list[int], max_model_len: int,
                 pad_state_slot: int, device: torch.device, capture: bool = True):
        """``max_model_len`` and ``pad_state_slot`` come from the memory plan; the block size from ``caches``."""
        self.model, self.caches = model, caches
        self.batch_sizes = sorted(set(batch_sizes))
        self.max_batch = self.batch_sizes[-1]
        self.max_model_len = max_model_len
        self.pad_state_slot = pad_state_slot
        self.device = torch.device(device)
        self.capture = capture
        n, width = self.max_batch, -(-max_model_len // caches.block_size)
        z = dict(device=self.device)
        # static device inputs: every graph reads slices of these
        self.input_ids = torch.zeros(n, dtype=torch.int64, **z)
        self.positions = torch.zeros(n, dtype=torch.int64, **z)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, **z)
        self.seq_lens = torch.ones(n, dtype=torch.int32, **z)
        self.block_tables = torch.zeros((n, width), dtype=torch.int32, **z)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, **z)
        self.state_slots = torch.full((n,), pad_state_slot, dtype=torch.int32, **z)
        self.has_initial_state = torch.zeros(n, dtype=torch.bool, **z)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.pool_bytes = 0
        self.num_runs = 0          # decode steps served (tests check the graphs were used)

    # ------------------------------------------------------------------ which steps
    def padded_size(self, batch_size: int) -> int | None:
        for s in self.batch_sizes:
            if s >= batch_size:
                return s
        return None

    def can_run(self, shape, num_seqs: int, block_table_width: int) -> bool:
        """Whether a step of this :class:`catengine.runner.BatchShape` fits a captured graph (decode_only
        means one new token per sequence)."""
        return (shape.decode_only and num_seqs <= self.max_batch and shape.max_seq_len <= self.max_model_len
                and block_table_width <= self.block_tables.shape[1])

    def _batch(self, size: int) -> BatchMetadata:
        return BatchMetadata(
            query_start_loc=self.query_start_loc[: size + 1], seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size], slot_mapping=self.slot_mapping[:size],
            state_slots=self.state_slots[:size], has_initial_state=self.has_initial_state[:size],
            max_query_len=1, max_seq_len=self.max_model_len, decode_only=True)

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.positions[:size], self._batch(size), self.caches)

    # ------------------------------------------------------------------ capture
    @torch.inference_mode()
    def capture_all(self) -> None:
        """Capture every size, largest first so the smaller graphs reuse its pool memory. The padding
        state (all rows) is what the graphs see while being captured: nothing real is touched."""
        if not self.capture:
            return
        t0 = time.perf_counter()
        before = torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.batch_sizes):
            # an eager run first: Triton compiles, allocators and cuBLAS workspaces settle outside the capture
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._forward(size)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self._forward(size)
            self._graphs[size] = (graph, out)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - t0
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - before
        log.info("captured %d %s CUDA graphs (batch sizes %s) in %.1f s, %.0f MiB",
                 len(self._graphs), self.kind, _ranges(self.batch_sizes), self.capture_seconds, self.pool_bytes / 2**20)

    # ------------------------------------------------------------------ replay
    @torch.inference_mode()
    def run(self, host: dict[str, torch.Tensor], prev_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [b, H] of a decode step whose inputs are the runner's host tensors
        (``input_ids``, ``positions``, ``seq_lens``, ``block_tables``, ``slot_mapping``, ``state_slots``);
        placeholder ids index ``prev_tokens`` (async scheduling: ``runner.resolve_placeholders``)."""
        b = host["seq_lens"].shape[0]
        size = self.padded_size(b)
        width = host["block_tables"].shape[1]
        pad = size - b

        def padded(name: str, value) -> torch.Tensor:
            t = host[name]
            return torch.cat([t, torch.full((pad,), value, dtype=t.dtype)]) if pad else t

        # padding built on the host: one copy per buffer, no fill kernels
        if prev_tokens is not None and b <= prev_tokens.shape[0] and \
                torch.equal(host["input_ids"], -1 - torch.arange(b)):
            # steady async decode: row i's input is the token the step before sampled in row i (placeholder
            # -1 - i): one device copy instead of the host ids' copy and resolve_placeholders' kernels
            self.input_ids[:b].copy_(prev_tokens[:b])
            if pad:
                self.input_ids[b:size].zero_()
        else:
            self.input_ids[:size].copy_(padded("input_ids", 0), non_blocking=True)
            if prev_tokens is not None:
                self.input_ids[:b].copy_(resolve_placeholders(self.input_ids[:b], prev_tokens))
        self.positions[:size].copy_(padded("positions", 0), non_blocking=True)
        self.seq_lens[:size].copy_(padded("seq_lens", 1), non_blocking=True)
        self.slot_mapping[:size].copy_(padded("slot_mapping", -1), non_blocking=True)
        self.state_slots[:size].copy_(padded("state_slots", self.pad_state_slot), non_blocking=True)
        self.has_initial_state[:size].copy_(torch.arange(size) < b, non_blocking=True)
        self.block_tables[:b, :width].copy_(host["block_tables"], non_blocking=True)
        return self._replay(size, b)

    def _replay(self, size: int, rows: int) -> torch.Tensor:
        """Replay graph ``size`` over the static buffers just filled (capture=False: its forward, eagerly); the
        first ``rows`` rows of its output."""
        self.num_runs += 1
        if not self.capture:
            return self._forward(size)[:rows]
        graph, out = self._graphs[size]
        graph.replay()
        return out[:rows]


def _ranges(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) if len(sizes) <= 6 else f"{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}"
