"""vLLM's ``POST /tokenize`` and ``POST /detokenize``, outside ``/v1`` as in vLLM (so without the API key).

``/tokenize`` takes a ``prompt`` (encoded as ``/v1/completions`` encodes it) or chat ``messages``
(rendered with the chat template as ``/v1/chat/completions`` renders them, tools included); the
token count is what a request of the same input would be billed as prompt tokens.
"""
from __future__ import annotations

from typing import Any

import msgspec

from ..errors import InvalidRequest
from .chat import render_messages, tool_dicts
from .protocol import ChatMessage, ToolDefinition
from .serving import ServerContext, check_token_ids


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """``prompt`` (vLLM's TokenizeCompletionRequest) or ``messages`` (TokenizeChatRequest)."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # vLLM's defaults: True for a prompt, False for messages (the template adds what the model needs)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


def tokenize(ctx: ServerContext, req: TokenizeRequest) -> TokenizeResponse:
    if (req.prompt is None) == (req.messages is None):
        raise InvalidRequest("send either \"prompt\" (a string) or \"messages\" (a chat), not both or neither")
    if req.continue_final_message:
        raise InvalidRequest("continue_final_message is not supported; tokenize the text with \"prompt\"")
    if req.prompt is not None:
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = ctx.tokenizer.encode(req.prompt, add_special_tokens=add_special)
    else:
        if not req.messages:
            raise InvalidRequest("messages must be a non-empty list of {role, content} objects")
        prompt = render_messages(ctx, req.messages, tool_dicts(req.tools), dict(req.chat_template_kwargs or {}),
                                 req.add_generation_prompt)
        ids = ctx.tokenizer.encode(prompt, add_special_tokens=bool(req.add_special_tokens))
    strs = [ctx.tokenizer.hf.convert_ids_to_tokens(i) for i in ids] if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids, token_strs=strs)


def detokenize(ctx: ServerContext, req: DetokenizeRequest) -> DetokenizeResponse:
    ids = check_token_ids(req.tokens, ctx.vocab_size, "tokens")
    return DetokenizeResponse(prompt=ctx.tokenizer.decode(ids, skip_special_tokens=False))


__all__ = ["tokenize", "detokenize", "TokenizeRequest", "DetokenizeRequest"]
