"""What the engine hands back: whole-request outputs (``generate``/``step``) and stream deltas.

Times are ``time.time()`` seconds (wall clock), so they can be compared with a server's clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .sampling import TokenLogprobs


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a request."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None           # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None       # the stop string or stop token id that ended it (None: EOS)
    logprobs: list[TokenLogprobs] | None = None  # one entry per token, when the request asked for logprobs
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state so far (``finished`` when every completion ended). The attributes of the
    first completion are also exposed directly: ``out.text``, ``out.token_ids``, ``out.finish_reason``,
    ``out.stop_reason``, ``out.logprobs``."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0                 # prompt tokens served from the prefix cache
    # SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (nothing precedes it)
    prompt_logprobs: list[TokenLogprobs | None] | None = None

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def stop_reason(self) -> int | str | None:
        return self.outputs[0].stop_reason

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        return self.outputs[0].logprobs


@dataclass
class StreamDelta:
    """What one completion gained in one engine step (``AsyncEngine.stream`` yields these).

    ``text`` is safe to show (no broken UTF-8 character, no part of a stop string); the deltas'
    ``text`` concatenate to the final text and their ``token_ids`` to the final token ids. The last
    delta of a completion has ``finished`` True and its ``finish_reason`` / ``stop_reason``.
    """
    request_id: str
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int                      # of this completion so far
    num_cached_tokens: int
    time: float                                 # when the engine produced it
    metrics: RequestMetrics = field(repr=False, default=None)
    prompt_token_ids: list[int] = field(repr=False, default_factory=list)
    # the request's prompt logprobs (as RequestOutput's), on each completion's first delta only
    prompt_logprobs: list[TokenLogprobs | None] | None = field(repr=False, default=None)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
