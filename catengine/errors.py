"""Typed errors. Every message says what to change."""


class CatEngineError(Exception):
    """Base class of every error catengine raises on purpose."""


class ConfigError(CatEngineError, ValueError):
    """An engine or model setting is invalid; the message names the setting and a valid value."""


class KernelContractError(CatEngineError):
    """A kernel was called with tensors that break its contract (shape, dtype, layout): a bug in the caller, never
    the client's fault (the server answers 500 and logs it)."""


class ModelLoadError(CatEngineError):
    """A checkpoint cannot be loaded (missing/unexpected tensors, unsupported format)."""


class InvalidRequest(CatEngineError, ValueError):
    """A request is malformed or asks for something impossible (HTTP 400)."""


class ContextTooLong(InvalidRequest):
    """Prompt plus requested output does not fit max_model_len (HTTP 400)."""


class CapacityExceeded(CatEngineError):
    """The KV cache or state slots cannot hold even one sequence of the requested size."""


class EngineDead(CatEngineError):
    """The engine loop failed; no further requests can be served (HTTP 503)."""
