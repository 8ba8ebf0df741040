"""ASGI middleware in front of the API routes: what a request body must be before any endpoint reads it.

For every ``POST`` (the API takes JSON bodies only), :class:`BodyGuard` reads the whole body itself
and hands the endpoint a replay of it, so that every rule below is enforced in one place, before JSON
decoding:

- ``Content-Type`` must be ``application/json`` (parameters such as ``charset`` allowed): 415
  otherwise. Browsers send ``text/plain``, form and multipart bodies cross-origin without a CORS
  preflight; refusing them means a web page cannot drive the server behind a user's back.
- A body larger than ``max_request_bytes`` (by ``Content-Length``, or counted while it arrives): 413.
- A body that has not arrived in full ``body_timeout`` seconds after the headers (a client that
  stalls, or sends less than its ``Content-Length``): 408. Both close the connection.
- A client that disconnects during the upload: nothing was queued, so nothing is aborted; one INFO
  line and no response (nobody is there to read it), instead of an exception and a 500 attempt.

For every path, one trailing slash is dropped (``/v1/models/`` is served as ``/v1/models``) rather
than answered with Starlette's 307, whose absolute ``Location`` is built from the client's ``Host``
header.
"""
from __future__ import annotations

import asyncio
import logging
import time

from .protocol import error_body

log = logging.getLogger("catengine.server")

JSON_TYPE = b"application/json"
# POST routes that read no body (vLLM's POST /ping is a health probe sent without one)
BODYLESS_POSTS = frozenset({"/ping"})


def _media_type(value: bytes) -> bytes:
    return value.split(b";", 1)[0].strip().lower()


async def _respond(send, status: int, message: str) -> None:
    body = error_body(status, message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyGuard:
    def __init__(self, app, max_request_bytes: int, body_timeout: float | None):
        self.app = app
        self.limit = max_request_bytes
        self.timeout = body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if len(path) > 1 and path.endswith("/"):
            scope = dict(scope, path=path.rstrip("/") or "/")
            raw = scope.get("raw_path")
            if raw:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        if scope.get("method") != "POST" or scope["path"] in BODYLESS_POSTS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        content_type = _media_type(headers.get(b"content-type", b""))
        if content_type != JSON_TYPE:
            shown = content_type.decode("latin-1") or "none"
            await _respond(send, 415, f"Content-Type must be application/json (got {shown}); send the request "
                                      "as JSON with 'Content-Type: application/json'")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _respond(send, 413, f"the request body ({int(declared)} bytes) is larger than {self.limit} bytes; "
                                      "send a smaller request")
            return
        body = await self._read(scope, receive, send)
        if body is None:
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()   # after the body: the disconnect the endpoint may wait for

        await self.app(scope, replay, send)

    async def _read(self, scope, receive, send) -> bytes | None:
        """The whole body, or None once a response (413, 408) was sent or the client left."""
        body = bytearray()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                message = await asyncio.wait_for(receive(), left)
            except (asyncio.TimeoutError, TimeoutError):
                log.info("%s %s: the request body did not arrive within %.0f s (%d bytes received); answered 408",
                         scope["method"], scope["path"], self.timeout, len(body))
                await _respond(send, 408, f"the request body did not arrive within {self.timeout:g} s; send the "
                                          "whole body (as many bytes as Content-Length says)")
                return None
            if message["type"] == "http.disconnect":
                log.info("%s %s: the client disconnected during the upload (%d bytes received); nothing to abort",
                         scope["method"], scope["path"], len(body))
                return None
            body += message.get("body", b"")
            if len(body) > self.limit:
                await _respond(send, 413, f"the request body is larger than {self.limit} bytes; send a smaller "
                                          "request")
                return None
            if not message.get("more_body", False):
                return bytes(body)
