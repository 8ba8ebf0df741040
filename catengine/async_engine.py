"""AsyncEngine: an Engine driven by a background thread, with asyncio streams.

    engine = AsyncEngine(model=None)                     # same keywords as Engine
    async for delta in engine.stream("Hello", SamplingParams(max_tokens=16), request_id="r1"):
        print(delta.text, end="")

    prepared = await engine.prepare("Hello", params)     # or in two phases: validate first (raises here) ...
    async for delta in engine.stream_prepared(prepared):  # ... then run it, without preparing again
        ...

The engine thread owns the Engine: requests reach it through a command queue, deltas come back
through each stream's asyncio queue (``loop.call_soon_threadsafe``). Tokenization and validation
(``Engine.prepare_request``) run on the preparation threads before anything is queued, so a bad
request raises at once. Those threads are the one place where request preparation runs (the server
renders its chat templates there too, through :meth:`AsyncEngine.run_on_prep_thread`): one worker,
and a second under load with its own tokenizer copy (HF fast tokenizers are not safe to share
between threads). A stream
that is abandoned (its generator closed, its task cancelled) aborts its request, which frees its
blocks and state slot. If the engine loop raises, the engine is dead: every stream and every later
call gets :class:`EngineDead`. The preparation queue serves its tasks round-robin by request
(:class:`catengine.prep_queue.FairPrepQueue`), so one request's work cannot starve another's.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Callable, TypeVar

from .engine import Engine, Prompt
from .errors import EngineDead, InvalidRequest
from .outputs import CompletionOutput, RequestOutput, StreamDelta
from .prep_queue import FairPrepQueue
from .request_state import PreparedRequest
from .sampling import SamplingParams

T = TypeVar("T")

log = logging.getLogger("catengine")


class _Stream:
    __slots__ = ("loop", "queue", "num_open")

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.num_open = n


class AsyncEngine:
    def __init__(self, model: str | None = None, *, engine: Engine | None = None, **kwargs):
        """Build an Engine from the same arguments as :class:`Engine` (or wrap ``engine``) and start
        the engine thread."""
        self.engine = engine if engine is not None else Engine(model, **kwargs)
        self._lock = threading.Lock()
        self._commands: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._dead: EngineDead | None = None
        self._stopping = False
        self._stats: dict[str, Any] = self.engine.stats()
        # a second worker, started under load, tokenizes with its own copy of the tokenizer
        self._prep = FairPrepQueue(worker_init=self.engine.tokenizer.use_private_copy)
        self._thread = threading.Thread(target=self._loop, name="catengine-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ properties
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def config(self):
        return self.engine.config

    @property
    def model_config(self):
        return self.engine.model_config

    @property
    def model_path(self) -> Path:
        """The checkpoint directory the engine loaded (the demo model's when built with model=None)."""
        return self.engine.model_path

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding: valid token ids are ``0 .. vocab_size - 1``."""
        return int(self.engine.vocab_size)

    @property
    def memory_plan(self):
        """KV blocks, capacity in tokens, state slots (see catengine.memory.MemoryPlan)."""
        return self.engine.memory_plan

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    def check_health(self) -> None:
        """Raise EngineDead when the engine loop has failed or was shut down."""
        if self._dead is not None:
            raise EngineDead(str(self._dead)) from self._dead.__cause__

    def stats(self) -> dict[str, Any]:
        """Engine.stats() as of the last step (thread-safe snapshot), plus the preparation queue's
        live figures (``FairPrepQueue.stats``)."""
        with self._lock:
            stats = dict(self._stats)
        stats.update(self._prep.stats())
        return stats

    # ------------------------------------------------------------------ requests
    def check_prompt_chars(self, text: str) -> None:
        """ContextTooLong for a text too long to fit the context, without tokenizing it
        (``Engine.check_prompt_chars``); safe from any thread."""
        self.engine.check_prompt_chars(text)

    async def run_on_prep_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the preparation thread, off the event loop: for tokenizer work of the
        caller's own (chat templates, encoding), which must not run beside request preparation.
        Tasks are served round-robin by ``prep_queue.prep_owner`` (one per server request), so one
        request's many tasks do not hold back another's."""
        return await asyncio.wrap_future(self._prep.submit(fn, *args))

    async def prepare(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None, *,
                      special_tokens_visible: bool = False, arrival_time: float | None = None) -> PreparedRequest:
        """Tokenize and validate one request (``Engine.prepare_request``, on the preparation thread)
        without queuing it. Raises InvalidRequest / ContextTooLong / CapacityExceeded, EngineDead."""
        self.check_health()
        request_id = request_id or uuid.uuid4().hex
        return await self.run_on_prep_thread(lambda: self.engine.prepare_request(
            request_id, prompt, params, arrival_time=arrival_time, special_tokens_visible=special_tokens_visible))

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None, *,
                     special_tokens_visible: bool = False, arrival_time: float | None = None
                     ) -> AsyncIterator[StreamDelta]:
        """Yield :class:`StreamDelta` s of one request until all its ``n`` completions finished
        (:meth:`prepare` then :meth:`stream_prepared`). Raises InvalidRequest / ContextTooLong /
        CapacityExceeded before the first delta when the request cannot run, EngineDead when the
        engine fails."""
        prep = await self.prepare(prompt, params, request_id, special_tokens_visible=special_tokens_visible,
                                  arrival_time=arrival_time)
        stream = self.stream_prepared(prep)
        try:
            async for delta in stream:
                yield delta
        finally:
            await stream.aclose()   # at once, so an abandoned stream aborts its request now

    async def stream_prepared(self, prep: PreparedRequest) -> AsyncIterator[StreamDelta]:
        """Queue a request made by :meth:`prepare` (not prepared again) and yield its deltas until all
        its ``n`` completions finished. Raises InvalidRequest when its id is in use, EngineDead."""
        self.check_health()
        request_id = prep.request_id
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, prep.params.n)
        with self._lock:
            if request_id in self._streams:
                raise InvalidRequest(f"request id {request_id!r} is already in use; pick a unique id")
            self._streams[request_id] = stream
        done = False
        try:
            self.check_health()   # died since the first check: its failure handler missed this stream
            self._submit(("add", prep))
            while stream.num_open:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    stream.num_open -= 1
                done = stream.num_open == 0
                yield item
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not done:
                self.abort(request_id)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
                       **kwargs) -> RequestOutput:
        """Run one request to completion and return its output (built from the stream)."""
        rid, prompt_ids, metrics, cached, prompt_lps = request_id, [], None, 0, None
        texts: dict[int, list[str]] = {}
        comps: dict[int, CompletionOutput] = {}
        async for d in self.stream(prompt, params, request_id, **kwargs):
            rid, prompt_ids, metrics, cached = d.request_id, d.prompt_token_ids, d.metrics, d.num_cached_tokens
            if d.prompt_logprobs is not None:
                prompt_lps = list(d.prompt_logprobs)
            c = comps.setdefault(d.index, CompletionOutput(d.index, "", [], logprobs=None))
            texts.setdefault(d.index, []).append(d.text)
            c.token_ids.extend(d.token_ids)
            if d.logprobs is not None:
                c.logprobs = (c.logprobs or []) + list(d.logprobs)
            c.finish_reason, c.stop_reason = d.finish_reason, d.stop_reason
        for i, c in comps.items():
            c.text = "".join(texts[i])
            if c.logprobs is not None:
                c.cumulative_logprob = sum(lp.logprob for lp in c.logprobs)
        text = prompt if isinstance(prompt, str) else None
        return RequestOutput(rid, text, list(prompt_ids), [comps[i] for i in sorted(comps)], True, metrics, cached,
                             prompt_lps)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its stream (if still read) ends with finish_reason "abort"."""
        self._submit(("abort", request_id))

    def _submit(self, command) -> None:
        self._commands.append(command)
        self._wake.set()

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        engine = self.engine
        try:
            while not self._stopping:
                self._run_commands()
                if not engine.has_unfinished():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                deltas = engine.step_deltas()
                stats = engine.stats()
                with self._lock:
                    self._stats = stats
                self._deliver(deltas)
        except BaseException as e:  # noqa: BLE001 (any failure kills the engine; waiters must hear of it)
            log.exception("engine loop failed")
            dead = EngineDead(f"the engine loop failed ({type(e).__name__}: {e}); restart the engine")
            dead.__cause__ = e
            self._fail(dead)
            return
        self._fail(EngineDead("the engine was shut down"))

    def _run_commands(self) -> None:
        while self._commands:
            kind, arg = self._commands.popleft()
            if kind == "add":
                try:
                    self.engine.add_prepared(arg)
                except Exception as e:  # noqa: BLE001 (a request-level error goes to that request only)
                    self._deliver_error(arg.request_id, e)
            else:
                self.engine.abort(arg)

    def _deliver(self, deltas: list[StreamDelta]) -> None:
        with self._lock:
            targets = [(self._streams.get(d.request_id), d) for d in deltas]
        for stream, delta in targets:
            if stream is None:
                continue   # nobody listens (abandoned stream: its abort is queued)
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, delta)
            except RuntimeError:   # the listener's event loop is closed
                self._submit(("abort", delta.request_id))

    def _deliver_error(self, request_id: str, error: BaseException) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)
            except RuntimeError:
                pass

    def _fail(self, error: EngineDead) -> None:
        with self._lock:
            self._dead = error
            streams = list(self._streams.items())
        for request_id, _ in streams:   # a fresh instance per waiter: each raise writes its own traceback
            fresh = EngineDead(str(error))
            fresh.__cause__ = error.__cause__
            self._deliver_error(request_id, fresh)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread; open streams get EngineDead("shut down")."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        self._prep.shutdown()

    def __enter__(self) -> "AsyncEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
