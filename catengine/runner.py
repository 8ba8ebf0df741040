"""ModelRunner: scheduler output -> flat batch -> model -> logits -> sampled tokens.

Start-up (:meth:`ModelRunner.__init__`, in nano-vllm's order, all of it here): profile the worst-case
step and read the CUDA allocator (:meth:`_profile_cache_budget`), plan the memory
(:func:`catengine.memory.plan_memory`, exposed as ``runner.memory_plan``), allocate the caches, warm
up the kernels and capture the decode CUDA graphs (CUDA only; graphs unless ``enforce_eager``). The
profile and the warm-up run on throw-away caches the runner allocates itself.

Per step (:meth:`ModelRunner.launch`; :meth:`execute` waits for its tokens too):
1. the block and state copies the scheduler asked for (fork copies, prefix-hit state restores);
2. :meth:`host_batch` builds ``input_ids``, ``positions`` and the batch metadata on the host with a
   few vectorised torch ops;
3. a decode-only batch that a captured graph covers is replayed from it (:mod:`catengine.cuda_graphs`),
   every other batch goes through :meth:`forward` (the eager model call); a uniform verify step skips step 2
   and replays a verify graph from its items (:meth:`catengine.spec.graphs.VerifyGraphs.run_items`);
4. the hidden state of each sequence's last new token, for sequences whose step ends their pending
   tokens, goes through ``compute_logits``, :func:`apply_penalties` and :func:`sample` (one row per
   completion: a leader finishing its prompt samples its forks' first tokens from the same logits);
5. the state snapshots: live slots copied into snapshot slots after the forward.
With speculative decoding (:mod:`catengine.spec`) the drafter proposes the verify items' drafts before step 2,
verify rows are accepted by :func:`catengine.spec.accept` instead of step 4's sampling, and the drafter keeps
the step's hidden rows for the next step's MTP passes.
"""
from __future__ import annotations

import array
import contextlib
import logging
import time
from dataclasses import dataclass

import torch

from .config import EngineConfig
from .cuda_graphs import DecodeGraphs, build_graphs, capture_sizes, captured
from .memory import MemoryPlan, cuda_cache_budget, plan_memory
from .models.batch import BatchMetadata, ModelCaches, resolve_placeholders
from .kernels import ops
from .logprobs import prompt_logprobs
from .sample_rows import SampleRows, penalty_views, sample_rows
from .sampling import SamplingParams, apply_penalties, device_tensor, sample
from .scheduler import SchedulerOutput
from .spec import Drafter, MTPDrafter, accept
from .spec.drafter import fill_drafts
from .spec.draft_graphs import build_draft_graphs
from .spec.graphs import VerifyGraphs, build_verify_graphs
from .spec.vocab import draft_vocab_ids
from .spec.rows import intermediate_slots, intermediate_targets, without_rows
from .step_result import PendingStep, RunnerOutput

log = logging.getLogger("catengine")


@dataclass(frozen=True)
class BatchShape:
    """The host-side facts of a step that pick kernels and launch shapes."""
    max_query_len: int
    max_seq_len: int
    decode_only: bool     # every sequence brings one token and continues its GDN state


_I32 = next(code for code in "ilh" if array.array(code).itemsize == 4)   # "i" on every common platform
_I64 = "q"


