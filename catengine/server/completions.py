"""``POST /v1/completions``: a string, a list of strings, token ids or a list of token-id lists.

Every prompt of a batch runs as its own engine request with ``n`` completions; choice ``k * n + i``
is completion ``i`` of prompt ``k``. ``echo`` prepends the prompt text (the decoded ids for a
token-id prompt); with ``logprobs`` the prompt tokens come first in the logprobs too (the first with
null logprob and top_logprobs, as OpenAI and vLLM send it): the engine computes them as
``prompt_logprobs`` (the request's ``prompt_logprobs`` if set, else ``logprobs``). ``max_tokens`` 0
with ``echo`` returns the prompt alone (lm-eval's loglikelihood requests): one token is generated and
dropped, as in vLLM. Streams send the echo with each choice's first delta. Usage counts each prompt's
tokens once and every completion's returned tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import msgspec

from ..errors import InvalidRequest
from .choices import completion_logprobs, prompt_logprobs
from .limits import check_sequences
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
    echo_only: bool = False     # max_tokens 0 with echo: the prompt alone
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n(self) -> int:
        return self.request.n


def _prompt_list(ctx: ServerContext, prompt: Any) -> list[str | list[int]]:
    """The prompts of a request, checked but not tokenized: a string or a list of token ids each."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest("prompt is empty; send a string, a list of strings or token ids")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [check_token_ids(prompt, ctx.vocab_size, "prompt")]
    if len(prompt) > MAX_PROMPTS:
        raise InvalidRequest(f"a completions batch may hold at most {MAX_PROMPTS} prompts, got {len(prompt)}")
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        return [check_token_ids(p, ctx.vocab_size, f"prompt[{k}]") for k, p in enumerate(prompt)]
    raise InvalidRequest("prompt must be a string, a list of strings, a list of token ids or a list of token-id "
                         "lists (not a mixture)")


async def _prompts(ctx: ServerContext, prompt: Any, n: int) -> list[tuple[str | None, list[int]]]:
    """(text or None, token ids) per prompt. Each text is tokenized as its own task on the preparation
    thread (after the prompts x n cap), so a large batch takes turns with other requests there."""
    prompts = _prompt_list(ctx, prompt)
    check_sequences(len(prompts), n, ctx.max_sequences)
    return [(p, await ctx.encode_async(p)) if isinstance(p, str) else (None, p) for p in prompts]


async def plan_completion(ctx: ServerContext, req: CompletionRequest) -> CompletionPlan:
    check_common(req)
    check_logprobs(req.logprobs, "logprobs")
    if req.suffix is not None:
        raise InvalidRequest("suffix is not supported; put the whole text in prompt")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequest(f"best_of must equal n ({req.n}) or be left out, got {req.best_of}: every "
                             "sampled sequence is returned")
    echo_only = req.echo and req.max_tokens == 0
    requested = 1 if echo_only else req.max_tokens
    # a stream never reports prompt_logprobs (> 0 was refused): only the echo's logprobs are computed there
    prompt_lps = None if req.stream else req.prompt_logprobs
    if req.echo and req.logprobs is not None and prompt_lps is None:
        prompt_lps = req.logprobs
    prompts = await _prompts(ctx, req.prompt, req.n)
    jobs, echoes = [], []
    base_id = ctx.new_id("cmpl")
    for k, (text, ids) in enumerate(prompts):
        room = check_length(len(ids), ctx.max_model_len, requested, "prompt")
        params = build_params(sampling_fields(req, req.logprobs, prompt_lps), ctx.generation_config,
                              requested, room, min(DEFAULT_MAX_TOKENS, room), ctx.vocab_size)
        jobs.append(Job(base_id if len(prompts) == 1 else f"{base_id}-{k}", ids, params))
        if req.echo:
            echoes.append(text if text is not None else await ctx.decode_async(ids, skip_special_tokens=False))
        else:
            echoes.append("")
    return CompletionPlan(req, jobs, echoes, echo_only)


def _usage(ctx: ServerContext, plan: CompletionPlan, tokens: list[int], cached: dict[int, int]) -> UsageInfo:
    """``cached``: prompt index -> its prefix-cache hit tokens (each prompt counted once)."""
    prompt = sum(len(j.prompt_ids) for j in plan.jobs)
    return ctx.usage(prompt, sum(tokens), sum(cached.values()))


