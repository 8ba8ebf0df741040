"""``POST /v1/completions``: a string, a list of strings, token ids or a list of token-id lists.

Every prompt of a batch runs as its own engine request with ``n`` completions; choice ``k * n + i``
is completion ``i`` of prompt ``k``. ``echo`` prepends the prompt text (the decoded ids for a
token-id prompt). Usage counts each prompt's tokens once and every completion's tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..errors import InvalidRequest
from .choices import completion_logprobs
from .protocol import (CompletionChoice, CompletionChunk, CompletionChunkChoice, CompletionRequest,
                       CompletionResponse, UsageInfo)
from .serving import Job, ServerContext, check_token_ids
from .streaming import sse, sse_done, sse_error
from .validation import build_params, check_common, check_length, check_logprobs, sampling_fields

DEFAULT_MAX_TOKENS = 16
MAX_PROMPTS = 1024


@dataclass
class CompletionPlan:
    request: CompletionRequest
    jobs: list[Job]
    echo_texts: list[str]
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n(self) -> int:
        return self.request.n


def _prompts(ctx: ServerContext, prompt: Any) -> list[tuple[str | None, list[int]]]:
    """(text or None, token ids) per prompt."""
    if isinstance(prompt, str):
        return [(prompt, ctx.tokenizer.encode(prompt))]
    if not prompt:
        raise InvalidRequest("prompt is empty; send a string, a list of strings or token ids")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [(None, check_token_ids(prompt, ctx.vocab_size, "prompt"))]
    if len(prompt) > MAX_PROMPTS:
        raise InvalidRequest(f"a completions batch may hold at most {MAX_PROMPTS} prompts, got {len(prompt)}")
    if all(isinstance(p, str) for p in prompt):
        return [(p, ctx.tokenizer.encode(p)) for p in prompt]
    if all(isinstance(p, list) for p in prompt):
        return [(None, check_token_ids(p, ctx.vocab_size, f"prompt[{k}]")) for k, p in enumerate(prompt)]
    raise InvalidRequest("prompt must be a string, a list of strings, a list of token ids or a list of token-id "
                         "lists (not a mixture)")


def plan_completion(ctx: ServerContext, req: CompletionRequest) -> CompletionPlan:
    check_common(req)
    check_logprobs(req.logprobs, "logprobs")
    if req.suffix is not None:
        raise InvalidRequest("suffix is not supported; put the whole text in prompt")
    if req.echo and req.logprobs is not None:
        raise InvalidRequest("echo together with logprobs needs prompt logprobs, which this server does not "
                             "compute yet; drop echo or logprobs")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequest(f"best_of must equal n ({req.n}) or be left out, got {req.best_of}: every "
                             "sampled sequence is returned")
    prompts = _prompts(ctx, req.prompt)
    jobs, echoes = [], []
    base_id = ctx.new_id("cmpl")
    for k, (text, ids) in enumerate(prompts):
        room = check_length(len(ids), ctx.max_model_len, req.max_tokens, "prompt")
        params = build_params(sampling_fields(req, req.logprobs), ctx.generation_config, req.max_tokens,
                              room, min(DEFAULT_MAX_TOKENS, room), ctx.vocab_size)
        jobs.append(Job(base_id if len(prompts) == 1 else f"{base_id}-{k}", ids, params))
        if req.echo:
            echoes.append(text if text is not None else ctx.tokenizer.decode(ids, skip_special_tokens=False))
        else:
            echoes.append("")
    return CompletionPlan(req, jobs, echoes)


def _usage(ctx: ServerContext, plan: CompletionPlan, tokens: list[int], cached: dict[int, int]) -> UsageInfo:
    """``cached``: prompt index -> its prefix-cache hit tokens (each prompt counted once)."""
    prompt = sum(len(j.prompt_ids) for j in plan.jobs)
    return ctx.usage(prompt, sum(tokens), sum(cached.values()))


async def completion_full(ctx: ServerContext, plan: CompletionPlan) -> CompletionResponse:
    n, total = plan.n, plan.n * len(plan.jobs)
    texts = [plan.echo_texts[c // n] for c in range(total)]
    ids: list[list[int]] = [[] for _ in range(total)]
    lps: list[list] = [[] for _ in range(total)]
    reasons: list[Any] = [None] * total
    stops: list[Any] = [None] * total
    tokens = [0] * total
    cached: dict[int, int] = {}
    async for k, d in ctx.generate(plan.jobs):
        c = k * n + d.index
        cached[k] = max(cached.get(k, 0), d.num_cached_tokens)
        texts[c] += d.text
        ids[c] += d.token_ids
        if d.logprobs:
            lps[c] += d.logprobs
        if d.finished:
            reasons[c], stops[c], tokens[c] = d.finish_reason, d.stop_reason, d.num_output_tokens
    choices = []
    for c in range(total):
        lp = None
        if plan.request.logprobs is not None:
            lp = completion_logprobs(ctx.token_texts, ids[c], lps[c], plan.request.logprobs,
                                     len(plan.echo_texts[c // n]))
        choices.append(CompletionChoice(index=c, text=texts[c], logprobs=lp, finish_reason=reasons[c],
                                        stop_reason=stops[c]))
    return CompletionResponse(id=plan.jobs[0].request_id, created=plan.created, model=ctx.config.model_name,
                              choices=choices, usage=_usage(ctx, plan, tokens, cached))


async def completion_stream(ctx: ServerContext, plan: CompletionPlan) -> AsyncIterator[bytes]:
    n, total = plan.n, plan.n * len(plan.jobs)
    opts = plan.request.stream_options
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    tokens = [0] * total
    cached: dict[int, int] = {}
    offsets = [len(plan.echo_texts[c // n]) for c in range(total)]
    rid = plan.jobs[0].request_id

    def chunk(choice: CompletionChunkChoice) -> bytes:
        return sse(CompletionChunk(id=rid, created=plan.created, model=ctx.config.model_name, choices=[choice],
                                   usage=_usage(ctx, plan, tokens, cached) if continuous else None))

    try:
        for c in range(total):
            if plan.echo_texts[c // n]:
                yield chunk(CompletionChunkChoice(index=c, text=plan.echo_texts[c // n]))
        async for k, d in ctx.generate(plan.jobs):
            c = k * n + d.index
            cached[k] = max(cached.get(k, 0), d.num_cached_tokens)
            tokens[c] = d.num_output_tokens
            lp = None
            if plan.request.logprobs is not None and d.logprobs:
                lp = completion_logprobs(ctx.token_texts, d.token_ids, d.logprobs, plan.request.logprobs, offsets[c])
                offsets[c] = lp.text_offset[-1] + len(lp.tokens[-1]) if lp.tokens else offsets[c]
            if d.finished:
                yield chunk(CompletionChunkChoice(index=c, text=d.text, logprobs=lp, finish_reason=d.finish_reason))
            elif d.text or lp is not None:
                yield chunk(CompletionChunkChoice(index=c, text=d.text, logprobs=lp))
        if include_usage:
            yield sse(CompletionChunk(id=rid, created=plan.created, model=ctx.config.model_name, choices=[],
                                      usage=_usage(ctx, plan, tokens, cached)))
    except Exception as e:  # noqa: BLE001 (after the headers went out, errors travel as an SSE event)
        yield sse_error(e)
    yield sse_done()


__all__ = ["plan_completion", "completion_full", "completion_stream"]
