"""Per-request limits and load shedding: what one request may ask for, and how many may wait.

- :func:`check_sequences`: prompts x ``n`` of one request at most ``max_sequences_per_request``
  (default ``4 * max_num_seqs``, at least :data:`MIN_SEQUENCES`): a completions batch of 1,024
  prompts with n=128 is 131,072 sequences, which pins the engine for minutes; it gets a 400 that
  names the limit and the flag that raises it.
- :class:`Admission`: with ``--max-waiting-requests N``, at most N requests may be waiting at once:
  accepted but without their first output yet (planning, preparation, the engine's queue, the
  prefill). Past it the server answers 429 at once instead of queuing without bound. A request
  holds a :class:`Ticket` from admission until its first delta or its end, whichever is first; the
  ticket travels in a context variable, so the generation code (``ServerContext.generate``) that
  sees the first delta needs no extra argument.
"""
from __future__ import annotations

import contextvars

from ..errors import CatEngineError, InvalidRequest

MIN_SEQUENCES = 128   # OpenAI's most n: one prompt at the largest n is always accepted


class Overloaded(CatEngineError):
    """Too many requests are waiting (HTTP 429); the client should retry later."""


def sequences_limit(configured: int | None, max_num_seqs: int) -> int:
    return configured if configured is not None else max(4 * int(max_num_seqs), MIN_SEQUENCES)


def check_sequences(num_prompts: int, n: int, limit: int) -> None:
    if num_prompts * n > limit:
        raise InvalidRequest(f"this request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} sequences; "
                             f"at most {limit} are accepted per request (--max-sequences-per-request); send fewer "
                             "prompts or a smaller n, or split the batch into several requests")


class Ticket:
    __slots__ = ("_admission", "_held")

    def __init__(self, admission: "Admission"):
        self._admission = admission
        self._held = True

    def release(self) -> None:
        """The request stopped waiting (first delta, or its end); idempotent."""
        if self._held:
            self._held = False
            self._admission.waiting -= 1


_ticket: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("catengine_admission", default=None)


class Admission:
    """Counts waiting requests on the event loop thread (no lock: every change happens there)."""

    def __init__(self, max_waiting: int | None):
        self.max_waiting = max_waiting
        self.waiting = 0

    def admit(self) -> Ticket:
        """A ticket for this request, set as the context's; Overloaded past ``max_waiting``."""
        if self.max_waiting is not None and self.waiting >= self.max_waiting:
            raise Overloaded(f"{self.waiting} requests are already waiting (--max-waiting-requests "
                             f"{self.max_waiting}); retry later")
        self.waiting += 1
        ticket = Ticket(self)
        _ticket.set(ticket)
        return ticket

    @staticmethod
    def started() -> None:
        """The current request produced its first output: it no longer counts as waiting."""
        ticket = _ticket.get()
        if ticket is not None:
            ticket.release()
