"""Server-sent events: ``data: <json>\\n\\n`` frames, the error event and ``[DONE]``."""
from __future__ import annotations

import logging
from typing import Any

from ..errors import CatEngineError, EngineDead, InvalidRequest
from .protocol import encode, error_body

log = logging.getLogger("catengine.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> bytes:
    return b"data: " + encode(obj) + b"\n\n"


def sse_done() -> bytes:
    return b"data: [DONE]\n\n"


def error_status(e: BaseException) -> int:
    if isinstance(e, InvalidRequest):
        return 400
    if isinstance(e, EngineDead):
        return 503
    return 500


def sse_error(e: BaseException) -> bytes:
    """An error after the stream started: the OpenAI error object as one event."""
    status = error_status(e)
    if status == 500:
        log.exception("request failed after its stream started", exc_info=e)
    message = str(e) if isinstance(e, CatEngineError) else f"internal error: {type(e).__name__}: {e}"
    return b"data: " + error_body(status, message) + b"\n\n"
