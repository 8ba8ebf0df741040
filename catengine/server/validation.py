"""Request checks shared by chat and completions, and the mapping onto ``SamplingParams``.

Every rule raises ``InvalidRequest`` (HTTP 400) with a message naming the field and what to send
instead. Ranges of the sampling fields themselves are checked by ``SamplingParams``; here live the
rules that involve the protocol (stream_options without stream, top_logprobs without logprobs,
prompt and output lengths against the context) and the defaults (generation_config.json, then
OpenAI's).
"""
from __future__ import annotations

from typing import Any

from ..errors import ContextTooLong, InvalidRequest
from ..sampling import MAX_LOGPROBS, SamplingParams

MAX_N = 128                  # more choices than this is a mistake, not a use case
MAX_STOP_STRINGS = 64
SEED_RANGE = (-(2**63), 2**64 - 1)
_FORMAT_TYPES = ("text", "json_object", "json_schema")


def check_common(req: Any) -> None:
    if not 1 <= req.n <= MAX_N:
        raise InvalidRequest(f"n must be an integer in [1, {MAX_N}], got {req.n}", )
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("stream_options can only be set when stream is true; drop stream_options or set "
                             "\"stream\": true")
    if req.seed is not None and not SEED_RANGE[0] <= req.seed <= SEED_RANGE[1]:
        raise InvalidRequest(f"seed must be a 64-bit integer, got {req.seed}")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"stop may list at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
    echo_only = getattr(req, "echo", False) and req.max_tokens == 0   # completions: the prompt, scored
    if req.max_tokens is not None and req.max_tokens < 1 and not echo_only:
        raise InvalidRequest(f"max_tokens must be at least 1 (0 only with \"echo\": true, which returns the "
                             f"prompt alone), got {req.max_tokens}")
    check_logprobs(req.prompt_logprobs, "prompt_logprobs")
    if req.stream and req.prompt_logprobs:
        raise InvalidRequest("prompt_logprobs are not available when stream is true (as in vLLM); drop one of "
                             "them (completions: echo with logprobs streams the prompt's logprobs)")
    fmt = getattr(req, "response_format", None)
    if fmt is not None:
        if fmt.type not in _FORMAT_TYPES:
            raise InvalidRequest(f"response_format.type must be one of {list(_FORMAT_TYPES)}, got {fmt.type!r}")
        if fmt.type != "text":
            raise InvalidRequest(f"response_format {fmt.type!r} needs guided decoding, which this server does "
                                 "not support yet; drop response_format (or use {\"type\": \"text\"}) and ask "
                                 "for JSON in the prompt")


# OpenAI requires content on these roles; an assistant message may carry only tool_calls (or be a prefill)
CONTENT_ROLES = ("system", "developer", "user", "tool")
# chat_template_kwargs the server itself reads (the template sees them too); each must be a JSON boolean
BOOL_TEMPLATE_KWARGS = ("enable_thinking",)


def check_messages(messages: list[Any]) -> None:
    """A message of a role OpenAI requires content for, sent without content (or with null), is a 400:
    rendered, it would be an empty turn the model answers at length."""
    for i, m in enumerate(messages):
        if m.role in CONTENT_ROLES and m.content is None:
            raise InvalidRequest(f"messages[{i}] (role {m.role!r}) has no content; {m.role} messages need "
                                 "\"content\": a string or a list of {\"type\": \"text\", \"text\": ...} parts")


def check_template_kwargs(kwargs: dict[str, Any]) -> None:
    """Booleans the server acts on are parsed strictly: ``"no"`` is truthy to Python and Jinja alike (vLLM's
    qwen3 reasoning parser and the Qwen templates would both read it as thinking on), so anything but
    true/false is refused instead of guessed."""
    for key in BOOL_TEMPLATE_KWARGS:
        if key in kwargs and not isinstance(kwargs[key], bool):
            raise InvalidRequest(f"chat_template_kwargs.{key} must be true or false (a JSON boolean), got "
                                 f"{kwargs[key]!r}")


def sampling_fields(req: Any, logprobs: int | None, prompt_logprobs: int | None = None) -> dict[str, Any]:
    """SamplingParams fields a request set (None = unset: generation_config then defaults apply)."""
    return {
        "prompt_logprobs": prompt_logprobs,
        "n": req.n, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "logit_bias": req.logit_bias, "seed": req.seed,
        "min_tokens": req.min_tokens, "stop": req.stop, "stop_token_ids": req.stop_token_ids,
        "ignore_eos": req.ignore_eos, "logprobs": logprobs, "skip_special_tokens": req.skip_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
    }


def check_length(prompt_len: int, max_model_len: int, requested: int | None, what: str = "messages") -> int:
    """Room left for output; raises ContextTooLong when the prompt (plus an explicit max_tokens)
    cannot fit, before any work is done."""
    if prompt_len < 1:
        raise InvalidRequest("the prompt is empty; send at least one token")
    room = max_model_len - prompt_len
    if room < 1:
        raise ContextTooLong(f"This model's maximum context length is {max_model_len} tokens. However, your "
                             f"request has {prompt_len} input tokens. Please reduce the length of the {what}.")
    if requested is not None and requested > room:
        raise ContextTooLong(f"This model's maximum context length is {max_model_len} tokens. However, you "
                             f"requested {prompt_len + requested} tokens ({prompt_len} in the {what}, {requested} "
                             f"in the completion). Please reduce the length of the {what} or completion.")
    return room


def build_params(fields: dict[str, Any], generation_config: dict[str, Any], requested_max: int | None,
                 room: int, default_max: int | None, vocab_size: int) -> SamplingParams:
    """SamplingParams with request > generation_config > default precedence; an unrequested max_tokens
    (a default or generation_config's max_new_tokens) is capped to the room left in the context."""
    if requested_max is not None:
        fields = {**fields, "max_tokens": requested_max}
    params = SamplingParams.from_request(fields, generation_config, default_max_tokens=default_max or room)
    if requested_max is None and (params.max_tokens is None or params.max_tokens > room):
        params = SamplingParams.from_request({**fields, "max_tokens": room}, generation_config)
    params.verify_vocab(vocab_size)
    return params


def check_logprobs(n: int | None, what: str) -> None:
    if n is not None and not 0 <= n <= MAX_LOGPROBS:
        raise InvalidRequest(f"{what} must be an integer in [0, {MAX_LOGPROBS}], got {n}")
