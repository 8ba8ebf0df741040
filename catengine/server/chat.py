"""``POST /v1/chat/completions``: messages -> chat template -> engine -> message or SSE chunks.

Tools: ``tool_choice`` none hides the tools from the model and parses nothing; auto (the default when
tools are sent) needs ``--enable-auto-tool-choice --tool-call-parser``; required / named force a call
by opening it in the prompt (``<tool_call>\\n<function=NAME>\\n`` for qwen3_coder), which closes any
open think block first: a forced call is answered without thinking.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import msgspec

from ..errors import InvalidRequest
from .choices import ChatChoiceProcessor, chat_logprobs, prompt_logprobs
from .limits import check_sequences
from .protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                       ChatCompletionResponse, DeltaMessage, NamedToolChoice, ResponseMessage,
                       UsageInfo)
from .reasoning import get_reasoning_parser, prompt_opens_thinking
from .serving import Job, ServerContext
from .streaming import sse, sse_done, sse_error
from .tool_parsers import get_tool_parser
from .validation import (build_params, check_common, check_length, check_logprobs, check_messages,
                         check_template_kwargs, sampling_fields)


@dataclass
class ChatPlan:
    """Everything decided before the engine runs."""
    request: ChatCompletionRequest
    job: Job
    tools: list[dict[str, Any]] | None
    tool_parser: str | None
    forced_prefix: str
    thinking: bool
    prompt_opened: bool
    top_logprobs: int | None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def jobs(self) -> list[Job]:
        return [self.job]

    def processor(self, ctx: ServerContext) -> ChatChoiceProcessor:
        reasoning = None
        if ctx.config.reasoning_parser:
            reasoning = get_reasoning_parser(ctx.config.reasoning_parser)(self.thinking, self.prompt_opened)
        tools = get_tool_parser(self.tool_parser)(self.tools) if self.tool_parser else None
        return ChatChoiceProcessor(reasoning, tools, self.forced_prefix)


def _plain(obj: Any) -> Any:
    """Builtins for the template, without the None-valued fields the structs carry (a template
    would print ``"description": null`` into the prompt)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if v is not None or k == "content"}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def tool_dicts(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """The request's tool structs as the template reads them."""
    return [_plain(msgspec.to_builtins(t)) for t in tools] if tools else None


def _tool_setup(ctx: ServerContext, req: ChatCompletionRequest) -> tuple[list | None, str | None, str]:
    """(tools shown to the template, parser to run, forced prompt suffix)."""
    tools = tool_dicts(req.tools)
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise InvalidRequest(f"tool_choice must be \"none\", \"auto\", \"required\" or "
                             f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {choice!r}")
    if choice != "none" and not tools:
        raise InvalidRequest("tool_choice is set but no tools were given; send tools or drop tool_choice")
    for tool in req.tools or []:
        if tool.type != "function":
            raise InvalidRequest(f"tools[].type must be \"function\", got {tool.type!r}")
    if choice == "none":
        return None, None, ""
    parser = ctx.config.tool_call_parser
    if choice == "auto":
        if not (ctx.config.enable_auto_tool_choice and parser):
            raise InvalidRequest("\"auto\" tool choice requires the server to run with --enable-auto-tool-choice "
                                 "and --tool-call-parser; restart it with them, or send tool_choice \"none\"")
        return tools, parser, ""
    parser = parser or "qwen3_coder"   # the format of Qwen3.5/3.6 templates
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        known = [t["function"]["name"] for t in tools]
        if name not in known:
            raise InvalidRequest(f"tool_choice names the function {name!r}, which is not among tools {known}; "
                                 "name one of them")
        opening = {"qwen3_coder": f"<tool_call>\n<function={name}>\n",
                   "hermes": f'<tool_call>\n{{"name": {msgspec.json.encode(name).decode()}, "arguments": '}
        return tools, parser, opening[parser]
    opening = {"qwen3_coder": "<tool_call>\n<function=", "hermes": '<tool_call>\n{"name": "'}
    return tools, parser, opening[parser]


def render_messages(ctx: ServerContext, messages: list[Any], tools: list | None, kwargs: dict[str, Any],
                    add_generation_prompt: bool) -> str:
    """The chat template over the request's message structs (chat completions and /tokenize alike)."""
    check_messages(messages)
    check_template_kwargs(kwargs)
    try:
        return ctx.tokenizer.apply_chat_template(_plain(msgspec.to_builtins(messages)), tools=tools,
                                                 chat_template_kwargs=kwargs,
                                                 add_generation_prompt=add_generation_prompt)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        # the template runs on client data: whatever it trips over is a bad request, not a server fault
        if isinstance(e, InvalidRequest):
            raise
        raise InvalidRequest(f"the chat template cannot render these messages ({type(e).__name__}: {e}); "
                             "check the message fields") from None


def plan_chat(ctx: ServerContext, req: ChatCompletionRequest) -> ChatPlan:
    check_common(req)
    if not req.messages:
        raise InvalidRequest("messages must be a non-empty list of {role, content} objects")
    check_messages(req.messages)   # before the tool setup, whose errors would otherwise come first
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequest("top_logprobs needs \"logprobs\": true; set it or drop top_logprobs")
    check_logprobs(req.top_logprobs, "top_logprobs")
    check_sequences(1, req.n, ctx.max_sequences)
    tools, parser, forced = _tool_setup(ctx, req)
    # --default-chat-template-kwargs under the request's own (vLLM: the request wins key by key)
    kwargs = {**(ctx.config.default_chat_template_kwargs or {}), **(req.chat_template_kwargs or {})}
    thinking = kwargs.get("enable_thinking", True) is not False
    if req.continue_final_message:
        raise InvalidRequest("continue_final_message is not supported; send the text to continue to /v1/completions")
    prompt = render_messages(ctx, req.messages, tools, kwargs, req.add_generation_prompt)
    opened = prompt_opens_thinking(prompt)
    if forced:
        if opened:
            prompt += "\n</think>\n\n"
            opened, thinking = False, False
        prompt += forced
    prompt_ids = ctx.encode(prompt, add_special_tokens=False)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if requested is not None and requested < 1:
        raise InvalidRequest(f"max_completion_tokens must be at least 1, got {requested}")
    room = check_length(len(prompt_ids), ctx.max_model_len, requested, "messages")
    top = (req.top_logprobs or 0) if req.logprobs else None
    # vLLM's prompt_logprobs (a stream reports none: > 0 was refused there)
    prompt_lps = None if req.stream else req.prompt_logprobs
    params = build_params(sampling_fields(req, top, prompt_lps), ctx.generation_config, requested, room, None,
                          ctx.vocab_size)
    # <tool_call> must reach the tool parser even where the tokenizer marks it special
    job = Job(ctx.new_id("chatcmpl"), prompt_ids, params, special_tokens_visible=parser is not None)
    return ChatPlan(req, job, tools, parser, forced, thinking, opened, top)


def _finish_reason(reason: str | None, processor: ChatChoiceProcessor) -> str | None:
    return "tool_calls" if reason == "stop" and processor.calls else reason


async def chat_full(ctx: ServerContext, plan: ChatPlan) -> ChatCompletionResponse:
    n = plan.job.params.n
    procs = [plan.processor(ctx) for _ in range(n)]
    content = [""] * n
    reasoning = [""] * n
    logprobs: list[list] = [[] for _ in range(n)]
    reasons: list[Any] = [None] * n
    stop_reasons: list[Any] = [None] * n
    tokens = [0] * n
    cached = 0
    prompt_lps = None
    async for _, d in ctx.generate([plan.job]):
        i = d.index
        cached = max(cached, d.num_cached_tokens)
        if d.prompt_logprobs is not None:
            prompt_lps = d.prompt_logprobs
        out = procs[i].feed(d.text)
        if d.finished:
            tail = procs[i].finish()
            out.content += tail.content
            out.reasoning += tail.reasoning
            reasons[i], stop_reasons[i], tokens[i] = d.finish_reason, d.stop_reason, d.num_output_tokens
        content[i] += out.content
        reasoning[i] += out.reasoning
        if d.logprobs:
            logprobs[i] += d.logprobs
    choices = []
    for i in range(n):
        message = ResponseMessage(role=ctx.config.response_role, content=content[i] if content[i] or not (procs[i].calls or reasoning[i]) else None,
                                  tool_calls=procs[i].calls)
        if ctx.config.reasoning_parser:
            message.reasoning_content = message.reasoning = reasoning[i] or None
        lp = chat_logprobs(ctx.token_texts, logprobs[i], plan.top_logprobs) if plan.top_logprobs is not None else None
        choices.append(ChatChoice(index=i, message=message, logprobs=lp,
                                  finish_reason=_finish_reason(reasons[i], procs[i]), stop_reason=stop_reasons[i]))
    usage = ctx.usage(len(plan.job.prompt_ids), sum(tokens), cached)
    return ChatCompletionResponse(id=plan.job.request_id, created=plan.created, model=ctx.config.model_name,
                                  choices=choices, usage=usage,
                                  prompt_logprobs=None if prompt_lps is None else prompt_logprobs(ctx.token_texts,
                                                                                                  prompt_lps))


async def chat_stream(ctx: ServerContext, plan: ChatPlan) -> AsyncIterator[bytes]:
    req, n = plan.request, plan.job.params.n
    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    prompt_tokens = len(plan.job.prompt_ids)
    tokens = [0] * n
    cached = [0]

    def usage() -> UsageInfo:
        return ctx.usage(prompt_tokens, sum(tokens), cached[0])

    def chunk(choice: ChatChunkChoice) -> bytes:
        return sse(ChatCompletionChunk(id=plan.job.request_id, created=plan.created, model=ctx.config.model_name,
                                       choices=[choice], usage=usage() if continuous else msgspec.UNSET))

    procs = [plan.processor(ctx) for _ in range(n)]
    try:
        for i in range(n):
            yield chunk(ChatChunkChoice(index=i, delta=DeltaMessage(role=ctx.config.response_role, content="")))
        async for _, d in ctx.generate([plan.job]):
            i = d.index
            cached[0] = max(cached[0], d.num_cached_tokens)
            tokens[i] = d.num_output_tokens
            out = procs[i].feed(d.text)
            if d.finished:
                tail = procs[i].finish()
                out.content += tail.content
                out.reasoning += tail.reasoning
                out.tool_calls += tail.tool_calls
            lp = None
            if plan.top_logprobs is not None and d.logprobs:
                lp = chat_logprobs(ctx.token_texts, d.logprobs, plan.top_logprobs)
            # a call header and its first argument fragment go out as separate chunks
            parts = [out.tool_calls[:1]] + [[tc] for tc in out.tool_calls[1:]]
            for k, calls in enumerate(parts):
                first, last = k == 0, k == len(parts) - 1
                delta = DeltaMessage(tool_calls=calls or None)
                if first:
                    delta.content = out.content or None
                    if out.reasoning:
                        delta.reasoning_content = delta.reasoning = out.reasoning
                    if lp is not None and delta.content is None:
                        delta.content = ""
                reason = _finish_reason(d.finish_reason, procs[i]) if d.finished and last else None
                if reason or calls or (first and (out or lp is not None)):
                    yield chunk(ChatChunkChoice(index=i, delta=delta, logprobs=lp if first else None,
                                                finish_reason=reason))
        if include_usage:
            yield sse(ChatCompletionChunk(id=plan.job.request_id, created=plan.created, model=ctx.config.model_name,
                                          choices=[], usage=usage()))
    except Exception as e:  # noqa: BLE001 (after the headers went out, errors travel as an SSE event)
        yield sse_error(e)
    yield sse_done()


__all__ = ["plan_chat", "render_messages", "tool_dicts", "chat_full", "chat_stream"]
