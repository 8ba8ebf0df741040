"""Serving benchmark: concurrent streaming load against a running OpenAI-compatible server.

Like ``vllm bench serve``: requests arrive at ``--request-rate`` per second (Poisson arrivals, or all
at once with ``inf``), at most ``--max-concurrency`` in flight; each streams its answer and we record
time to first token (TTFT), time per output token after the first (TPOT), the gaps between streamed
chunks (ITL) and end-to-end latency (E2EL). Token counts come from the server's ``usage`` (the
``include_usage`` chunk), so they are exact.

Prompts are random token ids sent to ``/v1/completions`` (exact input lengths, no tokenizer needed
here), or random words sent to ``/v1/chat/completions`` with ``--endpoint chat``. ``ignore_eos`` is
set so every request produces its output length. Standard library plus httpx only.

    python bench/bench_serving.py --base-url http://127.0.0.1:8000 --num-prompts 200 \\
        --random-input-len 1024 --random-output-len 128 --max-concurrency 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def make_prompts(args) -> list[tuple[object, int, int]]:
    """(prompt, input_len, output_len) per request; lengths vary in [len*(1-r), len*(1+r)]."""
    rng = random.Random(args.seed)
    words = ("the of and to in is that for it as with was on be by at this from or an are not "
             "which have one had but all were when we there can more if will out so up said").split()
    out = []
    for _ in range(args.num_prompts):
        r = args.random_range_ratio
        n_in = max(1, rng.randint(int(args.random_input_len * (1 - r)), int(args.random_input_len * (1 + r))))
        n_out = max(1, rng.randint(int(args.random_output_len * (1 - r)), int(args.random_output_len * (1 + r))))
        if args.endpoint == "completions":
            prompt = [rng.randrange(args.token_id_low, args.token_id_high) for _ in range(n_in)]
        else:
            prompt = " ".join(rng.choice(words) for _ in range(n_in))
        out.append((prompt, n_in, n_out))
    return out


async def one_request(client: httpx.AsyncClient, args, model: str, prompt, n_out: int) -> RequestResult:
    res = RequestResult()
    body = {"model": model, "max_tokens": n_out, "stream": True, "temperature": args.temperature,
            "ignore_eos": args.ignore_eos, "stream_options": {"include_usage": True}}
    if args.endpoint == "completions":
        url, body["prompt"] = "/v1/completions", prompt
    else:
        url, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        body["chat_template_kwargs"] = {"enable_thinking": False}
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message"))
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    delta = choice.get("text") if "text" in choice else (choice.get("delta") or {})
                    has_text = bool(delta) if isinstance(delta, str) else bool(
                        delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
                    if not has_text:
                        continue
                    now = time.perf_counter()
                    if res.ttft == 0.0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2el = time.perf_counter() - start
        res.ok = res.ttft > 0.0
        if not res.ok:
            res.error = "no tokens streamed"
    except (httpx.HTTPError, ValueError, KeyError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=httpx.Timeout(None),
                                 limits=limits) as client:
        model = args.model
        if model is None:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
        prompts = make_prompts(args)
        sem = asyncio.Semaphore(args.max_concurrency or len(prompts) or 1)
        rng = random.Random(args.seed + 1)

        async def limited(p, n_out):
            async with sem:
                return await one_request(client, args, model, p, n_out)

        if args.warmup:
            await one_request(client, args, model, prompts[0][0], 4)
        start = time.perf_counter()
        tasks = []
        for prompt, _, n_out in prompts:
            tasks.append(asyncio.create_task(limited(prompt, n_out)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(args, model, results, duration)


def summarize(args, model: str, results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    e2el = [r.e2el for r in ok]
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    summary = {
        "model": model, "endpoint": args.endpoint, "num_prompts": len(results), "successful_requests": len(ok),
        "failed_requests": len(results) - len(ok), "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency, "duration_s": duration,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        summary[f"mean_{name}_ms"] = statistics.fmean(values) * 1000 if values else 0.0
        summary[f"median_{name}_ms"] = percentile(values, 50) * 1000
        for p in args.percentiles:
            summary[f"p{p:g}_{name}_ms"] = percentile(values, p) * 1000
    return summary


def print_summary(s: dict, percentiles: list[float]) -> None:
    line = lambda k, v: print(f"{k:<40}{v}")  # noqa: E731
    print("{s:{c}^60}".format(s=" Serving Benchmark Result ", c="="))
    line("Successful requests:", s["successful_requests"])
    line("Failed requests:", s["failed_requests"])
    line("Benchmark duration (s):", f"{s['duration_s']:.2f}")
    line("Total input tokens:", s["total_input_tokens"])
    line("Total generated tokens:", s["total_output_tokens"])
    line("Request throughput (req/s):", f"{s['request_throughput']:.2f}")
    line("Output token throughput (tok/s):", f"{s['output_throughput']:.2f}")
    line("Total token throughput (tok/s):", f"{s['total_token_throughput']:.2f}")
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        print("{s:{c}^60}".format(s=f" {title} ", c="-"))
        line(f"Mean {name.upper()} (ms):", f"{s[f'mean_{name}_ms']:.2f}")
        line(f"Median {name.upper()} (ms):", f"{s[f'median_{name}_ms']:.2f}")
        for p in percentiles:
            line(f"P{p:g} {name.upper()} (ms):", f"{s[f'p{p:g}_{name}_ms']:.2f}")
    print("=" * 60)
    if s["errors"]:
        print("errors:", *s["errors"], sep="\n  ", file=sys.stderr)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second, Poisson arrivals (inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--token-id-low", type=int, default=1000, help="random prompt token ids are drawn from "
                   "[low, high): ordinary vocabulary, no special tokens")
    p.add_argument("--token-id-high", type=int, default=100000)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--percentiles", type=float, nargs="+", default=[90.0, 99.0])
    p.add_argument("--result-json", default=None, help="also write the summary to this JSON file")
    args = p.parse_args(argv)
    if args.base_url is None:
        args.base_url = f"http://{args.host}:{args.port}"
    if args.num_prompts < 1 or args.request_rate <= 0:
        p.error("--num-prompts must be >= 1 and --request-rate > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    print_summary(summary, args.percentiles)
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "api_key"}, **summary}, f, indent=2,
                      default=str)
    return 0 if summary["successful_requests"] == summary["num_prompts"] else 1


if __name__ == "__main__":
    sys.exit(main())
