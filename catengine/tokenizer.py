"""The HF tokenizer behind a model directory, its chat template, and streaming detokenization.

:class:`Tokenizer` loads ``tokenizer.json`` / ``tokenizer_config.json`` / ``generation_config.json``
from a model directory and renders chat prompts. :class:`IncrementalDetokenizer` turns one
request's generated token ids into text deltas that are safe to stream: no broken UTF-8 character
and no part of a stop string ever reaches a client.
"""
from __future__ import annotations

import copy
import functools
import inspect
import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import ConfigError, InvalidRequest, ModelLoadError
from .sampling import SamplingParams

# Prompt tokens decoded as left context of the first output token (vLLM uses 5): enough for
# tokenizers whose decoding of a token depends on its neighbours (SentencePiece spaces).
PROMPT_CONTEXT_TOKENS = 5
# An incomplete UTF-8 character is at most 3 bytes, so at most 3 tokens; more pending tokens than
# MAX_PENDING_TOKENS that still end in U+FFFD are invalid bytes and are released (bounds the window).
UTF8_TAIL_TOKENS = 3
MAX_PENDING_TOKENS = 8
_NON_TEXT_PARTS = ("image_url", "image", "input_image", "input_audio", "audio", "audio_url", "video",
                   "video_url", "file", "input_file")
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte-to-printable-character map that byte-level BPE vocabularies use."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}; fix or remove the file") from e


