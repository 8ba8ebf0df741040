"""What a step gives back: :class:`RunnerOutput` (tokens, logprobs, prompt logprobs, accepted drafts) and the
:class:`PendingStep` that holds it until the step's sampled tokens reach the host."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import TokenLogprobs
from .scheduler import Sequence
from .spec.rows import merge_rows


@dataclass
class RunnerOutput:
    token_ids: list[int]                      # one per sample row (SchedulerOutput row order)
    logprobs: list[TokenLogprobs | None]      # same rows
    forward_seconds: float = 0.0
    # (sequence, position of the first entry, logprobs of its prompt tokens from there), per prompt chunk
    # of a request with prompt_logprobs
    prompt_logprobs: list[tuple[Sequence, int, list[TokenLogprobs]]] = field(default_factory=list)
    # speculative verification: sample row -> the tokens it adds (accepted drafts, then the target's next)
    accepted: dict[int, list[int]] = field(default_factory=dict)


class PendingStep:
    """A launched step: its sampled tokens on the device (``tokens``, one per sample row that the acceptance
    did not give, which async scheduling feeds to the next step), on their way to the host (a copy into pinned
    memory behind an event, so that waiting for them does not wait for the step queued after)."""

    def __init__(self, tokens: torch.Tensor | None, output: RunnerOutput):
        self.tokens, self._output = tokens, output
        self._host, self._event = tokens, None
        if tokens is not None and tokens.is_cuda:
            self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    @classmethod
    def done(cls, output: RunnerOutput) -> "PendingStep":
        return cls(None, output)

    def result(self) -> RunnerOutput:
        """The step's RunnerOutput (waits for its tokens, not for any later step)."""
        out = self._output
        if self._host is not None:
            if self._event is not None:
                self._event.synchronize()
            out.token_ids, out.logprobs = merge_rows(self._host.tolist(), out.logprobs, out.accepted)
            self._host = self._event = None
        return out
