"""Request fields -> :class:`StructuredOutputsParams`: OpenAI's ``response_format``, vLLM's
``structured_outputs`` and its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar``, and the grammar of a forced tool call (``tool_choice`` "required" or named).

A forced call's prompt already opens it (chat.py's prefix); the grammar is the rest of the call in the
format the tool parser reads: Qwen XML parameters for ``qwen3_coder`` (xgrammar's ``qwen_xml`` style
converts each parameter by the tool's JSON schema), a JSON ``arguments`` object for ``hermes``; then
``</tool_call>`` and EOS. One call: a forced choice asks for a call, not for several.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from ..structured import StructuredOutputsParams
from ..structured.backend import check_backend
from ..errors import ConfigError

# a call's layout whitespace is fixed by its format; free runs of it are how a weak model never ends a call
MAX_CALL_WHITESPACE = 2
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def request_structured_outputs(req: Any) -> StructuredOutputsParams | None:
    """The grammar a request asks for, None when it asks for none; at most one way of asking."""
    asked: dict[str, StructuredOutputsParams] = {}
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type == "json_object":
        asked["response_format"] = StructuredOutputsParams(json_object=True)
    elif fmt is not None and fmt.type == "json_schema":
        spec = fmt.json_schema or {}
        schema = spec.get("schema", spec.get("json_schema")) if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequest('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}; '
                                 "the schema is missing")
        asked["response_format"] = StructuredOutputsParams(json=schema if isinstance(schema, dict) else {})
    if req.structured_outputs is not None:
        asked["structured_outputs"] = StructuredOutputsParams.from_dict(dict(req.structured_outputs))
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            asked[name] = StructuredOutputsParams(**{kind: value})
    if req.guided_decoding_backend is not None:
        try:
            check_backend(req.guided_decoding_backend)
        except ConfigError as e:
            raise InvalidRequest(str(e)) from None
    if len(asked) > 1:
        raise InvalidRequest(f"the request asks for structured output in {len(asked)} ways ({sorted(asked)}); "
                             "send one of them")
    return next(iter(asked.values()), None)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object", "properties": {}}


def tool_call_grammar(tools: list[dict[str, Any]], parser: str, name: str | None) -> StructuredOutputsParams:
    """The rest of a forced call after chat.py's prompt prefix: of the tool ``name``, or (required) of any."""
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if parser == "qwen3_coder":
        end = "\n</function>\n</tool_call>"

        def body(tool):
            return {"type": "json_schema", "json_schema": _parameters(tool), "style": "qwen_xml",
                    "max_whitespace_cnt": MAX_CALL_WHITESPACE}
        head = (lambda tool: f"{tool['function']['name']}>\n")
    else:   # hermes
        end = "}\n</tool_call>"

        def body(tool):
            return {"type": "json_schema", "json_schema": _parameters(tool), "max_whitespace_cnt": MAX_CALL_WHITESPACE}
        head = (lambda tool: json.dumps(tool["function"]["name"], ensure_ascii=False)[1:] + ', "arguments": ')
    if name is not None:
        fmt = {"type": "sequence", "elements": [body(chosen[0]), {"type": "const_string", "value": end}]}
    else:
        fmt = {"type": "or", "elements": [
            {"type": "sequence", "elements": [{"type": "const_string", "value": head(t)}, body(t),
                                              {"type": "const_string", "value": end}]} for t in chosen]}
    return StructuredOutputsParams(structural_tag={"type": "structural_tag", "format": fmt})
