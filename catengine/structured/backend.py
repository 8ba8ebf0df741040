"""The grammar backend: xgrammar (vLLM's and SGLang's default).

Why xgrammar rather than llguidance (both tried on the demo's 248K-token Qwen3.5 vocabulary; the
timings are in bench/NOTES.md): its tokenizer table builds faster, it precomputes each grammar's token
masks at compile time, its EBNF and JSON-schema dialects are what vLLM users send with the default
backend, and it ships the Qwen XML tool-call format (``style="qwen_xml"``) that the ``qwen3_coder``
parser reads. It needs torch, which the engine has anyway (CPU torch is enough).

One :class:`GrammarBackend` per engine, built on the first structured request (the tokenizer table
costs about 2 s): :meth:`compile` runs on the preparation thread (xgrammar caches compiled grammars
by their text), :meth:`matcher` on the engine thread when a request is queued.
"""
from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence

from ..errors import ConfigError, InvalidRequest
from .matcher import GrammarState
from .params import StructuredOutputsParams

log = logging.getLogger("catengine")

BACKENDS = ("auto", "xgrammar")
# vLLM's other backend names: refused by name, so a vLLM command line says what to change
OTHER_BACKENDS = ("guidance", "outlines", "lm-format-enforcer")
_CPP_PREFIX = re.compile(r"^\s*\[[0-9:]+\]\s+\S+?:\d+:\s*", re.M)


def check_backend(name: str) -> str:
    """The backend's canonical name; ConfigError for anything else."""
    if name in BACKENDS:
        return "xgrammar"
    hint = (f"; {name!r} is one of vLLM's backends, catengine builds in xgrammar only"
            if name in OTHER_BACKENDS else "")
    raise ConfigError(f"structured outputs backend {name!r} is not supported{hint}: use \"auto\" or \"xgrammar\"")


def backend_message(error: BaseException) -> str:
    """xgrammar's message without the C++ source location it prefixes."""
    return _CPP_PREFIX.sub("", str(error)).strip() or type(error).__name__


class GrammarBackend:
    def __init__(self, hf_tokenizer, vocab_size: int, stop_token_ids: Sequence[int]):
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(sorted(stop_token_ids))
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(self.stop_token_ids))
        # one thread: the preparation thread compiles while the engine thread steps, on few cores
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.bitmask_width = xgr.get_bitmask_shape(1, vocab_size)[1]
        self._lock = threading.Lock()
        self.num_live = 0            # matchers not released yet (tests check that none leak)

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar of ``spec``; InvalidRequest with the backend's message when it does not
        compile (a bad schema, regex or grammar is the client's to fix)."""
        kind, value = spec.kind, getattr(spec, spec.kind)
        try:
            if kind == "json":
                return self._compiler.compile_json_schema(value, any_whitespace=not spec.disable_any_whitespace)
            if kind == "json_object":
                if spec.disable_any_whitespace:
                    return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
                return self._compiler.compile_json_schema('{"type": "object"}')
            if kind == "regex":
                return self._compiler.compile_regex(value)
            if kind == "choice":
                return self._compiler.compile_regex("|".join(re.escape(c) for c in value))
            if kind == "grammar":
                return self._compiler.compile_grammar(value)
            return self._compiler.compile_structural_tag(json.loads(value))
        except Exception as e:  # noqa: BLE001 (RuntimeError from C++, pydantic's ValidationError, ValueError)
            raise InvalidRequest(f"the {kind} structured output does not compile: {backend_message(e)}") from None

    def matcher(self, compiled, stop_token_ids: Sequence[int] = ()) -> GrammarState:
        """A fresh matcher of one sequence. ``stop_token_ids``: the tokens that end this request (the
        grammar allows them only where it accepts); the engine's EOS ids when empty."""
        stops = sorted(set(stop_token_ids)) or list(self.stop_token_ids)
        with self._lock:
            self.num_live += 1
        return GrammarState(self._xgr.GrammarMatcher(compiled, override_stop_tokens=stops), self._released)

    def _released(self) -> None:
        with self._lock:
            self.num_live -= 1
