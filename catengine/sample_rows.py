"""Which rows a step samples (a sequence finishing its pending tokens, and its forks) and the lazy views of their
prompt and output tokens that the penalties read, so that the runner copies nothing per step for rows that use no
penalty."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .scheduler import SchedulerOutput


@dataclass
class SampleRows:
    """One entry per sampled row, in SchedulerOutput order: (sequence, is its own row), the hidden row,
    params, seed, output step and grammar state (None: a free row)."""
    rows: list
    last_index: list[int]
    params: list
    seeds: list[int]
    steps: list[int]
    grammars: list


class LazyRows:
    """A lazy list: element i is ``fn(i)``; the sampler only reads the rows that need a value (e.g.
    the prompt ids of rows with a repetition penalty), so long prompts are not copied every step."""

    def __init__(self, n: int, fn):
        self._n, self._fn = n, fn

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        return self._fn(i)


class Tail:
    """``tokens[start:]`` without the copy: the penalty code asks every row for ``len`` each step but
    iterates only the rows that use penalties."""

    __slots__ = ("tokens", "start")

    def __init__(self, tokens: list[int], start: int):
        self.tokens, self.start = tokens, start

    def __len__(self) -> int:
        return len(self.tokens) - self.start

    def __iter__(self):
        return itertools.islice(self.tokens, self.start, None)


def sample_rows(out: SchedulerOutput) -> SampleRows:
    """The rows a step samples, in SchedulerOutput order: a sequence whose step ends its pending tokens, then its
    forks (which share its last-token logits)."""
    rows, last_index, params, seeds, steps, grammars = [], [], [], [], [], []
    offset = 0
    for it in out.scheduled:
        offset += it.num_new
        if not it.num_samples:
            continue
        seq = it.seq
        rows.append((seq, True))
        last_index.append(offset - 1)
        params.append(seq.params)
        seeds.append(seq.seed)
        steps.append(seq.num_output_tokens)
        grammars.append(seq.grammar)
        for seed, child_params in seq.forks:   # the leader's forks share its last-token logits
            rows.append((seq, False))
            last_index.append(offset - 1)
            params.append(child_params)
            seeds.append(seed)
            steps.append(0)
            # nothing is generated yet, so the leader's grammar state is every fork's first state
            grammars.append(seq.grammar)
    return SampleRows(rows, last_index, params, seeds, steps, grammars)


def penalty_views(rows: list) -> tuple[LazyRows, LazyRows]:
    """(prompt ids, generated ids) per row for ``sampling.apply_penalties``; a fork row has generated nothing."""
    prompts = LazyRows(len(rows), lambda i: rows[i][0].prompt_token_ids)
    outputs = LazyRows(len(rows), lambda i: Tail(rows[i][0].token_ids, rows[i][0].num_prompt_tokens)
                       if rows[i][1] else ())
    return prompts, outputs
