"""What every endpoint shares: the server settings, the engine handle and the streams of one request.

:class:`ServerContext` owns the AsyncEngine, the tokenizer, the metrics and whether the engine is
still alive; it talks to the engine only through AsyncEngine's public API. :meth:`ServerContext.prepare`
validates every prompt of a request once (``AsyncEngine.prepare``) before a response starts;
:meth:`ServerContext.generate` runs the prepared prompts (a completions batch) through the engine and
yields their deltas merged in arrival order, recording metrics; leaving the loop early (a client that
went away, an error) aborts every unfinished request, so KV blocks and state slots are freed at once.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

from ..errors import CapacityExceeded, CatEngineError, EngineDead, InvalidRequest
from ..metrics import Metrics
from ..sampling import SamplingParams
from .choices import TokenTexts
from .limits import Admission, sequences_limit
from .protocol import PromptTokensDetails, UsageInfo

if TYPE_CHECKING:
    from ..request_state import PreparedRequest

log = logging.getLogger("catengine.server")


class ModelNotFound(CatEngineError):
    """The request names a model this server does not serve (HTTP 404)."""


class ShuttingDown(EngineDead):
    """The server stopped this request at its shutdown deadline (HTTP 503 / a final SSE error event)."""


@dataclass(frozen=True)
class ServerConfig:
    served_model_names: tuple[str, ...]
    api_key: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_request_bytes: int = 32 << 20
    max_sequences_per_request: int | None = None   # None: limits.sequences_limit's default
    max_waiting_requests: int | None = None        # None: unbounded
    body_timeout: float | None = 30.0              # seconds for a request body to arrive in full
    # CORS is opt-in (--allowed-origins): with none, browsers get no CORS headers
    cors_origins: tuple[str, ...] = ()
    cors_methods: tuple[str, ...] = ("*",)
    cors_headers: tuple[str, ...] = ("*",)
    cors_credentials: bool = False
    # vLLM's API-shaping flags (catengine/cli/serve_flags.py)
    response_role: str = "assistant"
    default_chat_template_kwargs: dict[str, Any] | None = None
    enable_prompt_tokens_details: bool = False
    return_tokens_as_token_ids: bool = False
    generation_config: dict[str, Any] | None = None   # sampling defaults; None: the model's generation_config.json
    log_requests: bool = True

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


@dataclass
class Job:
    """One prompt of a request: its engine request id, token ids and params. ``special_tokens_visible``
    keeps special tokens in the text (tool parsing needs ``<tool_call>`` even where it is special).
    ``prepared`` is the engine's validated request, set once by :meth:`ServerContext.prepare`."""
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    special_tokens_visible: bool = False
    prepared: PreparedRequest | None = None


