"""Turning engine output into OpenAI pieces: per-choice text processing (reasoning split, tool-call
parsing) and logprobs in the chat and the legacy completions formats.

A :class:`ChatChoiceProcessor` is fed the choice's text deltas and returns OpenAI delta fields; the
non-streaming response folds the same deltas, so the two modes agree by construction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from .protocol import (ChatLogprobs, CompletionLogprobs, DeltaFunctionCall, DeltaToolCall, FunctionCall,
                       PromptLogprob, PromptLogprobs, TokenLogprob, ToolCall, TopLogprob)
from .reasoning import Qwen3ReasoningParser
from .tool_parsers import ToolParser

# JSON has no infinity; vLLM sends this for a token the model rules out, and clients expect a number.
NEG_INF_LOGPROB = -9999.0


def finite(x: float) -> float:
    return x if math.isfinite(x) else NEG_INF_LOGPROB


@dataclass
class ChoiceDelta:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[DeltaToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class ChatChoiceProcessor:
    """Reasoning parser first (text after ``</think>`` is content), then the tool parser on content.
    ``prefix`` is generated text the server forced into the prompt (a tool-call opening for
    tool_choice required/named); it is parsed as if the model had written it."""

    def __init__(self, reasoning: Qwen3ReasoningParser | None, tools: ToolParser | None, prefix: str = ""):
        self.reasoning = reasoning
        self.tools = tools
        self.calls: list[ToolCall] = []
        self.text = ""
        self._prefix = prefix

    def feed(self, text: str) -> ChoiceDelta:
        if self._prefix:
            text, self._prefix = self._prefix + text, ""
        self.text += text
        return self._route(self.reasoning.feed(text) if self.reasoning else [("content", text)], final=False)

    def finish(self) -> ChoiceDelta:
        out = self.feed("") if self._prefix else ChoiceDelta()
        events = self.reasoning.finish() if self.reasoning else []
        more = self._route(events, final=True)
        out.content += more.content
        out.reasoning += more.reasoning
        out.tool_calls += more.tool_calls
        return out

    def _route(self, events: list[tuple[str, str]], final: bool) -> ChoiceDelta:
        out = ChoiceDelta()
        for kind, text in events:
            if kind == "reasoning":
                out.reasoning += text
            elif self.tools is None:
                out.content += text
            else:
                self._tool_events(self.tools.feed(text), out)
        if final and self.tools is not None:
            self._tool_events(self.tools.finish(), out)
        return out

    def _tool_events(self, events: list[tuple], out: ChoiceDelta) -> None:
        for ev in events:
            if ev[0] == "content":
                out.content += ev[1]
            elif ev[0] == "start":
                _, index, call_id, name = ev
                self.calls.append(ToolCall(id=call_id, function=FunctionCall(name=name, arguments="")))
                out.tool_calls.append(DeltaToolCall(index=index, id=call_id, type="function",
                                                    function=DeltaFunctionCall(name=name, arguments="")))
            else:
                _, index, fragment = ev
                self.calls[index].function.arguments += fragment
                last = out.tool_calls[-1] if out.tool_calls else None
                # fragments merge, but never into a header: clients see the header with arguments ""
                if last is not None and last.index == index and last.id is None:
                    last.function.arguments = (last.function.arguments or "") + fragment
                else:
                    out.tool_calls.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=fragment)))


# ----------------------------------------------------------------------------------- logprobs

class TokenTexts:
    """Cached token id -> (text, bytes) for logprobs; one per server (ids repeat a lot)."""

    def __init__(self, tokenizer: Any, max_entries: int = 65536, as_ids: bool = False):
        self.tokenizer = tokenizer
        self.max_entries = max_entries
        self.as_ids = as_ids   # --return-tokens-as-token-ids: "token_id:N", for clients that re-tokenize
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            if self.as_ids:
                text = f"token_id:{token_id}"
                hit = (text, list(text.encode()))
            else:
                hit = (self.tokenizer.token_text(token_id), list(self.tokenizer.token_bytes(token_id)))
            self._cache[token_id] = hit
        return hit


def chat_logprobs(texts: TokenTexts, entries: Sequence[Any], top_n: int) -> ChatLogprobs:
    """``entries``: the engine's per-token logprobs (token_id, logprob, top pairs)."""
    content = []
    for e in entries:
        token, token_bytes = texts.get(e.token_id)
        top = [TopLogprob(token=texts.get(t)[0], logprob=finite(lp), bytes=texts.get(t)[1])
               for t, lp in list(e.top)[:top_n]]
        content.append(TokenLogprob(token=token, logprob=finite(e.logprob), bytes=token_bytes, top_logprobs=top))
    return ChatLogprobs(content=content)


def completion_logprobs(texts: TokenTexts, token_ids: Sequence[int], entries: Sequence[Any | None],
                        top_n: int, text_offset: int) -> CompletionLogprobs:
    """Legacy format. ``entries[i]`` None (the first echoed prompt token) gives null logprobs.
    ``top_logprobs`` maps token text to logprob for the top-N plus the chosen token, as vLLM does."""
    out = CompletionLogprobs()
    offset = text_offset
    for token_id, e in zip(token_ids, entries):
        token = texts.get(token_id)[0]
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if e is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(finite(e.logprob))
        top = {texts.get(t)[0]: finite(lp) for t, lp in list(e.top)[:top_n]}
        top.setdefault(token, finite(e.logprob))
        out.top_logprobs.append(top)
    return out


def prompt_logprobs(texts: TokenTexts, entries: Sequence[Any | None]) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs``: per position None (the first token) or ``{token_id: {logprob, rank,
    decoded_token}}`` holding the prompt token itself, then the top-N (rank 1..N; a prompt token among
    them appears once, with its rank)."""
    out: PromptLogprobs = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        position = {e.token_id: PromptLogprob(logprob=finite(e.logprob), rank=e.rank,
                                              decoded_token=texts.get(e.token_id)[0])}
        for rank, (t, lp) in enumerate(e.top, start=1):
            position.setdefault(t, PromptLogprob(logprob=finite(lp), rank=rank, decoded_token=texts.get(t)[0]))
        out.append(position)
    return out