def _echoed(plan: CompletionPlan, k: int, text: str, ids: list[int], entries: list, prompt_lps: list | None):
    """A choice's text, token ids and logprob entries with the prompt of job ``k`` in front (echo)."""
    job = plan.jobs[k]
    return (plan.echo_texts[k] + text, job.prompt_ids + ids,
            (prompt_lps or [None] * len(job.prompt_ids)) + entries)


async def completion_full(ctx: ServerContext, plan: CompletionPlan) -> CompletionResponse:
    req, n, total = plan.request, plan.n, plan.n * len(plan.jobs)
    texts = [""] * total
    ids: list[list[int]] = [[] for _ in range(total)]
    lps: list[list] = [[] for _ in range(total)]
    prompt_lps: list[list | None] = [None] * total
    reasons: list[Any] = [None] * total
    stops: list[Any] = [None] * total
    tokens = [0] * total
    cached: dict[int, int] = {}
    async for k, d in ctx.generate(plan.jobs):
        c = k * n + d.index
        cached[k] = max(cached.get(k, 0), d.num_cached_tokens)
        if d.prompt_logprobs is not None:
            prompt_lps[c] = d.prompt_logprobs
        if not plan.echo_only:
            texts[c] += d.text
            ids[c] += d.token_ids
            lps[c] += d.logprobs or []
        if d.finished:
            reasons[c], stops[c] = d.finish_reason, d.stop_reason
            tokens[c] = 0 if plan.echo_only else d.num_output_tokens
    choices = []
    for c in range(total):
        text, all_ids, entries = texts[c], ids[c], lps[c]
        if req.echo:
            text, all_ids, entries = _echoed(plan, c // n, text, all_ids, entries, prompt_lps[c])
        lp = None if req.logprobs is None else completion_logprobs(ctx.token_texts, all_ids, entries, req.logprobs, 0)
        plp = None if prompt_lps[c] is None else prompt_logprobs(ctx.token_texts, prompt_lps[c])
        choices.append(CompletionChoice(index=c, text=text, logprobs=lp, finish_reason=reasons[c],
                                        stop_reason=stops[c], prompt_logprobs=plp))
    return CompletionResponse(id=plan.jobs[0].request_id, created=plan.created, model=ctx.config.model_name,
                              choices=choices, usage=_usage(ctx, plan, tokens, cached))


async def completion_stream(ctx: ServerContext, plan: CompletionPlan) -> AsyncIterator[bytes]:
    req, n, total = plan.request, plan.n, plan.n * len(plan.jobs)
    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    tokens = [0] * total
    cached: dict[int, int] = {}
    offsets = [0] * total
    echoed = [False] * total
    rid = plan.jobs[0].request_id

    def chunk(choice: CompletionChunkChoice) -> bytes:
        return sse(CompletionChunk(id=rid, created=plan.created, model=ctx.config.model_name, choices=[choice],
                                   usage=_usage(ctx, plan, tokens, cached) if continuous else msgspec.UNSET))

    try:
        async for k, d in ctx.generate(plan.jobs):
            c = k * n + d.index
            cached[k] = max(cached.get(k, 0), d.num_cached_tokens)
            tokens[c] = 0 if plan.echo_only else d.num_output_tokens
            text, ids, entries = ("", [], []) if plan.echo_only else (d.text, d.token_ids, d.logprobs or [])
            if req.echo and not echoed[c]:
                echoed[c] = True
                text, ids, entries = _echoed(plan, k, text, ids, entries, d.prompt_logprobs)
            lp = None
            if req.logprobs is not None and ids:
                lp = completion_logprobs(ctx.token_texts, ids, entries, req.logprobs, offsets[c])
                offsets[c] = lp.text_offset[-1] + len(lp.tokens[-1])
            if d.finished:
                yield chunk(CompletionChunkChoice(index=c, text=text, logprobs=lp, finish_reason=d.finish_reason))
            elif text or lp is not None:
                yield chunk(CompletionChunkChoice(index=c, text=text, logprobs=lp))
        if include_usage:
            yield sse(CompletionChunk(id=rid, created=plan.created, model=ctx.config.model_name, choices=[],
                                      usage=_usage(ctx, plan, tokens, cached)))
    except Exception as e:  # noqa: BLE001 (after the headers went out, errors travel as an SSE event)
        yield sse_error(e)
    yield sse_done()


__all__ = ["plan_completion", "completion_full", "completion_stream"]
