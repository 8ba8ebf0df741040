"""The HTTP server around the app: uvicorn with connection timeouts and a shutdown deadline.

uvicorn alone keeps a connection that never sends a request, or sends its headers a byte at a time,
open forever (its keep-alive timer only runs between requests), and on SIGTERM it waits for every
stream to end, however long, then re-raises the signal (the process dies of it, not exit 0).
Here:

- :class:`GuardedH11Protocol`: a connection must deliver a request's headers within
  ``header_timeout`` seconds of opening (or of the previous response), else it is closed. The body
  has its own deadline in ``http_guard.BodyGuard`` (408); idle keep-alive connections close after
  ``timeout_keep_alive``; past ``limit_concurrency`` connections or tasks uvicorn answers 503.
- :class:`GracefulServer`: on SIGTERM/SIGINT it stops accepting, lets in-flight requests run for
  ``shutdown_timeout`` seconds, then stops them (``ServerContext.stop_all``: each stream gets a
  final error event and ``[DONE]``, each non-streamed request a 503), waits for the responses to go
  out, and returns normally, so ``catengine serve`` exits 0. A second SIGINT still forces the exit.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from dataclasses import dataclass

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("catengine.server")

# After the deadline, how long the stopped requests get to send their last event before uvicorn
# cancels whatever is left.
FINAL_EVENT_GRACE = 5.0


@dataclass(frozen=True)
class HttpSettings:
    """Connection limits of ``catengine serve`` (defaults meant for a server others can reach)."""
    timeout_keep_alive: float = 5.0        # idle keep-alive connection (vLLM's 5 s)
    header_timeout: float | None = 10.0    # request line + headers
    limit_concurrency: int | None = 1024   # connections or requests at once; more get 503
    shutdown_timeout: float | None = 20.0  # in-flight requests after SIGTERM (None: wait for them)
    access_log: bool = True                # uvicorn's access log, as in vLLM


class GuardedH11Protocol(H11Protocol):
    """h11 with a deadline for each request's headers (slow-loris, idle fresh connections)."""
    header_timeout: float | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = None
        if self.header_timeout is not None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        # IDLE: no complete request line + headers yet (a request in progress is SEND_BODY or DONE)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closing a connection from %s: no request headers within %g s",
                     "%s:%d" % self.client if self.client else "?", self.header_timeout)
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()   # the next request on this connection gets its own deadline

    def connection_lost(self, exc) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


def protocol_class(header_timeout: float | None) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout": header_timeout})


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ctx, shutdown_timeout: float | None):
        super().__init__(config)
        self.ctx = ctx
        self.shutdown_timeout = shutdown_timeout

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's, without re-raising the signal afterwards: a server stopped by SIGTERM has shut
        down as asked and exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def _deadline(self) -> None:
        n = self.ctx.stop_all(f"the server is shutting down (--shutdown-timeout {self.shutdown_timeout:g} s "
                              "passed); retry the request")
        log.warning("shutdown deadline of %g s passed: stopping %d in-flight request(s)", self.shutdown_timeout, n)

    async def shutdown(self, sockets=None) -> None:
        timer = None
        if self.shutdown_timeout is not None:
            timer = asyncio.get_running_loop().call_later(self.shutdown_timeout, self._deadline)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()


def build_server(app, ctx, host: str, port: int, settings: HttpSettings, log_level: str = "info",
                 ssl: dict | None = None) -> GracefulServer:
    """``ssl``: uvicorn's ssl_* keywords (``serve_flags.check_ssl``), None for plain HTTP."""
    backstop = None if settings.shutdown_timeout is None else settings.shutdown_timeout + FINAL_EVENT_GRACE
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=settings.access_log,
                            http=protocol_class(settings.header_timeout),
                            timeout_keep_alive=settings.timeout_keep_alive,
                            limit_concurrency=settings.limit_concurrency, timeout_graceful_shutdown=backstop,
                            **(ssl or {}))
    return GracefulServer(config, ctx, settings.shutdown_timeout)
