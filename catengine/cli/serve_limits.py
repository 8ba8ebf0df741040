"""``catengine serve`` flags that bound what clients can make the server do: connection timeouts,
concurrency, queue length, request size, shutdown deadline, CORS, the access log.

Names follow vLLM where it has the setting (``--allowed-origins``, ``--shutdown-timeout``,
``--disable-uvicorn-access-log``) and uvicorn otherwise (``--timeout-keep-alive``,
``--limit-concurrency``). The defaults are for a server other machines can reach: every timeout on,
CORS off until origins are named.
"""
from __future__ import annotations

import argparse
import json

from ..server.http_server import HttpSettings


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; give a number in 1-65535")
    return value


def _seconds(text: str) -> float | None:
    """Seconds > 0, or 0 / 'none' for no limit."""
    if text.strip().lower() in ("0", "none", "off"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 30, or 0 for no limit")
    return value


def _keep_alive(text: str) -> float:
    value = _seconds(text)
    if value is None:
        raise argparse.ArgumentTypeError("--timeout-keep-alive needs a number of seconds > 0 (an idle connection "
                                         "must close some time)")
    return value


def _positive(text: str) -> int | None:
    """An integer > 0, or 0 / 'none' for no limit."""
    if text.strip().lower() in ("0", "none", "off"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer; give e.g. 100, or 0 for no limit")
    return value


def json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of strings, e.g. '[\"https://ui.example\"]'")
    return value


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    d = HttpSettings()
    p.add_argument("--timeout-keep-alive", type=_keep_alive, default=d.timeout_keep_alive,
                   help=f"close an idle keep-alive connection after this many seconds ({d.timeout_keep_alive:g})")
    p.add_argument("--header-timeout", type=_seconds, default=d.header_timeout,
                   help=f"seconds a connection has to send a request's headers ({d.header_timeout:g}; 0: no limit)")
    p.add_argument("--body-timeout", type=_seconds, default=30.0,
                   help="seconds a request body has to arrive in full, else 408 (30; 0: no limit)")
    p.add_argument("--limit-concurrency", type=_positive, default=d.limit_concurrency,
                   help=f"most connections or requests at once; more get 503 ({d.limit_concurrency}; 0: no limit)")
    p.add_argument("--max-waiting-requests", type=_positive, default=None,
                   help="most requests waiting for their first token; more get 429 (default: no limit)")
    p.add_argument("--max-sequences-per-request", type=_positive, default=None,
                   help="most prompts x n in one request; more get 400 (default: 4 x max-num-seqs, at least 128)")
    p.add_argument("--max-request-bytes", type=_positive, default=32 << 20,
                   help="largest request body in bytes; larger get 413 (32 MiB)")
    p.add_argument("--shutdown-timeout", type=_seconds, default=d.shutdown_timeout,
                   help=f"seconds in-flight requests may run after SIGTERM before they are stopped with a final "
                        f"event ({d.shutdown_timeout:g}; 0: wait for them)")
    p.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access log line per request")
    p.add_argument("--allowed-origins", type=json_list, default=[],
                   help='CORS origins, JSON list (default none: CORS off; \'["*"]\' for any site)')
    p.add_argument("--allowed-methods", type=json_list, default=["*"], help="CORS methods, JSON list")
    p.add_argument("--allowed-headers", type=json_list, default=["*"], help="CORS headers, JSON list")
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")


def http_settings(args: argparse.Namespace) -> HttpSettings:
    return HttpSettings(timeout_keep_alive=args.timeout_keep_alive, header_timeout=args.header_timeout,
                        limit_concurrency=args.limit_concurrency, shutdown_timeout=args.shutdown_timeout,
                        access_log=not args.disable_uvicorn_access_log)


def limit_config(args: argparse.Namespace) -> dict:
    """The ServerConfig fields of these flags."""
    return dict(max_request_bytes=args.max_request_bytes, max_sequences_per_request=args.max_sequences_per_request,
                max_waiting_requests=args.max_waiting_requests, body_timeout=args.body_timeout,
                cors_origins=tuple(args.allowed_origins), cors_methods=tuple(args.allowed_methods),
                cors_headers=tuple(args.allowed_headers), cors_credentials=args.allow_credentials)
