"""catengine: a compact Qwen3.5/3.6 inference engine in Python and Triton."""
from __future__ import annotations

__version__ = "0.1.0"

# Public API, imported lazily so `import catengine` stays cheap (the CLI and kernels import it).
_LAZY = {
    "Engine": "catengine.engine",
    "AsyncEngine": "catengine.async_engine",
    "SamplingParams": "catengine.sampling",
    "EngineConfig": "catengine.config",
}

__all__ = list(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'catengine' has no attribute {name!r}")
