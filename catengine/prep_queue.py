"""The preparation thread's queue: one worker, tasks served round-robin by owner.

Tokenizers are not safe to call from two threads at once, so request preparation (chat templates,
tokenization, ``Engine.prepare_request``) runs on one thread. With a plain FIFO executor one request
that submits a thousand prompts, or one enormous prompt, holds that thread while every later request
waits behind all of its work. Here every task carries an owner (the HTTP request it belongs to, from
the :data:`prep_owner` context variable; a task without one is its own owner), each owner has its own
FIFO, and the worker takes one task from each waiting owner in turn. A request that is alone runs its
tasks back to back; a small request that arrives behind a large one waits for at most one task of each
other waiting owner, and each task is bounded by the request limits (one prompt's tokenization, capped
by the character check), not by the size of the whole request.
"""
from __future__ import annotations

import collections
import contextvars
import itertools
import threading
from concurrent.futures import Future
from typing import Any, Callable, Hashable

# The owner of the preparation tasks submitted from this context (the server sets one per request).
prep_owner: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar("catengine_prep_owner", default=None)


class FairPrepQueue:
    def __init__(self, name: str = "catengine-prep"):
        self._cond = threading.Condition()
        self._queues: collections.OrderedDict[Hashable, collections.deque] = collections.OrderedDict()
        self._anonymous = itertools.count()
        self._closed = False
        self._running = 0
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

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
            self._cond.notify()
        return future

    def stats(self) -> dict[str, int]:
        """``prep_tasks_waiting`` (queued, not started), ``prep_owners_waiting`` (requests with queued
        tasks) and ``prep_tasks_running`` (0 or 1)."""
        with self._cond:
            return {"prep_tasks_waiting": sum(len(q) for q in self._queues.values()),
                    "prep_owners_waiting": len(self._queues), "prep_tasks_running": self._running}

    def _next(self):
        with self._cond:
            while not self._queues and not self._closed:
                self._cond.wait()
            if not self._queues:
                return None
            owner, queue = self._queues.popitem(last=False)
            task = queue.popleft()
            if queue:   # back of the line: every other waiting owner goes first
                self._queues[owner] = queue
            self._running = 1
            return task

    def _work(self) -> None:
        while True:
            task = self._next()
            if task is None:
                return
            future, fn, args = task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # noqa: BLE001 (handed to the waiter, which re-raises it)
                    future.set_exception(e)
            with self._cond:
                self._running = 0

    def shutdown(self) -> None:
        """Stop the worker after the task it is running; queued tasks are cancelled."""
        with self._cond:
            self._closed = True
            pending = [task for queue in self._queues.values() for task in queue]
            self._queues.clear()
            self._cond.notify_all()
        for future, _, _ in pending:
            future.cancel()
