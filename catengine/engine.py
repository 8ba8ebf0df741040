"""Engine: requests in, tokens and text out, one step at a time.

    engine = Engine()                                   # the demo model
    outs = engine.generate(["Hello", "Hi"], SamplingParams(temperature=0, max_tokens=8))

Lifecycle of a request (docs/architecture.md has the full walk-through): ``add_request`` ->
``prepare_request`` (tokenize, validate, draw seeds) -> ``Scheduler.add`` ... each ``step``:
``Scheduler.schedule`` -> ``ModelRunner.launch`` -> ``Scheduler.update`` -> ``Completion.add_token``
(detokenize, stop checks) -> ``Scheduler.finish`` -> outputs; with async scheduling the host does one
step's schedule and the previous step's outputs while the device runs (catengine/step_loop.py). Not
thread-safe: one thread drives an Engine (``AsyncEngine`` runs it on its own thread).
"""
from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import EngineConfig, check_dtype_supported, make_current, resolve_device
from .errors import ConfigError, ContextTooLong, InvalidRequest
from .memory import MemoryPlan
from .outputs import RequestOutput, StreamDelta
from .request_state import PreparedRequest, RequestState
from .runner import ModelRunner
from .sampling import SamplingParams
from .scheduler import Scheduler, SchedulerConfig
from .spec.accept import can_draft
from .spec.stats import check_mtp, spec_stats
from .step_loop import StepLoop
from .tokenizer import Tokenizer

log = logging.getLogger("catengine")

Prompt = str | list[int] | Mapping[str, Any]


