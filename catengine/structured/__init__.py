"""Structured outputs: grammars that decide which tokens a sequence may sample next.

``params.py`` (what a request asks for) -> ``backend.py`` (xgrammar: compile, one matcher per sequence)
-> ``matcher.py`` (the per-sequence state) -> ``bitmask.py`` (the batch's mask rows, filled on the CPU,
applied on the device by ``ops.apply_token_bitmask``). docs/architecture.md walks the whole path.
"""
from .backend import BACKENDS, GrammarBackend, check_backend
from .matcher import GrammarState
from .params import StructuredOutputsParams

__all__ = ["BACKENDS", "GrammarBackend", "GrammarState", "StructuredOutputsParams", "check_backend"]
