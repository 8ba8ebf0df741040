"""The ``qwen3_coder`` tool-call format of Qwen3.5/3.6 and Qwen3-Coder:

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

One leading and one trailing newline of each value are layout and are stripped. Values are typed by
the tool's JSON schema; parameters the schema does not type as anything but a string (or does not
know) stay strings and are streamed as they arrive, other values are sent whole once complete.
A value ends at the first ``</parameter>``, or at the next ``<parameter=``, ``</function>`` or
``</tool_call>`` when the model left it open.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from .tool_parsers import CALL_CLOSE, ToolParser, held_suffix

FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
_VALUE_END = (PARAM_CLOSE, PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE)
_PARAM_TAGS = (PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE)
_INT = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")


def _json_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def schema_types(schema: Any) -> list[str]:
    """The JSON types a parameter schema allows (``[]`` when it says nothing usable)."""
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t.lower()]
    if isinstance(t, list):
        return [x.lower() for x in t if isinstance(x, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            out += schema_types(sub)
    if not out and "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        out = ["string"]
    return out


def is_plain_string(types: list[str]) -> bool:
    return all(t in ("string", "str", "text") for t in types)


def convert_value(text: str, types: list[str]) -> Any:
    """Typed value of ``text`` for the first of ``types`` it parses as; otherwise the string itself."""
    raw = text.strip()
    for t in types:
        if t == "null" and raw == "null":
            return None
        if t in ("integer", "int") and _INT.fullmatch(raw):
            return int(raw)
        if t in ("number", "float") and _NUMBER.fullmatch(raw):
            if _INT.fullmatch(raw):
                return int(raw)
            value = float(raw)
            if math.isfinite(value):
                return value
        if t in ("boolean", "bool") and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        if t in ("object", "array", "dict", "list"):
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, dict if t in ("object", "dict") else list):
                return value
    if "null" in types and raw == "null":
        return None
    return text


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"

    def _block_begin(self) -> None:
        self._state = "header"     # header | params | value | after
        self._index = -1
        self._fn_props: dict[str, Any] = {}
        self._nparams = 0
        self._ptypes: list[str] = []
        self._pname = ""
        self._value_started = False

    def _block_step(self, final: bool) -> bool:
        return getattr(self, "_step_" + self._state)(final)

    # --- <function=NAME>

    def _step_header(self, final: bool) -> bool:
        s = self._buf.lstrip()
        if len(s) < len(FUNC_OPEN):
            if FUNC_OPEN.startswith(s) and not final:
                return False
            self._malformed()
            return True
        if not s.startswith(FUNC_OPEN):
            self._malformed()
            return True
        rest = s[len(FUNC_OPEN):]
        k = rest.find(">")
        head = rest if k < 0 else rest[:k]
        if "\n" in head or "<" in head or (k < 0 and final):
            self._malformed()
            return True
        if k < 0:
            return False
        name = head.strip()
        if not name:
            self._malformed()
            return True
        self._buf = rest[k + 1:]
        self._index = self._start_call(name)
        self._fn_props = self.schemas.get(name, {})
        self._state = "params"
        return True

    # --- between parameters

    def _step_params(self, final: bool) -> bool:
        s = self._buf = self._buf.lstrip()
        if s.startswith(PARAM_OPEN):
            rest = s[len(PARAM_OPEN):]
            k = rest.find(">")
            head = rest if k < 0 else rest[:k]
            if "\n" in head or "<" in head or (k >= 0 and not head.strip()):
                self._buf = s[1:]  # not a parameter tag: skip it as stray text
                return True
            if k < 0:
                if final:
                    self._buf = ""
                    self._close_function()
                    return True
                return False
            self._buf = rest[k + 1:]
            self._begin_value(head.strip())
            return True
        if s.startswith(FUNC_CLOSE):
            self._buf = s[len(FUNC_CLOSE):]
            self._close_function()
            self._state = "after"
            return True
        if s.startswith(CALL_CLOSE):
            self._buf = s[len(CALL_CLOSE):]
            self._close_function()
            self._mode = "content"
            return True
        if not s or (not final and any(tag.startswith(s) for tag in _PARAM_TAGS)):
            if final:
                self._close_function()
                self._mode = "content"
                return True
            return False
        j = s.find("<", 1)  # stray text inside the function: skip to the next tag
        self._buf = s[j:] if j > 0 else ""
        return True

    def _close_function(self) -> None:
        self._args(self._index, "}" if self._nparams else "{}")

    # --- a parameter value

    def _begin_value(self, name: str) -> None:
        self._pname = name
        self._ptypes = schema_types(self._fn_props.get(name))
        self._value_started = False
        self._state = "value"
        if is_plain_string(self._ptypes):
            self._args(self._index, self._key() + '"')

    def _key(self) -> str:
        prefix = ", " if self._nparams else "{"
        self._nparams += 1
        return prefix + _json_str(self._pname) + ": "

    def _step_value(self, final: bool) -> bool:
        if not self._value_started:
            if not self._buf and not final:
                return False
            if self._buf.startswith("\n"):
                self._buf = self._buf[1:]
            self._value_started = True
        s = self._buf
        end, tag = len(s), ""
        for t in _VALUE_END:
            p = s.find(t)
            if 0 <= p < end:
                end, tag = p, t
        streaming = is_plain_string(self._ptypes)
        if not tag and not final:
            if streaming:
                hold = held_suffix(s, _VALUE_END)
                if s[:len(s) - hold].endswith("\n"):
                    hold += 1
                self._args(self._index, _json_str(s[:len(s) - hold])[1:-1])
                self._buf = s[len(s) - hold:]
            return False
        value = s[:end]
        if value.endswith("\n"):
            value = value[:-1]
        if streaming:
            self._args(self._index, _json_str(value)[1:-1] + '"')
        else:
            typed = convert_value(value, self._ptypes)
            self._args(self._index, self._key() + json.dumps(typed, ensure_ascii=False))
        self._buf = s[end + len(tag):] if tag == PARAM_CLOSE else s[end:]
        self._state = "params"
        return True

    # --- after </function>: anything until </tool_call> is dropped

    def _step_after(self, final: bool) -> bool:
        j = self._buf.find(CALL_CLOSE)
        if j >= 0:
            self._buf = self._buf[j + len(CALL_CLOSE):]
            self._mode = "content"
            return True
        if final:
            self._buf = ""
            self._mode = "content"
            return True
        keep = held_suffix(self._buf, (CALL_CLOSE,))
        self._buf = self._buf[len(self._buf) - keep:]
        return False
