"""The Starlette application: routes, authentication, error mapping, disconnect handling.

Error mapping: ``InvalidRequest`` (every bad input, including a prompt that cannot fit) -> 400,
unknown model -> 404, missing/wrong API key -> 401, too many waiting requests -> 429, a dead engine
or the shutdown deadline -> 503 (bodies: 413 / 415 / 408 in ``http_guard``); anything else (a
``KernelContractError``, a ``ConfigError`` while serving: the request was valid, the server is
wrong) is a bug and answers 500 with one log line, without taking the server down. A client that
disconnects aborts its request: streaming responses are cancelled by Starlette when the connection
drops; non-streaming ones race the engine against the connection's ``http.disconnect``.
"""
from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import uuid
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .. import __version__
from ..errors import EngineDead, InvalidRequest
from ..metrics import CONTENT_TYPE
from ..prep_queue import prep_owner
from .chat import chat_full, chat_stream, plan_chat
from .completions import completion_full, completion_stream, plan_completion
from .http_guard import BodyGuard
from .limits import Overloaded
from .protocol import (ChatCompletionRequest, CompletionRequest, ModelCard, ModelList, decode_request, encode,
                       error_body)
from .serving import ModelNotFound, ServerContext
from .streaming import SSE_HEADERS
from .tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize

log = logging.getLogger("catengine.server")
JSON = "application/json"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(encode(obj), status_code=status, media_type=JSON)


def error_response(status: int, message: str, param: str | None = None) -> Response:
    return Response(error_body(status, message, param), status_code=status, media_type=JSON)


class AuthMiddleware:
    """``Authorization: Bearer <key>`` on every ``/v1/*`` request (the scheme in any case, as RFC 7235
    says), the key compared in constant time."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope.get("method") != "OPTIONS":
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = header.strip().partition(b" ")
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)):
                response = error_response(401, "Unauthorized: send the API key as 'Authorization: Bearer <key>'")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _HeldResponse(StreamingResponse):
    """A stream that keeps the request's admission ticket until the response is over, however it
    ends (its body may never be iterated when the client leaves first)."""

    def __init__(self, body, ticket, **kwargs):
        super().__init__(body, **kwargs)
        self.ticket = ticket

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.release()


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _run_unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Run ``work``; if the client disconnects first, cancel it (which aborts the engine request)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:   # this handler itself was cancelled (shutdown)
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()


def _handler(ctx: ServerContext, kind: type, plan_fn: Callable, full_fn: Callable, stream_fn: Callable):
    planned_async = inspect.iscoroutinefunction(plan_fn)

    async def endpoint(request: Request) -> Response:
        ticket = None
        try:
            ctx.check_alive()
            # the body was read and checked (type, size, time) by http_guard.BodyGuard
            req = decode_request(await request.body(), kind)
            ctx.check_model(req.model)
            ticket = ctx.admission.admit()
            prep_owner.set(uuid.uuid4().hex)   # this request's turn on the preparation thread
            plan = await plan_fn(ctx, req) if planned_async else await ctx.run_blocking(plan_fn, ctx, req)
            await ctx.prepare(plan.jobs)
            if req.stream:
                response = _HeldResponse(stream_fn(ctx, plan), ticket, media_type="text/event-stream",
                                         headers=SSE_HEADERS)
                ticket = None   # released by the response
                return response
            result = await _run_unless_disconnected(request, full_fn(ctx, plan))
            if result is None:  # the client is gone; nobody reads this
                return error_response(499, "client disconnected")
            return json_response(result)
        except InvalidRequest as e:
            return error_response(400, str(e))
        except ModelNotFound as e:
            return error_response(404, str(e), "model")
        except Overloaded as e:
            return error_response(429, str(e))
        except EngineDead as e:
            return error_response(503, str(e))
        except Exception as e:  # noqa: BLE001 (a bug, not the client's: answered here so it is logged once)
            return internal_error(request, e)
        finally:
            if ticket is not None:
                ticket.release()
    return endpoint


def _tokenizer_handler(ctx: ServerContext, kind: type, fn: Callable):
    """/tokenize, /detokenize: decode, check the model name, run ``fn`` on the preparation thread."""
    async def endpoint(request: Request) -> Response:
        try:
            req = decode_request(await request.body(), kind)   # checked by http_guard.BodyGuard
            ctx.check_model(req.model)
            return json_response(await ctx.run_blocking(fn, ctx, req))
        except InvalidRequest as e:
            return error_response(400, str(e))
        except ModelNotFound as e:
            return error_response(404, str(e), "model")
        except Exception as e:  # noqa: BLE001 (a bug: logged once, answered 500)
            return internal_error(request, e)
    return endpoint


def internal_error(request: Request, exc: BaseException) -> Response:
    log.error("internal error on %s", request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}")


def build_app(ctx: ServerContext) -> Starlette:
    def card(name: str) -> ModelCard:
        return ModelCard(id=name, created=ctx.created, root=str(ctx.engine.model_path), max_model_len=ctx.max_model_len)

    async def models(request: Request) -> Response:
        return json_response(ModelList(data=[card(name) for name in ctx.config.served_model_names]))

    async def model(request: Request) -> Response:
        """OpenAI's GET /v1/models/{model}; a served name may hold slashes (``Qwen/Qwen3.5-9B``)."""
        name = request.path_params["model_id"]
        try:
            ctx.check_model(name)
        except ModelNotFound as e:
            return error_response(404, str(e), "model")
        return json_response(card(name))

    async def health(request: Request) -> Response:
        if ctx.is_dead:
            return error_response(503, f"the engine stopped: {ctx.dead_reason}")
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(ctx.metrics.render(ctx.engine_stats()), media_type=CONTENT_TYPE)

    async def version(request: Request) -> Response:
        return json_response({"version": __version__})

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return error_response(exc.status_code, exc.detail or "error")

    async def server_error(request: Request, exc: Exception) -> Response:
        return internal_error(request, exc)

    routes = [
        Route("/v1/chat/completions", _handler(ctx, ChatCompletionRequest, plan_chat, chat_full, chat_stream),
              methods=["POST"]),
        Route("/v1/completions", _handler(ctx, CompletionRequest, plan_completion, completion_full,
                                          completion_stream), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/tokenize", _tokenizer_handler(ctx, TokenizeRequest, tokenize), methods=["POST"]),
        Route("/detokenize", _tokenizer_handler(ctx, DetokenizeRequest, detokenize), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", health, methods=["GET", "POST"]),   # vLLM's (SageMaker's) name for /health
        Route("/metrics", metrics, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.router.redirect_slashes = False   # BodyGuard strips a trailing slash instead (no Host-built Location)
    app.state.ctx = ctx
    cfg = ctx.config
    # innermost first: the body is read only for an authenticated client
    app.add_middleware(BodyGuard, max_request_bytes=cfg.max_request_bytes, body_timeout=cfg.body_timeout)
    if cfg.api_key:
        app.add_middleware(AuthMiddleware, api_key=cfg.api_key)
    if cfg.cors_origins:
        # opt-in (--allowed-origins); outermost: preflights are answered before authentication, as in vLLM
        app.add_middleware(CORSMiddleware, allow_origins=list(cfg.cors_origins),
                           allow_methods=list(cfg.cors_methods), allow_headers=list(cfg.cors_headers),
                           allow_credentials=cfg.cors_credentials)
    return app
