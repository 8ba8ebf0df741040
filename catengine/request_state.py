"""Per-request bookkeeping of the engine: completions, detokenizers, stop checks, outputs.

The scheduler knows sequences; the engine knows requests. A request holds ``n`` completions; each
completion is fed the tokens its sequence samples and decides when it is done (stop token, stop
string, max_tokens, context full). Everything here runs on the engine's thread.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .outputs import CompletionOutput, RequestMetrics, RequestOutput, StreamDelta
from .sampling import SamplingParams, TokenLogprobs
from .tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger("catengine")


@dataclass
class PreparedRequest:
    """A validated request, ready to queue (built off the engine thread by ``prepare_request``)."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    completion_params: list[SamplingParams]   # per completion, n = 1
    seeds: list[int]
    arrival_time: float
    special_tokens_visible: bool = False
    grammar: Any = None          # the compiled grammar of a structured-outputs request (each completion gets a matcher)


class Completion:
    def __init__(self, index: int, params: SamplingParams, seed: int, detok: IncrementalDetokenizer,
                 stop_ids: frozenset[int], max_tokens: int):
        self.index = index
        self.params = params
        self.seed = seed
        self.detok = detok
        self.stop_ids = stop_ids
        self.max_tokens = max_tokens
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.text = ""                 # what has been emitted (the concatenation of the deltas)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.seq = None                # the scheduler's Sequence, once it exists
        self.grammar = None            # structured outputs: this completion's GrammarState, released at the finish
        # accumulated since the last delta
        self.new_text: list[str] = []
        self.new_ids: list[int] = []
        self.new_logprobs: list[TokenLogprobs] = []
        self.touched = False
        self.sent_prompt_logprobs = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add_token(self, token: int, logprobs: TokenLogprobs | None, max_model_len: int,
                  num_prompt_tokens: int) -> str | None:
        """Take one sampled token; returns the finish reason when this token ended the completion."""
        self.token_ids.append(token)
        self.new_ids.append(token)
        self.touched = True
        if logprobs is not None and self.logprobs is not None:
            self.logprobs.append(logprobs)
            self.new_logprobs.append(logprobs)
            self.cumulative_logprob += logprobs.logprob
        n_out = len(self.token_ids)
        is_stop_token = token in self.stop_ids and n_out >= self.params.min_tokens
        if self.grammar is not None:
            if not self.grammar.accept(token):
                # only possible when the mask allowed nothing (min_tokens masking the stop tokens of a
                # grammar that has ended): the output so far is what the grammar allowed
                log.warning("structured output: token %d is not allowed by the grammar; ending the completion",
                            token)
                self._emit(self.detok.add(token, is_stop_token=True))
                return self.finish("stop")
            is_stop_token = is_stop_token or self.grammar.terminated   # its end ends the output (ignore_eos too)
        self._emit(self.detok.add(token, is_stop_token=is_stop_token))
        if is_stop_token:
            stop_reason = token if token in self.params.stop_token_ids else None
            return self.finish("stop", stop_reason)
        if self.detok.finished:
            return self.finish("stop", self.detok.stop_reason)
        if n_out >= self.max_tokens or num_prompt_tokens + n_out >= max_model_len:
            return self.finish("length")
        return None

    def finish(self, reason: str, stop_reason: int | str | None = None) -> str:
        if self.grammar is not None:
            self.grammar.release()
        if self.finish_reason is None:
            self._emit(self.detok.flush())
            self.finish_reason, self.stop_reason = reason, stop_reason
            self.touched = True
        return reason

    def _emit(self, text: str) -> None:
        if text:
            self.text += text
            self.new_text.append(text)

    def clear_deltas(self) -> None:
        """Forget what accumulated since the last delta (the batch API reads whole outputs instead)."""
        if self.touched:
            self.new_text, self.new_ids, self.new_logprobs, self.touched = [], [], [], False

    def output(self) -> CompletionOutput:
        return CompletionOutput(self.index, self.text, list(self.token_ids), self.finish_reason, self.stop_reason,
                                None if self.logprobs is None else list(self.logprobs), self.cumulative_logprob)


class RequestState:
    def __init__(self, prep: PreparedRequest, tokenizer: Tokenizer, eos_ids: tuple[int, ...]):
        self.request_id = prep.request_id
        self.prompt = prep.prompt
        self.prompt_token_ids = prep.prompt_token_ids
        self.metrics = RequestMetrics(arrival_time=prep.arrival_time)
        self.num_cached_tokens = 0
        self.prompt_logprobs: list[TokenLogprobs | None] | None = (
            [None] if prep.params.prompt_logprobs is not None else None)
        self.completions = [
            Completion(i, p, seed, IncrementalDetokenizer(tokenizer, prep.prompt_token_ids, p,
                                                          special_tokens_visible=prep.special_tokens_visible),
                       p.stop_token_set(eos_ids), prep.max_tokens)
            for i, (p, seed) in enumerate(zip(prep.completion_params, prep.seeds))]

    @property
    def finished(self) -> bool:
        for c in self.completions:   # a plain loop: read twice per request per step, mostly with one completion
            if c.finish_reason is None:
                return False
        return True

    def add_prompt_logprobs(self, first: int, entries: list[TokenLogprobs]) -> None:
        """Entries for prompt positions ``first, first + 1, ...`` (a chunk's); positions already held
        (a prompt recomputed after preemption) are skipped."""
        have = len(self.prompt_logprobs)
        if first > have:
            raise RuntimeError(f"prompt logprobs of {self.request_id} skip positions {have}..{first - 1}; "
                               "this is a bug")
        self.prompt_logprobs.extend(entries[have - first:])

    def output(self) -> RequestOutput:
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids),
                             [c.output() for c in self.completions], self.finished, self.metrics,
                             self.num_cached_tokens,
                             None if self.prompt_logprobs is None else list(self.prompt_logprobs))

    def clear_deltas(self) -> None:
        """What :meth:`take_deltas` forgets, without building the deltas (a caller reading whole outputs)."""
        for c in self.completions:
            if c.touched:
                c.clear_deltas()
                c.sent_prompt_logprobs = True

    def take_deltas(self, now: float) -> list[StreamDelta]:
        """Deltas of the completions that changed since the last call."""
        deltas = []
        for c in self.completions:
            if not c.touched:
                continue
            deltas.append(StreamDelta(
                request_id=self.request_id, index=c.index, text="".join(c.new_text), token_ids=c.new_ids,
                logprobs=c.new_logprobs if c.logprobs is not None else None, finish_reason=c.finish_reason,
                stop_reason=c.stop_reason, num_prompt_tokens=len(self.prompt_token_ids),
                num_output_tokens=len(c.token_ids), num_cached_tokens=self.num_cached_tokens, time=now,
                metrics=self.metrics, prompt_token_ids=self.prompt_token_ids,
                prompt_logprobs=None if c.sent_prompt_logprobs else self.prompt_logprobs))
            c.new_text, c.new_ids, c.new_logprobs, c.touched = [], [], [], False
            c.sent_prompt_logprobs = True
        return deltas
