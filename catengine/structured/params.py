"""What a request constrains its output to: vLLM's ``StructuredOutputsParams``, engine side.

Exactly one kind is set: a JSON schema (``json``), any JSON object (``json_object``), a regular
expression (``regex``, matched in full), one string of a list (``choice``), an EBNF grammar
(``grammar``, xgrammar's dialect: GBNF with ``root ::= ...``) or an xgrammar structural tag
(``structural_tag``, a JSON document; the server builds the tool-call grammars this way). The text is
checked here; whether the backend can compile it is decided by :meth:`GrammarBackend.compile`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None     # a JSON schema, as an object or its text
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    # vLLM's switch: JSON without free whitespace between tokens (compact output, and no model can
    # pad a JSON answer with endless blank lines)
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_kinds = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise InvalidRequest("structured outputs need exactly one of json, json_object, regex, choice, grammar "
                                 f"or structural_tag; got {set_kinds or 'none'}")
        for name in ("json", "structural_tag"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as e:
                    raise InvalidRequest(f"the {name} structured output is not valid JSON: {e}") from None
            if value is not None and not isinstance(value, (dict, bool)):
                raise InvalidRequest(f"the {name} structured output must be a JSON object, got "
                                     f"{type(value).__name__}")
            if value is not None:
                # canonical text: the compile cache keys on it, and the dataclass stays hashable
                put(name, json.dumps(value, sort_keys=True, ensure_ascii=False))
        if not isinstance(self.json_object, bool) or not isinstance(self.disable_any_whitespace, bool):
            raise InvalidRequest("json_object and disable_any_whitespace must be true or false")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRequest(f"the {name} structured output must be a non-empty string")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice
                    or not all(isinstance(c, str) for c in self.choice)):
                raise InvalidRequest("the choice structured output must be a non-empty list of strings")
            put("choice", tuple(self.choice))

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> "StructuredOutputsParams":
        """From a request's object (vLLM's ``structured_outputs``); unknown keys are a 400 that names them."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InvalidRequest(f"structured_outputs has unknown field(s) {unknown}; valid: {sorted(known)}")
        return cls(**{k: v for k, v in fields.items() if v is not None})

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple:
        """Hashable identity of the grammar (the compile cache's key)."""
        return (self.kind, getattr(self, self.kind), self.disable_any_whitespace)