class ServerContext:
    def __init__(self, engine: Any, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.tokenizer = engine.tokenizer
        self.metrics = Metrics(config.model_name)
        self.token_texts = TokenTexts(self.tokenizer, as_ids=config.return_tokens_as_token_ids)
        self.generation_config: dict[str, Any] = (self.tokenizer.generation_config if config.generation_config is None
                                                  else config.generation_config)
        self.dead_reason: str | None = None
        self.created = int(time.time())
        self.max_model_len: int = int(engine.config.max_model_len)
        self.vocab_size: int = int(engine.vocab_size)
        self.max_sequences = sequences_limit(config.max_sequences_per_request, engine.config.max_num_seqs)
        self.admission = Admission(config.max_waiting_requests)
        self.stopping: str | None = None   # why in-flight requests are being stopped (shutdown deadline)
        self._open_jobs: set[str] = set()  # engine request ids being generated

    async def run_blocking(self, fn, *args):
        """Templates and tokenization of long prompts take long enough to stall every stream if run on
        the event loop: they run on the engine's preparation queue, as one task of this request
        (``prep_queue.FairPrepQueue``: turns by request, a second worker under load)."""
        return await self.engine.run_on_prep_thread(fn, *args)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize a prompt on the preparation thread, after the character check that refuses text
        too long to fit the context without tokenizing it."""
        self.engine.check_prompt_chars(text)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def encode_async(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """:meth:`encode` as one task of this request on the preparation thread."""
        return await self.run_blocking(self.encode, text, add_special_tokens)

    async def decode_async(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return await self.run_blocking(self.tokenizer.decode, ids, skip_special_tokens)

    def stop_all(self, reason: str) -> int:
        """Stop every in-flight request (the shutdown deadline): each running generation ends with
        :class:`ShuttingDown` (a 503, or a final SSE error event); returns how many were aborted."""
        self.stopping = reason
        ids = list(self._open_jobs)
        for request_id in ids:
            self._abort(request_id)
        return len(ids)

    def close(self) -> None:
        """Nothing of the context's own to release: the engine owns the preparation thread and
        ``AsyncEngine.shutdown`` stops it."""

    # ------------------------------------------------------------------ engine state
    @property
    def is_dead(self) -> bool:
        if self.dead_reason is None and self.engine.is_dead:
            try:
                self.engine.check_health()
            except EngineDead as e:
                self.dead_reason = str(e)
        return self.dead_reason is not None

    def check_alive(self) -> None:
        if self.is_dead:
            raise EngineDead(f"the engine stopped ({self.dead_reason}); restart the server")

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.config.served_model_names:
            raise ModelNotFound(f"The model `{name}` does not exist; this server serves "
                                f"{', '.join(self.config.served_model_names)}")

    def engine_stats(self) -> dict[str, Any]:
        try:
            stats = self.engine.stats()
        except Exception:  # noqa: BLE001 (a scrape must not fail because the engine did)
            return {}
        if not isinstance(stats, dict):
            stats = dict(vars(stats))
        return stats

    async def prepare(self, jobs: list[Job]) -> None:
        """Everything the engine would reject, checked for every job before a response starts (so a
        streaming request still gets a plain HTTP 400, and no prompt of a batch runs when a later one
        is bad): token ids, vocabulary, KV capacity. Each job is prepared once; generation queues
        ``job.prepared`` as it is."""
        for job in jobs:
            if job.prepared is not None:
                continue
            try:
                job.prepared = await self.engine.prepare(job.prompt_ids, job.params, job.request_id,
                                                         special_tokens_visible=job.special_tokens_visible)
            except CapacityExceeded as e:
                raise InvalidRequest(str(e)) from None

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> UsageInfo:
        """The usage object; with --enable-prompt-tokens-details it counts the prompt tokens that were
        prefix-cache hits (vLLM's prompt_tokens_details.cached_tokens)."""
        details = PromptTokensDetails(cached_tokens=cached_tokens) if self.config.enable_prompt_tokens_details else None
        return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details)

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    # ------------------------------------------------------------------ generation
    async def generate(self, jobs: list[Job]) -> AsyncIterator[tuple[int, Any]]:
        """Yield ``(job_index, StreamDelta)`` for every delta of every job, in arrival order (jobs not
        yet prepared are prepared first)."""
        self.check_alive()
        await self.prepare(jobs)
        if self.stopping:
            raise ShuttingDown(self.stopping)
        start = time.perf_counter()
        open_seqs = {(k, i) for k, job in enumerate(jobs) for i in range(job.params.n)}
        last_time: dict[tuple[int, int], float] = {}
        counted_prompt: set[int] = set()
        finished_prompt: set[int] = set()
        logs = [_RequestLog(job.request_id, len(job.prompt_ids), job.params.n) for job in jobs]
        self._open_jobs.update(job.request_id for job in jobs)
        try:
            async for k, delta in self._merged(jobs):
                self.admission.started()
                if self.stopping and delta.finish_reason == "abort":
                    raise ShuttingDown(self.stopping)
                key = (k, delta.index)
                now = time.perf_counter()
                if k not in counted_prompt:   # the first delta comes after the prompt's prefill
                    counted_prompt.add(k)
                    self.metrics.count_tokens(prompt_tokens=len(jobs[k].prompt_ids))
                    logs[k].first_token = now - start
                    logs[k].cached = delta.num_cached_tokens
                logs[k].output[delta.index] = delta.num_output_tokens
                if delta.token_ids:
                    self.metrics.count_tokens(generation_tokens=len(delta.token_ids))
                    if key not in last_time:
                        self.metrics.observe_first_token(now - start)
                    else:
                        self.metrics.observe_token_gap(now - last_time[key], len(delta.token_ids))
                    last_time[key] = now
                if delta.finished:
                    open_seqs.discard(key)
                    prompt = 0 if k in finished_prompt else len(jobs[k].prompt_ids)
                    finished_prompt.add(k)
                    self.metrics.observe_finished(delta.finish_reason, prompt, delta.num_output_tokens, now - start)
                    logs[k].finish(delta.index, delta.finish_reason, delta.num_output_tokens)
                    if logs[k].done:
                        self._log_request(logs[k], now - start)
                yield k, delta
        except EngineDead as e:
            self.dead_reason = self.dead_reason or str(e)
            raise
        finally:
            self.admission.started()
            self._open_jobs.difference_update(job.request_id for job in jobs)
            aborted = {k for k, _ in open_seqs}
            for k in aborted:
                self._abort(jobs[k].request_id)
            now = time.perf_counter()
            # request_success_total counts requests: one abort per unfinished prompt, not per sequence
            for _ in aborted:
                self.metrics.observe_finished("abort", 0, 0, now - start)
            for k, i in open_seqs:
                logs[k].finish(i, "abort", None)
            for k in aborted:
                self._log_request(logs[k], now - start)

    def _log_request(self, entry: "_RequestLog", e2e: float) -> None:
        if self.config.log_requests:
            log.info("%s", entry.line(e2e))

    def _abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:  # noqa: BLE001 (aborting a request the engine already dropped is fine)
            log.debug("abort of %s failed", request_id, exc_info=True)

    def _stream(self, job: Job):
        return self.engine.stream_prepared(job.prepared)

    async def _merged(self, jobs: list[Job]) -> AsyncIterator[tuple[int, Any]]:
        if len(jobs) == 1:
            job = jobs[0]
            stream = self._stream(job)
            try:
                async for delta in stream:
                    yield 0, delta
            finally:
                await _aclose(stream)
            return
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(k: int, job: Job) -> None:
            stream = self._stream(job)
            try:
                async for delta in stream:
                    queue.put_nowait((k, delta))
                queue.put_nowait((k, done))
            except Exception as e:  # noqa: BLE001 (re-raised in the consumer)
                queue.put_nowait((k, e))
            finally:
                await _aclose(stream)

        tasks = [asyncio.create_task(pump(k, job)) for k, job in enumerate(jobs)]
        try:
            remaining = len(tasks)
            while remaining:
                k, item = await queue.get()
                if item is done:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield k, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _aclose(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001
            log.debug("closing an engine stream failed", exc_info=True)


class _RequestLog:
    """What the one INFO line of a finished request says (--disable-log-requests turns it off)."""

    def __init__(self, request_id: str, prompt_tokens: int, n: int):
        self.request_id, self.prompt_tokens = request_id, prompt_tokens
        self.first_token: float | None = None
        self.cached = 0
        self.output = [0] * n
        self.reasons: list[str | None] = [None] * n

    def finish(self, index: int, reason: str | None, output_tokens: int | None) -> None:
        self.reasons[index] = reason
        if output_tokens is not None:
            self.output[index] = output_tokens

    @property
    def done(self) -> bool:
        return all(r is not None for r in self.reasons)

    def line(self, e2e: float) -> str:
        out = sum(self.output)
        ttft = "-" if self.first_token is None else f"{self.first_token:.3f}s"
        decode = e2e - (self.first_token or 0.0)
        # decode speed: the tokens after each completion's first, over the time after the first token
        rate = f"{(out - len(self.output)) / decode:.1f}" if out > len(self.output) and decode > 0 else "-"
        reasons = ",".join(sorted({r or "abort" for r in self.reasons}))
        return (f"request {self.request_id}: prompt {self.prompt_tokens} tokens ({self.cached} cached), output "
                f"{out} tokens, TTFT {ttft}, e2e {e2e:.3f}s, {rate} tok/s, finish {reasons}")


def check_token_ids(ids: list[Any], vocab_size: int, what: str) -> list[int]:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise InvalidRequest(f"{what} must hold token ids in [0, {vocab_size - 1}], got {t!r}")
    return list(ids)
