"""Tool-call parsers: ``qwen3_coder`` (Qwen3.5/3.6, Qwen3-Coder) and ``hermes`` (older Qwen models).

Each parser is one incremental state machine fed text deltas. The non-streaming result is the same
machine fed the whole text at once, so streamed and non-streamed calls agree by construction as long
as every decision depends only on text that can no longer change (``feed`` holds back any tail that
could still become a tag). The tests feed random splits and compare.

Events: ``("content", text)``, ``("start", index, call_id, name)``, ``("args", index, fragment)``.
The argument fragments of one call concatenate to its JSON ``arguments`` string.

Rules shared by both formats: text outside ``<tool_call>...</tool_call>`` is content; whitespace
right before a call, and trailing whitespace once a call was made, is dropped; a block that is not a
well-formed call is kept verbatim as content. A block left open at the end of the text (the model hit
max_tokens) still counts as a call when its header was complete.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class ParsedOutput:
    content: str | None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


def tool_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Function name -> its JSON-schema ``properties`` (empty when the tool declares none)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


class ToolParser:
    """Outer machine: content until ``<tool_call>``, then a format-specific block machine."""
    name = ""

    def __init__(self, tools: list[dict[str, Any]] | None = None):
        self.schemas = tool_schemas(tools)
        self._buf = ""            # text received but not yet decided
        self._ws = ""             # whitespace held back: dropped if a call or the end follows
        self._mode = "content"    # content | block | malformed
        self._events: list[tuple] = []
        self.num_calls = 0
        self._finished = False

    # --- public API

    def feed(self, delta: str) -> list[tuple]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buf += delta
        self._run(final=False)
        return self._take()

    def finish(self) -> list[tuple]:
        if not self._finished:
            self._run(final=True)
            self._finished = True
        return self._take()

    @classmethod
    def parse(cls, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedOutput:
        parser = cls(tools)
        return collect(parser.feed(text) + parser.finish())

    # --- machinery shared by the formats

    def _take(self) -> list[tuple]:
        events, self._events = self._events, []
        return events

    def _content(self, text: str) -> None:
        text = self._ws + text
        kept = text.rstrip()
        self._ws = text[len(kept):]
        if kept:
            self._events.append(("content", kept))

    def _start_call(self, name: str) -> int:
        self._ws = ""  # whitespace between text and a call is layout, not content
        index = self.num_calls
        self.num_calls += 1
        self._events.append(("start", index, new_call_id(), name))
        return index

    def _args(self, index: int, fragment: str) -> None:
        if fragment:
            self._events.append(("args", index, fragment))

    def _run(self, final: bool) -> None:
        while True:
            if self._mode == "content":
                i = self._buf.find(CALL_OPEN)
                if i >= 0:
                    self._content(self._buf[:i])
                    self._buf = self._buf[i + len(CALL_OPEN):]
                    self._mode = "block"
                    self._block_begin()
                    continue
                keep = 0 if final else held_suffix(self._buf, (CALL_OPEN,))
                self._content(self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                if final:
                    tail, self._ws = self._ws, ""
                    if tail and self.num_calls == 0:
                        self._events.append(("content", tail))
                return
            if self._mode == "malformed":
                j = self._buf.find(CALL_CLOSE)
                if j >= 0:
                    self._content(self._buf[:j + len(CALL_CLOSE)])
                    self._buf = self._buf[j + len(CALL_CLOSE):]
                    self._mode = "content"
                    continue
                keep = 0 if final else held_suffix(self._buf, (CALL_CLOSE,))
                self._content(self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                if final:
                    self._mode = "content"
                    continue
                return
            if not self._block_step(final):
                return

    def _malformed(self) -> None:
        """The open block is not a call: it is content up to and including its ``</tool_call>``."""
        self._content(CALL_OPEN)
        self._mode = "malformed"

    def _block_begin(self) -> None:
        raise NotImplementedError

    def _block_step(self, final: bool) -> bool:
        """Advance inside a block; return False when more text is needed."""
        raise NotImplementedError


def collect(events: list[tuple]) -> ParsedOutput:
    """Fold parser events into the non-streaming result."""
    content: list[str] = []
    calls: list[ParsedToolCall] = []
    for ev in events:
        if ev[0] == "content":
            content.append(ev[1])
        elif ev[0] == "start":
            calls.append(ParsedToolCall(id=ev[2], name=ev[3], arguments=""))
        else:
            calls[ev[1]].arguments += ev[2]
    text = "".join(content)
    return ParsedOutput(content=text if text or not calls else None, tool_calls=calls)


# ---------------------------------------------------------------------------------------------
# hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>


class HermesToolParser(ToolParser):
    """The JSON body can only be judged once complete, so the header and the arguments of a call are
    sent together when its ``</tool_call>`` arrives; a body that is not a call stays content."""
    name = "hermes"

    def _block_begin(self) -> None:
        pass

    def _block_step(self, final: bool) -> bool:
        j = self._buf.find(CALL_CLOSE)
        if j < 0 and not final:
            return False
        body = self._buf if j < 0 else self._buf[:j]
        closed = j >= 0
        self._buf = "" if j < 0 else self._buf[j + len(CALL_CLOSE):]
        call = _hermes_call(body)
        if call is None:
            self._content(CALL_OPEN + body + (CALL_CLOSE if closed else ""))
        else:
            index = self._start_call(call[0])
            self._args(index, call[1])
        self._mode = "content"
        return True


def _hermes_call(body: str) -> tuple[str, str] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# registry

def get_tool_parser(name: str) -> type[ToolParser]:
    from .tool_qwen3_coder import Qwen3CoderToolParser
    parsers = {"hermes": HermesToolParser, "qwen3_coder": Qwen3CoderToolParser}
    if name not in parsers:
        raise ConfigError(f"unknown tool-call parser {name!r}; use one of {sorted(parsers)}")
    return parsers[name]


TOOL_PARSER_NAMES = ("hermes", "qwen3_coder")
