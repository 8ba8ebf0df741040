"""The ``qwen3`` reasoning parser: text up to ``</think>`` is reasoning, the rest is content.

Qwen3.5/3.6 chat templates open ``<think>\\n`` in the prompt, so the generated text normally starts
inside the think block and carries only the closing tag; a model that writes ``<think>`` itself is
handled too. With thinking disabled (``enable_thinking: false``, the template then inserts an empty
think block) everything is content. The newlines framing ``</think>`` are layout and are dropped.

Like the tool parsers this is one incremental machine; the non-streaming split is the machine fed the
whole text, so both agree. Events: ``("reasoning", text)`` and ``("content", text)``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .tool_parsers import held_suffix

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# modes that drop the newlines after a tag, and the mode that follows them
_AFTER_TAG = {"opened": "reasoning", "after": "content"}


@dataclass
class ReasoningSplit:
    reasoning: str | None
    content: str | None


def prompt_opens_thinking(prompt: str) -> bool:
    """True when the rendered prompt ends with an open ``<think>`` (a ``<think>`` quoted earlier in a
    message does not count)."""
    return prompt.rstrip().endswith(THINK_OPEN)


class Qwen3ReasoningParser:
    name = "qwen3"

    def __init__(self, thinking: bool = True, prompt_opened: bool = True):
        """``thinking``: False when the request disabled it. ``prompt_opened``: the prompt ends in an
        open think block (otherwise reasoning starts only if the output opens one itself)."""
        if not thinking:
            self._mode = "content"
        else:
            self._mode = "start" if prompt_opened else "maybe"
        self._buf = ""
        self._newlines = ""   # newlines held at the end of reasoning: dropped if </think> follows
        self._events: list[tuple[str, str]] = []

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self._buf += delta
        self._run(final=False)
        return self._take()

    def finish(self) -> list[tuple[str, str]]:
        self._run(final=True)
        return self._take()

    @classmethod
    def split(cls, text: str, thinking: bool = True, prompt_opened: bool = True) -> ReasoningSplit:
        parser = cls(thinking, prompt_opened)
        events = parser.feed(text) + parser.finish()
        reasoning = "".join(t for kind, t in events if kind == "reasoning")
        content = "".join(t for kind, t in events if kind == "content")
        if thinking:
            return ReasoningSplit(reasoning or None, content or None)
        return ReasoningSplit(None, content)

    def _take(self) -> list[tuple[str, str]]:
        events, self._events = self._events, []
        return events

    def _emit(self, kind: str, text: str) -> None:
        if text:
            self._events.append((kind, text))

    def _run(self, final: bool) -> None:
        while True:
            s = self._buf
            if self._mode in ("start", "maybe"):
                # an explicit <think> at the very start (after blank lines) opens reasoning
                body = s.lstrip("\n")
                if len(body) < len(THINK_OPEN) and THINK_OPEN.startswith(body) and not final:
                    return
                if body.startswith(THINK_OPEN):
                    self._buf = body[len(THINK_OPEN):]
                    self._mode = "opened"
                elif self._mode == "start":
                    self._buf = body
                    self._mode = "reasoning"
                else:
                    self._mode = "content"
                continue
            if self._mode == "reasoning":
                i = s.find(THINK_CLOSE)
                if i >= 0:
                    body = s[:i].rstrip("\n")
                    if body:
                        self._emit("reasoning", self._newlines + body)
                    self._newlines = ""
                    self._buf = s[i + len(THINK_CLOSE):]
                    self._mode = "after"
                    continue
                keep = 0 if final else held_suffix(s, (THINK_CLOSE,))
                part = s[:len(s) - keep]
                body = part.rstrip("\n")
                if body:
                    self._emit("reasoning", self._newlines + body)
                    self._newlines = ""
                self._newlines += part[len(body):]
                self._buf = s[len(s) - keep:]
                if final:
                    self._emit("reasoning", self._newlines)
                    self._newlines = ""
                return
            if self._mode in _AFTER_TAG:
                # the newlines framing a tag are layout, also when they arrive in a later delta than the tag
                body = s.lstrip("\n")
                if not body and not final:
                    self._buf = ""
                    return
                self._buf = body
                self._mode = _AFTER_TAG[self._mode]
                continue
            self._emit("content", s)
            self._buf = ""
            return


def get_reasoning_parser(name: str) -> type[Qwen3ReasoningParser]:
    parsers = {"qwen3": Qwen3ReasoningParser}
    if name not in parsers:
        raise ConfigError(f"unknown reasoning parser {name!r}; use one of {sorted(parsers)}")
    return parsers[name]


REASONING_PARSER_NAMES = ("qwen3",)
