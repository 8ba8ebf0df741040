"""The OpenAI wire format as msgspec structs: requests, responses, stream chunks and errors.

Requests ignore unknown fields (clients send many we do not use). Types are checked by msgspec while
decoding; ranges and cross-field rules are checked in ``validation.py`` so every message can say what
to change. Response structs are encoded with msgspec as well; non-finite floats must never reach the
encoder (msgspec would write ``null``), so logprobs are clamped where they are built.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

import msgspec

from ..errors import InvalidRequest

# ---------------------------------------------------------------------------------------------
# requests


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: FunctionDefinition


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: NamedFunction


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: dict[str, Any] | None = None


class FunctionCallIn(msgspec.Struct, kw_only=True):
    name: str
    # OpenAI sends a JSON string; some clients send the object itself
    arguments: str | dict[str, Any] | None = None


class ToolCallIn(msgspec.Struct, kw_only=True):
    id: str | None = None
    type: str = "function"
    function: FunctionCallIn


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    # a string, or a list of content parts ({"type": "text", "text": ...}); checked by the tokenizer
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _SamplingFields(msgspec.Struct, kw_only=True):
    """Fields shared by chat and completions (OpenAI names plus the vLLM extras clients send)."""
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    user: str | None = None
    request_id: str | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    prompt_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(_SamplingFields, kw_only=True):
    # a string, a list of strings, a list of token ids or a list of token-id lists; checked in validation
    prompt: str | list[Any]
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    response_format: ResponseFormat | None = None


log = logging.getLogger("catengine.server")
_warned_fields: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])   # keys only: the values stay undecoded


def _warn_unknown_fields(body: bytes, kind: type[msgspec.Struct]) -> None:
    """vLLM ignores fields it does not know and logs them; here each (request kind, field name) is
    logged once per process, so a client that always sends one extra field does not flood the log."""
    unknown = set(_top_level.decode(body)) - set(kind.__struct_fields__)
    with _warned_lock:
        new = sorted(name for name in unknown if (kind.__name__, name) not in _warned_fields)
        _warned_fields.update((kind.__name__, name) for name in new)
    if new:
        log.warning("%s: ignoring the unknown request field(s) %s (logged once per field name)",
                    kind.__name__, ", ".join(new))


def decode_request(body: bytes, kind: type[msgspec.Struct]):
    """Decode a JSON body into ``kind``; any malformed body or wrong type is an ``InvalidRequest``.
    Booleans are strict (msgspec's default): ``"stream": "no"`` is a 400, not a truthy string."""
    if not body:
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        req = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f"invalid request: {e}") from None
    except msgspec.DecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    _warn_unknown_fields(body, kind)
    return req


# ---------------------------------------------------------------------------------------------
# responses


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class UsageInfo(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None   # with --enable-prompt-tokens-details


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct, kw_only=True):
    content: list[TokenLogprob] | None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """The legacy completions format: parallel lists; the first echoed prompt token has ``None``."""
    text_offset: list[int] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    tokens: list[str] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)


class PromptLogprob(msgspec.Struct, kw_only=True):
    """vLLM's ``Logprob`` in ``prompt_logprobs``: one entry of a position's ``{token_id: ...}`` map."""
    logprob: float
    rank: int | None
    decoded_token: str | None


# vLLM's prompt_logprobs: per prompt position None (the first) or {token id (a string key in JSON): entry}
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class ResponseMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None   # vLLM's, not OpenAI's


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None   # vLLM's, not OpenAI's


class CompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


# --- stream chunks: absent fields are omitted, as OpenAI does in deltas


class DeltaFunctionCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


# The chunks themselves are not omit_defaults: that dropped ``object`` (a required field of the OpenAI
# schema). Only ``usage`` is left out, through UNSET, unless it is sent.
class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | msgspec.UnsetType = msgspec.UNSET


class CompletionChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: UsageInfo | msgspec.UnsetType = msgspec.UNSET


# --- models, errors



class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "catengine"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


class ErrorInfo(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: int | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorInfo


_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                405: "MethodNotAllowedError", 408: "RequestTimeoutError", 413: "BadRequestError",
                415: "BadRequestError", 429: "RateLimitError",
                500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """The OpenAI error object ``{"error": {...}}`` as JSON bytes."""
    info = ErrorInfo(message=message, type=_ERROR_TYPES.get(status, "BadRequestError"), param=param,
                     code=status)
    return msgspec.json.encode(ErrorResponse(error=info))


_encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)