class Engine:
    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, **kwargs):
        """``Engine(model=None|path, dtype=..., ...)``: every keyword is an :class:`EngineConfig` field
        (or pass ``config=EngineConfig(...)``)."""
        if config is None:
            unknown = sorted(set(kwargs) - set(EngineConfig.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"unknown engine setting(s) {unknown}; valid: "
                                  f"{sorted(EngineConfig.__dataclass_fields__)}")
            config = EngineConfig(model=None if model is None else str(model), **kwargs)
        elif model is not None or kwargs:
            raise ConfigError("pass either config=EngineConfig(...) or keyword settings, not both")
        config.validate()
        self._build(config)

    # ------------------------------------------------------------------ construction
    def _build(self, config: EngineConfig) -> None:
        from .distributed.executor import TPExecutor
        from .models import ModelConfig, load_model

        device = resolve_device(config.device)
        if config.model is None:
            from .tools.demo import serving_model_path
            path = Path(serving_model_path())
        else:
            path = Path(config.model).expanduser()
        self.model_path = path
        model_config = ModelConfig.from_pretrained(path)
        cfg = config.resolve(device=device, max_position_embeddings=model_config.max_position_embeddings)
        check_dtype_supported(cfg.torch_dtype, device)
        make_current(device)
        self.tokenizer = Tokenizer(cfg.tokenizer or path, chat_template=cfg.chat_template)
        k = cfg.num_speculative_tokens
        # TP > 1: rank 0 here (the executor's RemoteModel), the other ranks in their own processes
        self.executor = TPExecutor(path, cfg, device, load_mtp=k > 0) if cfg.tensor_parallel_size > 1 else None
        self.model = self.executor.model if self.executor is not None else \
            load_model(path, dtype=cfg.torch_dtype, device=device, load_mtp=k > 0,
                       expert_parallel=cfg.enable_expert_parallel)
        check_mtp(self.model, k, path)
        if cfg.quantize_lm_head:
            self.model.quantize_lm_head(cfg.quantize_lm_head)
        self.model_config = model_config
        self.device = device
        self.eos_token_ids = tuple(sorted(set(self.tokenizer.eos_token_ids) | set(model_config.eos_token_ids)))
        self.vocab_size = model_config.vocab_size
        # the runner starts the device (profile, memory plan, caches, warm-up, graphs); the rest follows its plan
        try:
            self.runner = ModelRunner(self.model, cfg, eos_token_ids=self.eos_token_ids)
        except BaseException:
            if self.executor is not None:
                self.executor.shutdown()
            raise
        plan = self.runner.memory_plan
        self.config = dataclasses.replace(cfg, max_model_len=plan.max_model_len)
        self.scheduler = Scheduler(SchedulerConfig(
            num_blocks=plan.num_blocks, block_size=plan.block_size, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens, max_model_len=plan.max_model_len,
            enable_prefix_caching=cfg.enable_prefix_caching, num_snapshot_slots=plan.num_snapshot_slots,
            hybrid=bool(model_config.linear_attention_layers), num_speculative_tokens=k,
            spec_disable_batch_size=cfg.speculative_disable_by_batch_size))
        self._rng = random.Random(cfg.seed)
        self._rng_lock = threading.Lock()
        self._requests: dict[str, RequestState] = {}
        self._touched: dict[str, RequestState] = {}  # requests changed since the last step's outputs
        self._counters = Counter()
        self._finish_reasons = Counter()
        self._grammars = None    # the structured-outputs backend, built on the first request that needs it
        self._grammars_lock = threading.Lock()
        overlap = cfg.async_scheduling and k == 0
        if cfg.async_scheduling and k:
            log.info("async scheduling is off while speculating: a verify step's accepted count decides the next")
        self.step_loop = StepLoop(self, overlap=overlap)   # synchronous or async scheduling
        log.info("catengine: %s on %s (%s, KV %s); %s%s", path, device, cfg.dtype, cfg.kv_cache_dtype, plan.describe(),
                 f" (each of {cfg.tensor_parallel_size} ranks)" if cfg.tensor_parallel_size > 1 else "")
        log.info("%s", capacity_line(plan, cfg.max_num_seqs, self.runner.graphs.max_batch if self.runner.graphs
                                     else None))

    @property
    def memory_plan(self) -> MemoryPlan:
        """KV blocks, capacity in tokens, state slots: the runner's plan (read-only)."""
        return self.runner.memory_plan

    @property
    def grammar_backend(self):
        """The structured-outputs backend (:class:`catengine.structured.GrammarBackend`); built on first use
        (its tokenizer table takes about 2 s), from either thread."""
        with self._grammars_lock:
            if self._grammars is None:
                from .structured import GrammarBackend
                t0 = time.perf_counter()
                self._grammars = GrammarBackend(self.tokenizer.hf, self.vocab_size, self.eos_token_ids)
                log.info("structured outputs: xgrammar ready (tokenizer table of %d tokens in %.1f s)",
                         self.vocab_size, time.perf_counter() - t0)
            return self._grammars

    # ------------------------------------------------------------------ requests
    def default_sampling_params(self) -> SamplingParams:
        """The model's generation_config.json defaults (temperature, top_p, top_k, ...), max_tokens 16."""
        return SamplingParams.from_request({}, self.tokenizer.generation_config)

    def prepare_request(self, request_id: str | None, prompt: Prompt, params: SamplingParams | None = None, *,
                        arrival_time: float | None = None, special_tokens_visible: bool = False) -> PreparedRequest:
        """Tokenize and validate a request without queuing it (safe to call from another thread).
        Raises InvalidRequest / ContextTooLong / CapacityExceeded."""
        params = self.default_sampling_params() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequest(f"params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._tokenize(prompt)
        params.verify_vocab(self.vocab_size)
        max_len = self.config.max_model_len
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - len(ids)
        if max_tokens < 1:
            raise ContextTooLong(f"the prompt has {len(ids)} tokens but max_model_len is {max_len}, which leaves no "
                                 f"room for output; shorten the prompt")
        self.scheduler.check_fits(len(ids), len(ids) + max_tokens)
        # a grammar that does not compile is the client's error, found before anything is queued
        spec = params.structured_outputs
        if spec is not None and self.config.structured_outputs_disable_any_whitespace:
            spec = dataclasses.replace(spec, disable_any_whitespace=True)
        grammar = self.grammar_backend.compile(spec) if spec is not None else None
        children = [params.child(i) for i in range(params.n)]
        with self._rng_lock:
            seeds = [c.seed if c.seed is not None else self._rng.getrandbits(63) for c in children]
        return PreparedRequest(request_id or uuid.uuid4().hex, text, ids, params, max_tokens, children, seeds,
                               time.time() if arrival_time is None else arrival_time, special_tokens_visible,
                               grammar)

    def check_prompt_chars(self, text: str) -> None:
        """ContextTooLong, before tokenizing, for a text too long to fit ``max_model_len`` tokens
        whatever it says (longer than ``max_model_len * Tokenizer.max_token_chars`` characters):
        tokenizing tens of megabytes takes tens of seconds on the preparation thread."""
        max_len = self.config.max_model_len
        if len(text) <= max_len:   # every token is at least one character: no need for the bound
            return
        limit = max_len * self.tokenizer.max_token_chars
        if len(text) > limit:
            raise ContextTooLong(f"the prompt has {len(text)} characters, more than the {limit} that "
                                 f"max_model_len {max_len} tokens can hold ({self.tokenizer.max_token_chars} "
                                 "characters per token at most); shorten the prompt")

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, Mapping):
            text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
            if ids is None:
                if not isinstance(text, str):
                    raise InvalidRequest("a prompt dict needs 'prompt' (a string) or 'prompt_token_ids'")
                self.check_prompt_chars(text)
                ids = self.tokenizer.encode(text)
        elif isinstance(prompt, str):
            self.check_prompt_chars(prompt)
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            text, ids = None, prompt
        else:
            raise InvalidRequest(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in ids):
            raise InvalidRequest(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if not ids:
            raise InvalidRequest("the prompt is empty; send at least one token")
        return text, [int(t) for t in ids]

    def add_prepared(self, prep: PreparedRequest) -> str:
        if prep.request_id in self._requests:
            raise InvalidRequest(f"request id {prep.request_id!r} is already in use; pick a unique id")
        state = RequestState(prep, self.tokenizer, self.eos_token_ids)
        forks = [(seed, p) for seed, p in zip(prep.seeds[1:], prep.completion_params[1:])]
        seq = self.scheduler.add(prep.request_id, prep.prompt_token_ids, len(prep.prompt_token_ids) + prep.max_tokens,
                                 params=prep.completion_params[0], seed=prep.seeds[0], forks=forks,
                                 skip_prefix_cache=prep.params.prompt_logprobs is not None)
        state.completions[0].seq = seq
        seq.can_draft = self.config.num_speculative_tokens > 0 and can_draft(seq.params, prep.grammar)
        if prep.grammar is not None:
            backend = self.grammar_backend
            for c in state.completions:
                c.grammar = backend.matcher(prep.grammar, c.stop_ids)
            seq.grammar = state.completions[0].grammar
        self._requests[prep.request_id] = state
        return prep.request_id

    def add_request(self, request_id: str | None, prompt: Prompt, params: SamplingParams | None = None, *,
                    arrival_time: float | None = None, special_tokens_visible: bool = False) -> str:
        """Queue a request; returns its id (a fresh one when ``request_id`` is None)."""
        return self.add_prepared(self.prepare_request(request_id, prompt, params, arrival_time=arrival_time,
                                                      special_tokens_visible=special_tokens_visible))

    def abort(self, request_id: str | list[str]) -> None:
        """Stop requests now, freeing their blocks and slots; unknown or finished ids are ignored. Each
        aborted completion's final output (finish_reason "abort") comes with the next ``step``."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            state = self._requests.get(rid)
            if state is None or state.finished:
                continue
            self.scheduler.abort(rid)
            for c in state.completions:
                if not c.finished:
                    c.finish("abort")
                    self._finish_reasons["abort"] += 1
            state.metrics.finished_time = time.time()
            self._touched[rid] = state

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return sum(not s.finished for s in self._requests.values())

    # ------------------------------------------------------------------ stepping
    def _advance(self) -> list[RequestState]:
        """Run one scheduler step (when there is work; catengine/step_loop.py, synchronous or overlapped with
        the next); returns the requests that changed."""
        self.step_loop.advance()
        touched = list(self._touched.values())
        self._touched = {}
        for state in touched:
            if state.finished:
                self._requests.pop(state.request_id, None)
        return touched

    def step_deltas(self) -> list[StreamDelta]:
        """One step; the per-completion deltas (text, token ids, logprobs, finish) it produced."""
        states = self._advance()
        now = time.time()
        return [d for state in states for d in state.take_deltas(now)]

    def step(self) -> list[RequestOutput]:
        """One step; the cumulative outputs of the requests it changed (``finished`` when done)."""
        states = self._advance()
        for state in states:
            state.clear_deltas()   # the outputs are cumulative: no StreamDelta is built for them
        return [state.output() for state in states]

    # ------------------------------------------------------------------ batch API
    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run prompts (str | list[str] | list[int] | list[list[int]]) to completion; outputs in input
        order. Every prompt is validated before any runs. Requests queued with add_request progress
        too, but their step outputs are consumed here."""
        return self._generate(_as_prompt_list(prompts), params, special_tokens_visible=False)

    def chat(self, messages, params: SamplingParams | list[SamplingParams] | None = None, tools=None,
             chat_template_kwargs: Mapping[str, Any] | None = None, add_generation_prompt: bool = True,
             ) -> list[RequestOutput]:
        """Apply the chat template to one conversation (a list of message dicts) or a list of them and
        generate. With ``tools`` the output keeps special tokens so tool-call markup stays visible."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = []
        for conv in conversations:
            text = self.tokenizer.apply_chat_template(conv, tools=tools, add_generation_prompt=add_generation_prompt,
                                                      chat_template_kwargs=chat_template_kwargs)
            prompts.append({"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
        return self._generate(prompts, params, special_tokens_visible=bool(tools))

    def _generate(self, prompts: list[Prompt], params, special_tokens_visible: bool) -> list[RequestOutput]:
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise InvalidRequest(f"got {len(prompts)} prompts but {len(params)} SamplingParams; pass one or "
                                     f"one per prompt")
            plist = list(params)
        else:
            plist = [params] * len(prompts)
        prepared = [self.prepare_request(None, p, sp, special_tokens_visible=special_tokens_visible)
                    for p, sp in zip(prompts, plist)]
        ids = [self.add_prepared(p) for p in prepared]
        pending, results = set(ids), {}
        try:
            while pending:
                # like step(), but whole outputs only for the requests that finished: building every
                # changed request's cumulative output each step costs O(length) per request
                for state in self._advance():
                    state.clear_deltas()
                    if state.finished and state.request_id in pending:
                        results[state.request_id] = state.output()
                        pending.discard(state.request_id)
        finally:
            if pending:   # interrupted (an exception, KeyboardInterrupt): do not leave work behind
                self.abort(list(pending))
        return [results[i] for i in ids]

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict[str, Any]:
        """Gauges and counters (names as catengine.metrics reads them): num_running / num_waiting
        (requests), kv_cache_usage (0..1), prefix_cache_queries / prefix_cache_hits (tokens),
        num_preemptions, prompt_tokens_total, generation_tokens_total, request_success_total
        ({finish_reason: completions}), KV capacity figures."""
        s = self.scheduler.stats()
        sched = self.scheduler
        return {
            "num_running": len({q.request_id for q in sched.running}),
            "num_waiting": len({q.request_id for q in sched.waiting} - {q.request_id for q in sched.running}),
            "num_running_seqs": s.num_running, "num_waiting_seqs": s.num_waiting,
            "kv_cache_usage": s.kv_cache_usage, "num_kv_blocks": s.num_blocks,
            "num_free_kv_blocks": s.num_free_blocks, "num_cached_kv_blocks": s.num_cached_blocks,
            "num_evictable_kv_blocks": s.num_evictable_blocks,
            "kv_capacity_tokens": self.memory_plan.kv_capacity_tokens,
            "prefix_cache_queries": s.prefix_cache_queries, "prefix_cache_hits": s.prefix_cache_hits,
            "num_preemptions": s.num_preemptions, "num_state_snapshots": s.num_state_snapshots,
            "prompt_tokens_total": self._counters["prompt_tokens_total"],
            "generation_tokens_total": self._counters["generation_tokens_total"],
            "request_success_total": dict(self._finish_reasons),
            "num_steps": self._counters["num_steps"],
            "num_grammar_matchers": self._grammars.num_live if self._grammars is not None else 0,
            **spec_stats(self._counters, self.config.num_speculative_tokens),
        }

    def check_integrity(self) -> None:
        """AssertionError unless the scheduler's blocks/slots/queues are consistent (tests)."""
        self.scheduler.check_integrity()

    def close(self) -> None:
        """Abort everything and drop the model and caches (frees GPU memory once unreferenced)."""
        self.abort(list(self._requests))
        self._requests.clear()
        self._touched.clear()
        self.step_loop.drop()
        self.runner.close()
        self.model = None
        if self.executor is not None:   # stops every rank > 0
            self.executor.shutdown()


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def capacity_line(plan: MemoryPlan, max_num_seqs: int, graph_max_batch: int | None) -> str:
    """The start-up line of the KV capacity (tokens, whole max_model_len sequences) and the decode graphs."""
    graphs = f"batch sizes up to {graph_max_batch}" if graph_max_batch else "off (eager)"
    return (f"KV capacity: {plural(plan.kv_capacity_tokens, 'token')} = "
            f"{plural(plan.kv_capacity_tokens // plan.max_model_len, 'sequence')} of max_model_len "
            f"{plan.max_model_len} at once (max_num_seqs {max_num_seqs}); decode CUDA graphs: {graphs}")


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
            return [list(prompts)]   # one prompt of token ids
        return list(prompts)
    raise InvalidRequest(f"prompts must be a string, a list of strings, a list of token ids or a list of token-id "
                         f"lists; got {type(prompts).__name__}")
