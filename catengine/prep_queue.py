"""The preparation threads' queue: tasks served round-robin by owner, on one worker or two.

Request preparation (chat templates, tokenization, ``Engine.prepare_request``) runs off the event loop.
With a plain FIFO executor one request that submits a thousand prompts, or one enormous prompt, holds
the thread while every later request waits behind all of its work. Here every task carries an owner
(the HTTP request it belongs to, from the :data:`prep_owner` context variable; a task without one is
its own owner), each owner has its own FIFO, and a worker takes one task from each waiting owner in
turn, never two tasks of one owner at once. A request that is alone runs its tasks back to back; a
small request that arrives behind a large one waits for at most one task of each other waiting owner,
each task bounded by the request limits (one prompt's tokenization, capped by the character check).

A single task can still be long (tens of MB of text within a 256k context's character bound), so
when a task has waited :data:`GROW_AFTER` seconds while every worker is busy, a second worker starts
(``max_workers``, default 2), once for the life of the queue,
first running ``worker_init`` (the engine gives it its own tokenizer copy: fast tokenizers are not
safe to share between threads, and they release the GIL while encoding, so the two run in parallel).
"""
from __future__ import annotations

import collections
import contextvars
import itertools
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Hashable

log = logging.getLogger("catengine")

# How long a task may wait with every worker busy before a second worker starts. Its start costs a
# tokenizer copy (seconds, mostly holding the GIL), worth paying only for a really long task, not for
# the ordinary turn of a busy worker.
GROW_AFTER = 0.5

# The owner of the preparation tasks submitted from this context (the server sets one per request).
prep_owner: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("catengine_prep_owner", default=None)


class FairPrepQueue:
    def __init__(self, name: str = "catengine-prep", max_workers: int = 2,
                 worker_init: Callable[[], None] | None = None):
        self._cond = threading.Condition()
        self._queues: collections.OrderedDict[Hashable, collections.deque] = collections.OrderedDict()
        self._anonymous = itertools.count()
        self._closed = False
        self._busy: set[Hashable] = set()    # owners with a task running
        self._name, self._max_workers, self._worker_init = name, max_workers, worker_init
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._grow_timer: threading.Timer | None = None
        self._start_worker(None)

    def _start_worker(self, init: Callable[[], None] | None) -> None:
        thread = threading.Thread(target=self._work, args=(init,), name=f"{self._name}-{len(self._workers)}",
                                  daemon=True)
        self._workers.append(thread)
        thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, owner: Hashable | None = None) -> Future:
        """Queue ``fn(*args)`` for ``owner`` (default: the :data:`prep_owner` of the caller's context)."""
        if owner is None:
            owner = prep_owner.get()
        if owner is None:
            owner = ("anonymous", next(self._anonymous))
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the preparation queue is shut down")
            self._queues.setdefault(owner, collections.deque()).append((future, fn, args))
            if self._idle == 0 and len(self._workers) < self._max_workers and self._grow_timer is None:
                self._grow_timer = threading.Timer(GROW_AFTER, self._maybe_grow)
                self._grow_timer.daemon = True
                self._grow_timer.start()
            self._cond.notify_all()
        return future

    def _maybe_grow(self) -> None:
        """A task has waited GROW_AFTER seconds with every worker busy: start another worker."""
        with self._cond:
            self._grow_timer = None
            if (not self._closed and self._idle == 0 and len(self._workers) < self._max_workers
                    and self._ready_owner() is not None):
                self._start_worker(self._worker_init)

    def stats(self) -> dict[str, int]:
        """``prep_tasks_waiting`` (queued, not started), ``prep_owners_waiting`` (requests with queued
        tasks) and ``prep_tasks_running`` (0 or 1)."""
        with self._cond:
            return {"prep_tasks_waiting": sum(len(q) for q in self._queues.values()),
                    "prep_owners_waiting": len(self._queues), "prep_tasks_running": len(self._busy),
                    "prep_workers": len(self._workers)}

    def _ready_owner(self):
        for owner in self._queues:
            if owner not in self._busy:
                return owner
        return None

    def _next(self):
        with self._cond:
            self._idle += 1
            try:
                while not self._closed and self._ready_owner() is None:
                    self._cond.wait()
            finally:
                self._idle -= 1
            if self._closed:
                return None
            owner = self._ready_owner()
            queue = self._queues.pop(owner)
            task = queue.popleft()
            if queue:   # back of the line: every other waiting owner goes first
                self._queues[owner] = queue
            self._busy.add(owner)
            return owner, task

    def _work(self, init: Callable[[], None] | None) -> None:
        if init is not None:
            try:
                init()
            except Exception:  # noqa: BLE001 (the first worker still serves every task)
                log.exception("a second preparation worker could not start")
                return
        while True:
            picked = self._next()
            if picked is None:
                return
            owner, (future, fn, args) = picked
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 (handed to the waiter, which re-raises it)
                    future.set_exception(e)
            with self._cond:
                self._busy.discard(owner)
                self._cond.notify_all()

    def shutdown(self) -> None:
        """Stop the workers after the tasks they are running; queued tasks are cancelled."""
        with self._cond:
            self._closed = True
            pending = [task for queue in self._queues.values() for task in queue]
            self._queues.clear()
            self._cond.notify_all()
        for future, _, _ in pending:
            future.cancel()