class Tokenizer:
    """A model directory's tokenizer.

    ``Tokenizer(path, chat_template=None)``: ``path`` holds ``tokenizer.json`` (+
    ``tokenizer_config.json``, optional ``generation_config.json`` and ``chat_template.jinja``).
    ``chat_template`` overrides the model's template: a path to a Jinja file or the template text.

    Attributes: ``hf`` (the transformers tokenizer), ``path``, ``generation_config`` (dict, empty if
    the file is absent), ``eos_token_ids`` (sorted tuple: generation_config's ``eos_token_id``, int
    or list, united with the tokenizer's EOS), ``vocab_size`` (ids the tokenizer knows, added tokens
    included; a model's embedding may be larger), ``chat_template`` (str, a {name: template} dict,
    or None).
    """

    def __init__(self, path: str | os.PathLike, chat_template: str | os.PathLike | None = None):
        self.path = Path(path)
        if not (self.path / "tokenizer.json").is_file() and not (self.path / "tokenizer_config.json").is_file():
            raise ModelLoadError(f"{self.path} has no tokenizer.json or tokenizer_config.json; "
                                 "point the model path at a Hugging Face model directory")
        self.hf = self._load_hf(self.path)
        self._local = threading.local()   # per-thread copies of hf (use_private_copy)
        self._backend = getattr(self.hf, "backend_tokenizer", None)
        self.generation_config: dict = _read_json(self.path / "generation_config.json")
        eos = self.generation_config.get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if self.hf.eos_token_id is not None:
            eos_ids.add(self.hf.eos_token_id)
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(int(i) for i in eos_ids))
        self.vocab_size: int = len(self.hf)
        self.chat_template = self._resolve_chat_template(chat_template)
        decoder = getattr(self._backend, "decoder", None) if self._backend is not None else None
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._byte_decoder = _gpt2_byte_decoder() if self._byte_level else {}
        self._render_params = set(inspect.signature(self.hf.apply_chat_template).parameters)

    @staticmethod
    def _load_hf(path: Path):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        try:
            return AutoTokenizer.from_pretrained(str(path))
        except Exception as auto_error:  # noqa: BLE001 (an unknown tokenizer_class: load the file itself)
            if not (path / "tokenizer.json").is_file():
                raise ModelLoadError(f"cannot load the tokenizer in {path}: {auto_error}") from auto_error
            config = _read_json(path / "tokenizer_config.json")
            kwargs = {k: config[k] for k in ("eos_token", "bos_token", "pad_token", "unk_token")
                      if isinstance(config.get(k), str)}
            try:
                return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), **kwargs)
            except Exception as e:  # noqa: BLE001
                raise ModelLoadError(f"cannot load {path / 'tokenizer.json'}: {e}") from e

    def _resolve_chat_template(self, override) -> str | dict[str, str] | None:
        if override is not None:
            text = str(override)
            if os.path.isfile(text):
                return Path(text).read_text(encoding="utf-8")
            if "{{" in text or "{%" in text:
                return text
            raise ConfigError(f"chat template {text!r} is neither an existing file nor Jinja template "
                              "text; pass a path to a .jinja file or the template itself")
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        template = _read_json(self.path / "tokenizer_config.json").get("chat_template")
        if template is None:
            template = getattr(self.hf, "chat_template", None)
        if isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}
        return template

    # ------------------------------------------------------------------ text <-> ids
    def use_private_copy(self) -> None:
        """Give the calling thread its own copy of the HF tokenizer for :meth:`encode` and
        :meth:`apply_chat_template` (a fast tokenizer's encode mutates its Rust state: two threads
        encoding with one object can fail with "Already borrowed"). For a second preparation worker;
        a deep copy takes a second or more for a 250k vocabulary."""
        self._local.hf = copy.deepcopy(self.hf)

    def _hf_here(self):
        hf = getattr(self._local, "hf", None)
        return self.hf if hf is None else hf

    @functools.cached_property
    def max_token_chars(self) -> int:
        """An upper bound of the characters one token stands for: the longest vocabulary piece
        (byte-level pieces hold one symbol per byte, and a character is at least one byte;
        SentencePiece pieces one symbol per character), times 2 for normalizers that compose
        characters (NFC: a letter and a combining mark become one). A text longer than
        ``n * max_token_chars`` cannot tokenize to ``n`` tokens or fewer. Computed on first use
        (about a second for a 250k vocabulary)."""
        hf = self._hf_here()
        backend = getattr(hf, "backend_tokenizer", None)
        vocab = backend.get_vocab(with_added_tokens=True) if backend is not None else hf.get_vocab()
        added = getattr(hf, "added_tokens_decoder", {}).values()
        return 2 * max([len(piece) for piece in vocab] + [len(str(t)) for t in added] + [1])

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. ``add_special_tokens`` adds what the tokenizer adds (a BOS for
        Llama-style models, nothing for Qwen); pass False for an already rendered chat prompt."""
        if not isinstance(text, str):
            raise InvalidRequest(f"prompt must be a string, got {type(text).__name__}")
        return list(self._hf_here().encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; never cleans up tokenization spaces, so that incremental decoding
        (:class:`IncrementalDetokenizer`) and a one-shot decode give the same text."""
        ids = [int(i) for i in ids]
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        """The decoded text of one token, special tokens included (may be U+FFFD for a partial
        UTF-8 byte sequence; use :meth:`token_bytes` for logprobs' ``bytes``)."""
        return self.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (OpenAI logprobs' ``bytes`` field)."""
        piece = self.hf.convert_ids_to_tokens(int(token_id))
        if piece is None:
            return b""
        added = getattr(self.hf, "added_tokens_decoder", {}).get(int(token_id))
        if added is not None:
            return str(added).encode("utf-8")
        if self._byte_level and all(c in self._byte_decoder for c in piece):
            return bytes(self._byte_decoder[c] for c in piece)
        match = _BYTE_TOKEN.fullmatch(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return self.token_text(token_id).encode("utf-8")

    # ------------------------------------------------------------------ chat
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping] | None = None,
                            add_generation_prompt: bool = True,
                            chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """Render ``messages`` (OpenAI chat format) into the prompt string.

        Content may be a string, None, or a list of ``{"type": "text", "text": ...}`` parts (joined
        with newlines, as vLLM does); image/audio/video/file parts raise InvalidRequest.
        ``reasoning`` and ``reasoning_content`` are both accepted on input messages (each fills the
        other). Tool-call ``arguments`` given as a JSON string are parsed into an object, since Qwen
        templates iterate over them. ``chat_template_kwargs`` (e.g. ``enable_thinking``) become
        template variables. Encode the result with ``encode(prompt, add_special_tokens=False)``.
        """
        template = self.chat_template
        if isinstance(template, dict):
            template = template.get("tool_use") if tools and "tool_use" in template else template.get("default")
        if not template:
            raise InvalidRequest("this model has no chat template; start the server with --chat-template "
                                 "or send a plain prompt to /v1/completions")
        kwargs = dict(chat_template_kwargs or {})
        reserved = sorted(k for k in kwargs if k in self._render_params or k == "messages")
        if reserved:
            raise InvalidRequest(f"chat_template_kwargs may not set {reserved}; use the request fields")
        conversation = self._normalise_messages(messages)
        from jinja2 import TemplateError
        try:
            prompt = self._hf_here().apply_chat_template(
                conversation, tools=list(tools) if tools else None, chat_template=template,
                add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)
        except TemplateError as e:
            raise InvalidRequest(f"the chat template rejected these messages: {e}") from e
        if not isinstance(prompt, str):
            raise InvalidRequest("the chat template did not render a single prompt string")
        return prompt

    @staticmethod
    def _normalise_messages(messages: Any) -> list[dict]:
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidRequest("messages must be a non-empty list of {role, content} objects")
        out = []
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                raise InvalidRequest(f"messages[{i}] must be an object with a string 'role'")
            message = copy.deepcopy(dict(message))
            message["content"] = _join_content(message.get("content"), i)
            reasoning = message.get("reasoning_content")
            reasoning = message.get("reasoning") if reasoning is None else reasoning
            if reasoning is not None:
                message["reasoning_content"] = message["reasoning"] = _join_content(reasoning, i)
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(function, dict):
                    raise InvalidRequest(f"messages[{i}].tool_calls[{j}] must have a 'function' object")
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        function["arguments"] = json.loads(arguments) if arguments.strip() else {}
                    except ValueError as e:
                        raise InvalidRequest(f"messages[{i}].tool_calls[{j}].function.arguments is not "
                                             f"valid JSON: {e}") from e
            out.append(message)
        return out


def _join_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise InvalidRequest(f"messages[{index}].content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _NON_TEXT_PARTS:
            raise InvalidRequest(f"messages[{index}].content[{j}] is a {kind!r} part, but this server "
                                 "serves text only; send text parts")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"messages[{index}].content[{j}] must be {{\"type\": \"text\", \"text\": <string>}}")
        texts.append(part["text"])
    return "\n".join(texts)


class IncrementalDetokenizer:
    """Streams one sequence's text as tokens arrive.

    ``add(token_id)`` returns the newly safe text. Decoding uses a sliding window of tokens (prefix /
    read offsets): only the tokens since the last complete character are decoded, so each call is
    O(1) in the output length. Text is held back (a) while the decoded tail ends in U+FFFD, i.e. an
    incomplete UTF-8 sequence, and (b) while a suffix of it could still grow into one of
    ``params.stop``. A stop string is looked for only in text produced after ``params.min_tokens``
    tokens and only where it ends in new text; when several match, the one that completes first
    (then the longest) wins. On a match ``stop_reason`` is the string, ``text`` is cut before it
    (kept with ``include_stop_str_in_output``) and ``finished`` becomes True; later ``add`` calls
    return "". The concatenation of every returned delta (``add``/``extend``/``flush``) equals
    ``text``.

    Special tokens are dropped when ``params.skip_special_tokens`` unless
    ``special_tokens_visible`` (tools active: ``<tool_call>`` must reach the tool parser).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], params: SamplingParams,
                 special_tokens_visible: bool = False):
        self.tokenizer = tokenizer
        self.params = params
        self.skip_special_tokens = params.skip_special_tokens and not special_tokens_visible
        self._done: list[str] = []     # returned deltas
        self._held = ""                # decoded text not returned yet (a possible stop-string start)
        self.finished = False
        self.stop_reason: str | None = None
        self.num_tokens = 0          # output tokens consumed (a stop token included)
        self._window = [int(t) for t in list(prompt_ids)[-PROMPT_CONTEXT_TOKENS:]]
        self._read = len(self._window)  # window[:_read] is decoded into text already
        self._stops = params.stop

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int, *, is_stop_token: bool = False) -> str:
        """Consume one generated token and return the text that became safe to emit.

        ``is_stop_token``: the token ended the sequence (EOS or a stop_token_id); its text is
        included only with ``include_stop_str_in_output``, everything held back is released and
        ``finished`` becomes True (``stop_reason`` stays None: the engine reports the token).
        """
        if self.finished:
            return ""
        self.num_tokens += 1
        if is_stop_token and not self.params.include_stop_str_in_output:
            return self._finish()
        self._window.append(int(token_id))
        if not self._advance(len(self._window), force=False) and \
                len(self._window) - self._read > MAX_PENDING_TOKENS:
            # No character takes this many tokens: the tail is invalid bytes (a model's garbage), not
            # an incomplete character. Release all but the tokens an incomplete character could span.
            self._advance(len(self._window) - UTF8_TAIL_TOKENS, force=True)
        if is_stop_token:
            return self._finish()
        return self._release()

    def extend(self, token_ids: Sequence[int]) -> str:
        """``add`` each token until finished; ``num_tokens`` tells how many were consumed."""
        deltas = []
        for token_id in token_ids:
            if self.finished:
                break
            deltas.append(self.add(token_id))
        return "".join(deltas)

    def flush(self) -> str:
        """End the sequence (e.g. by length): decode pending tokens even if their last character
        is incomplete, and return every held-back character. Idempotent."""
        return self._finish()

    def _advance(self, end: int, force: bool) -> bool:
        """Move the text of window[_read:end] into ``text`` unless it ends in an incomplete
        character (U+FFFD) and not ``force``; the decoded context shifts to start at _read."""
        prefix = self._decode(self._window[:self._read])
        full = self._decode(self._window[:end])
        if len(full) <= len(prefix) or (not force and full.endswith("\ufffd")):
            return False
        self._append(full[len(prefix):])
        self._window, self._read = self._window[self._read:], end - self._read
        return True

    def _append(self, delta: str) -> None:
        """Add decoded text to the held part; look for a stop string ending in it."""
        old = len(self._held)
        self._held += delta
        if not self._stops or self.num_tokens <= self.params.min_tokens:
            return
        best = None   # (end, -length, start, stop): the match completing first, then the longest
        for stop in self._stops:
            # matches never start in returned text: any prefix of a stop string is held back
            at = self._held.find(stop, max(0, old - len(stop) + 1))
            if at >= 0 and (best is None or (at + len(stop), -len(stop)) < best[:2]):
                best = (at + len(stop), -len(stop), at, stop)
        if best is not None:
            end, _, at, stop = best
            self._held = self._held[:end if self.params.include_stop_str_in_output else at]
            self.stop_reason = stop
            self.finished = True

    def _release(self) -> str:
        """Return the held text except a suffix that may still grow into a stop string."""
        if self.finished:
            return self._take(len(self._held))
        hold = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._held)), hold, -1):
                if self._held.endswith(stop[:k]):
                    hold = k
                    break
        return self._take(len(self._held) - hold)

    def _take(self, n: int) -> str:
        delta, self._held = self._held[:n], self._held[n:]
        if delta:
            self._done.append(delta)
        return delta

    def _finish(self) -> str:
        if not self.finished and self._read < len(self._window):
            self._advance(len(self._window), force=True)
        self._window, self._read = [], 0
        self.finished = True
        return self._take(len(self._held))

    @property
    def text(self) -> str:
        """The output text so far: every returned delta plus what is held back (O(length); stream
        the deltas instead of reading this per token)."""
        if len(self._done) > 1:
            self._done = ["".join(self._done)]
        return (self._done[0] if self._done else "") + self._held


__all__ = ["Tokenizer", "IncrementalDetokenizer", "PROMPT_CONTEXT_TOKENS"]