def _tensor(values: array.array, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor over an ``array.array`` (it keeps the array alive): 3x faster than torch.tensor on a
    list, which the per-step batch build pays for every field."""
    return torch.frombuffer(values, dtype=dtype) if len(values) else torch.empty(0, dtype=dtype)


class ModelRunner:
    def __init__(self, model, config: EngineConfig, *, eos_token_ids: tuple[int, ...] = ()):
        """Start the device for ``model`` (loaded on ``config.device``): profile, plan memory, allocate
        the caches, warm up, capture the decode graphs. ``config`` is resolved (``EngineConfig.resolve``);
        the plan decides max_model_len when it is None there."""
        self.model = model
        self.config = config
        self.device = torch.device(config.device)
        self.eos_token_ids = tuple(eos_token_ids)
        self.caches: ModelCaches | None = None   # the profile's throw-away caches stand in until the plan
        self.graphs: DecodeGraphs | None = None  # captured on CUDA without enforce_eager
        self._bitmasks = None                    # structured outputs' mask buffer, made on first use
        # speculative decoding: proposes the drafts of the steps' verify items (tests swap in their own)
        self.drafter: Drafter | None = (
            MTPDrafter(model, self.device, draft_vocab_ids(config.speculative_config, model.config.vocab_size,
                                                           self.eos_token_ids))
            if config.num_speculative_tokens and model.mtp is not None else None)
        self.verify_graphs: VerifyGraphs | None = None   # uniform verify steps, captured like decode
        self.memory_plan: MemoryPlan = self._plan_memory(self._profile_cache_budget())
        plan = self.memory_plan
        self.caches = self._allocate(plan.num_blocks, plan.num_state_slots, block_size=plan.block_size)
        if self.device.type == "cuda":
            log.info("warm-up (kernel compilation on a cold cache) took %.1f s", self.warm_up())
            # at TP > 1 every rank captures and replays the same graphs (distributed/graphs.py)
            if not config.enforce_eager:
                self.enable_decode_graphs()
                self.verify_graphs = build_verify_graphs(self)
                if isinstance(self.drafter, MTPDrafter):
                    self.drafter.graphs = build_draft_graphs(self, self.drafter)

    # ------------------------------------------------------------------ start-up
    def _profile_cache_budget(self) -> int | None:
        """The bytes left for caches on CUDA, from the allocator around a profiled worst-case step; None
        when the size is given (kv_cache_memory_bytes, num_kv_blocks) or off CUDA (the CPU default)."""
        cfg = self.config
        if self.device.type != "cuda" or cfg.kv_cache_memory_bytes is not None or cfg.num_kv_blocks is not None:
            return None
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        cache_bytes = self.profile_step(cfg.max_num_batched_tokens, cfg.max_num_seqs)
        peak = torch.cuda.max_memory_allocated(self.device) - base - cache_bytes
        torch.cuda.empty_cache()
        return cuda_cache_budget(cfg, self.device, used, peak)

    def _plan_memory(self, budget_bytes: int | None) -> MemoryPlan:
        """The plan for this model's cache sizes; ``cfg.block_size`` is read here, where the plan takes it."""
        cfg, model = self.config, self.model
        return plan_memory(cfg, kv_bytes_per_block=model.kv_cache_bytes_per_block(cfg.block_size, cfg.kv_cache_dtype),
                           state_bytes_per_slot=model.state_bytes_per_slot(cfg.ssm_torch_dtype),
                           hybrid=bool(model.config.linear_attention_layers),
                           max_position_embeddings=model.config.max_position_embeddings, budget_bytes=budget_bytes)

    def _allocate(self, num_blocks: int, num_slots: int, *, block_size: int) -> ModelCaches:
        """The real caches, and the throw-away ones of the profiled step and the warm-up."""
        return self.model.allocate_caches(num_blocks, block_size, num_slots, self.config.kv_cache_dtype, self.device,
                                          ssm_dtype=self.config.ssm_torch_dtype)

    def enable_decode_graphs(self, capture: bool = True) -> None:
        """Replay decode-only steps of up to min(max_num_seqs, 256) sequences from CUDA graphs
        (``capture=False``: run the same padded static buffers eagerly, so the CPU tests check the
        padding). A failed capture logs and leaves the runner eager."""
        plan = self.memory_plan
        sizes = capture_sizes(self.config.cuda_graph_sizes, self.config.max_num_seqs)
        if not sizes:
            log.warning("no decode CUDA graph: every cuda_graph_sizes entry %s is above max_num_seqs %d",
                        list(self.config.cuda_graph_sizes), self.config.max_num_seqs)
            return
        graphs = build_graphs(DecodeGraphs, self.model, self.caches, batch_sizes=sizes,
                              max_model_len=plan.max_model_len, pad_state_slot=plan.pad_state_slot,
                              device=self.device, capture=capture)
        self.graphs = captured(graphs, "decode steps")

    def close(self) -> None:
        """Drop the model, the caches and the graphs (which hold the caches and their memory pool): the
        GPU memory is freed once nothing else references them."""
        self.caches = self.graphs = self.verify_graphs = None
        if isinstance(self.drafter, MTPDrafter):
            self.drafter.graphs = None
        self.model = None

    # ------------------------------------------------------------------ one step
    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """Run one step and wait for its tokens."""
        return self.launch(out).result()

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, prev_tokens: torch.Tensor | None = None) -> PendingStep:
        """Queue one step on the device; its tokens come with :meth:`PendingStep.result`. ``prev_tokens``: the
        sampled-token tensor of the step before (async scheduling), which the placeholders in ``out``'s token
        ids index (:mod:`catengine.scheduler.in_flight`)."""
        if out.is_empty:
            return PendingStep.done(RunnerOutput([], []))
        if out.block_copies:
            self.caches.copy_blocks(out.block_copies)
        for src, dst in out.state_copies:   # in order: a restore may target a slot a fork copy reads first
            self.caches.copy_state_slot(src, dst)
        t0 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.propose(out, self.caches)
        # the MTP draft graph leaves its drafts on the device for the verify graph (None: in draft_tokens)
        drafts = self.drafter.take_device_drafts() if self.drafter is not None else None
        rows = sample_rows(out)
        if self.verify_graphs is not None and self.verify_graphs.covers(out.scheduled):
            hidden, verify = self.verify_graphs.run_items(out.scheduled, drafts), True   # no host_batch
        else:
            if drafts is not None:
                fill_drafts(out.scheduled, drafts)
                drafts = None
            host, shape = self.host_batch(out)
            verify = "intermediate_state_slots" in host
            graphs = self.graphs
            if not verify and graphs is not None and graphs.can_run(shape, len(out.scheduled),
                                                                    host["block_tables"].shape[1]):
                hidden = graphs.run(host, prev_tokens)
            else:
                input_ids, positions, batch = self.device_batch(host, shape)
                if prev_tokens is not None:
                    input_ids = resolve_placeholders(input_ids, prev_tokens)
                hidden = self.forward(input_ids, positions, batch)
        accepted = accept(self.model, hidden, out, self.eos_token_ids, drafts) if verify else {}
        rows = without_rows(rows, accepted)
        # structured outputs: on CUDA the forward is queued, not done, so the grammar masks are filled on
        # the CPU while the GPU computes the hidden states (the first wait is for the sampled tokens)
        masks = self._fill_masks(rows)
        tokens, logprobs = self._sample(rows, hidden, masks)
        prompt_lps = self._prompt_logprobs(out, hidden)
        if self.drafter is not None:
            self.drafter.record(out, hidden, accepted)
        for src, dst in out.state_saves:
            self.caches.copy_state_slot(src, dst)
        return PendingStep(tokens, RunnerOutput([], logprobs, time.perf_counter() - t0, prompt_lps, accepted))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: BatchMetadata) -> torch.Tensor:
        """The eager model call (prefill, mixed and large batches; every step with ``enforce_eager``)."""
        return self.model(input_ids, positions, batch, self.caches)

    # ------------------------------------------------------------------ batch building
    def host_batch(self, out: SchedulerOutput) -> tuple[dict[str, torch.Tensor], BatchShape]:
        """The step's flat inputs as host tensors, built with a few vectorised torch ops."""
        items = out.scheduled
        bs = self.caches.block_size
        starts = [it.start for it in items]
        lens = [it.num_new for it in items]
        ends = [s + n for s, n in zip(starts, lens)]
        ids: list[int] = []
        for it in items:
            ids.extend(it.seq.token_ids[it.start:it.end - it.num_drafts])
            ids.extend(it.draft_tokens)
        width = max(len(it.seq.block_table) for it in items)
        table = array.array(_I32)
        for it in items:
            table.extend(it.seq.block_table)
            table.frombytes(bytes(4 * (width - len(it.seq.block_table))))   # zero padding
        block_tables = _tensor(table, torch.int32).view(len(items), width)
        if all(n == 1 for n in lens):
            # one token per sequence (decode): plain lists beat the vectorised ops at this size
            positions = _tensor(array.array(_I64, starts), torch.int64)
            slot_mapping = _tensor(array.array(_I64, [it.seq.block_table[s // bs] * bs + s % bs
                                                     for it, s in zip(items, starts)]), torch.int64)
            qsl = torch.arange(len(items) + 1, dtype=torch.int32)
        else:
            q_lens = torch.tensor(lens, dtype=torch.int64)
            qsl = torch.zeros(len(items) + 1, dtype=torch.int64)
            torch.cumsum(q_lens, 0, out=qsl[1:])
            seq_of_token = torch.repeat_interleave(torch.arange(len(items)), q_lens)
            positions = torch.tensor(starts, dtype=torch.int64)[seq_of_token] + (
                torch.arange(qsl[-1].item()) - qsl[:-1][seq_of_token])
            slot_mapping = block_tables[seq_of_token, positions // bs].to(torch.int64) * bs + positions % bs
        host = {
            "input_ids": _tensor(array.array(_I64, ids), torch.int64),
            "positions": positions,
            "query_start_loc": qsl.to(torch.int32),
            "seq_lens": _tensor(array.array(_I32, ends), torch.int32),
            "block_tables": block_tables,
            "slot_mapping": slot_mapping,
            "state_slots": _tensor(array.array(_I32, [it.seq.state_slot for it in items]), torch.int32),
            "has_initial_state": torch.tensor([s > 0 for s in starts], dtype=torch.bool),
        }
        shape = BatchShape(max_query_len=max(lens), max_seq_len=max(ends),
                           decode_only=all(n == 1 and s > 0 for n, s in zip(lens, starts)))
        if any(it.num_drafts for it in items):
            host["intermediate_state_slots"] = inter = intermediate_slots(items, shape.max_query_len)
            host["intermediate_rows"], host["intermediate_row_slots"] = intermediate_targets(inter)
        return host, shape

    def device_batch(self, host: dict[str, torch.Tensor], shape: BatchShape):
        dev = {k: self._to_device(v) for k, v in host.items()}
        batch = BatchMetadata(
            query_start_loc=dev["query_start_loc"], seq_lens=dev["seq_lens"], block_tables=dev["block_tables"],
            slot_mapping=dev["slot_mapping"], state_slots=dev["state_slots"],
            has_initial_state=dev["has_initial_state"], max_query_len=shape.max_query_len,
            max_seq_len=shape.max_seq_len, decode_only=shape.decode_only,
            intermediate_state_slots=dev.get("intermediate_state_slots"),
            intermediate_targets=(dev["intermediate_rows"], dev["intermediate_row_slots"])
            if "intermediate_rows" in dev else None)
        return dev["input_ids"], dev["positions"], batch

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    # ------------------------------------------------------------------ sampling
    def _fill_masks(self, rows: SampleRows):
        if not any(g is not None for g in rows.grammars):
            return None
        if self._bitmasks is None:
            from .structured.bitmask import TokenBitmasks
            self._bitmasks = TokenBitmasks(self.model.config.vocab_size, self.device)
        return self._bitmasks.fill(rows.grammars)

    def _sample(self, sample_rows: SampleRows, hidden: torch.Tensor, masks=None):
        rows, last_index, params, seeds, steps = (sample_rows.rows, sample_rows.last_index, sample_rows.params,
                                                  sample_rows.seeds, sample_rows.steps)
        if not rows:
            return torch.empty(0, dtype=torch.int64, device=hidden.device), []
        if last_index == list(range(hidden.shape[0])):   # decode: every hidden row is sampled once, in order
            logits = self.model.compute_logits(hidden)
        else:
            logits = self.model.compute_logits(hidden.index_select(0, device_tensor(last_index, torch.int64,
                                                                                    hidden.device)))
        prompts, outputs = penalty_views(rows)
        processed = apply_penalties(logits, prompts, outputs, params, self.eos_token_ids)
        if masks is not None:
            # after the penalties (a grammar's -inf must stay -inf), on a copy: logprobs read the raw logits
            if processed is logits:
                processed = logits.float().clone()
            ops.apply_token_bitmask(processed, masks[1], masks[0])
        return sample(processed, params, seeds, steps, raw_logits=logits)

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor):
        """The lm_head over the prompt positions of the requests that asked for prompt logprobs (and no
        other): the hidden row of position q gives the logprob of prompt token q + 1, so a chunk
        [start, end) yields positions start + 1 .. min(end, prompt length - 1). A recompute after the
        first token (preemption) yields nothing: those positions were reported."""
        wanted, rows, targets, top_n = [], [], [], []
        offset = 0
        for it in out.scheduled:
            seq = it.seq
            n = getattr(seq.params, "prompt_logprobs", None)
            if n is None:   # the common case: one attribute read per scheduled sequence
                offset += it.num_new
                continue
            last = min(it.end, seq.num_prompt_tokens - 1)
            if seq.num_output_tokens == 0 and last > it.start:
                count = last - it.start
                wanted.append((seq, it.start + 1, count))
                rows.extend(range(offset, offset + count))
                targets.extend(seq.token_ids[it.start + 1:last + 1])
                top_n.extend([n] * count)
            offset += it.num_new
        if not rows:
            return []
        # max_num_seqs rows at a time: the profiled sampling step's [rows, vocab] footprint
        entries = prompt_logprobs(hidden, rows, targets, top_n, self.model.compute_logits, self.config.max_num_seqs)
        result, k = [], 0
        for seq, first, count in wanted:
            result.append((seq, first, entries[k:k + count]))
            k += count
        return result

    # ------------------------------------------------------------------ start-up runs on throw-away caches
    def _fake_step(self, query_lens: list[int], seq_lens: list[int], params: list) -> None:
        """One forward + logits + sampling of made-up sequences (consecutive blocks from 0, slot b for
        sequence b) on whatever ``self.caches`` holds; the sampling rows cycle over the sequences' last
        tokens."""
        bs = self.caches.block_size
        tables, next_block = [], 0
        for n in seq_lens:
            k = -(-n // bs)
            tables.append(list(range(next_block, next_block + k)))
            next_block += k
        batch = BatchMetadata.build(query_lens, seq_lens, tables, bs, list(range(len(seq_lens))), device=self.device)
        positions = BatchMetadata.positions(query_lens, seq_lens, device=self.device)
        input_ids = torch.zeros(sum(query_lens), dtype=torch.int64, device=self.device)
        hidden = self.forward(input_ids, positions, batch)
        last = (batch.query_start_loc[1:] - 1).to(torch.int64)
        rows = last.repeat(-(-len(params) // len(seq_lens)))[:len(params)]
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        sample(logits, params, [0] * len(params), [0] * len(params))

    @torch.inference_mode()
    def warm_up(self) -> float:
        """Run the step shapes the first requests would otherwise wait on while Triton compiles (prompt
        lengths aligned and not to 16, a chunk continuing a cached prefix beside a decode, an eager
        decode; greedy and sampled rows) on throw-away caches shaped like the planned ones. Returns the
        seconds it took (mostly compilation on a cold kernel cache)."""
        t0 = time.perf_counter()
        greedy = SamplingParams(temperature=0.0)
        sampled = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, min_p=0.01, logprobs=2)
        shapes = [([7], [7]), ([32], [32]), ([5, 1], [21, 9]), ([1, 1], [9, 40])]
        bs = self.memory_plan.block_size
        # every fake step numbers its blocks from 0: the largest step's count is enough
        need = max(sum(-(-n // bs) for n in lens) for _, lens in shapes)
        with self._scratch_caches(self._allocate(need, 2, block_size=bs)):
            for q, s in shapes:
                self._fake_step(q, s, [greedy, sampled])
        return time.perf_counter() - t0

    @contextlib.contextmanager
    def _scratch_caches(self, caches: ModelCaches):
        """Run with ``caches`` in place of the real ones (start-up steps), synchronised, then restore."""
        saved, self.caches = self.caches, caches
        try:
            yield caches
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            self.caches = saved

    # ------------------------------------------------------------------ memory profiling
    @torch.inference_mode()
    def profile_step(self, num_tokens: int, num_seqs: int) -> int:
        """Run a worst-case step once so the caller can read the activation peak from the CUDA
        allocator: ``num_tokens`` new tokens over a few fresh sequences (how they split barely changes
        the activations), then logits and sampling (top-k/top-p, logprobs) for ``num_seqs`` rows,
        the largest sampling batch. Uses throw-away caches and returns their size in bytes, which the
        caller subtracts from the peak."""
        num_fwd = max(1, min(num_seqs, num_tokens, 16))
        lens = [num_tokens // num_fwd + (1 if i < num_tokens % num_fwd else 0) for i in range(num_fwd)]
        bs = self.config.block_size   # the plan, which this step sizes, does not exist yet: the setting itself
        with self._scratch_caches(self._allocate(sum(-(-n // bs) for n in lens), num_fwd, block_size=bs)) as caches:
            params = [SamplingParams(temperature=1.0, top_p=0.9, top_k=50, logprobs=5)] * num_seqs
            self._fake_step(lens, lens, params)
        return sum(t.numel() * t.element_size() for layer in caches.layers
                   for t in vars(layer).values() if isinstance(t, torch.Tensor))
