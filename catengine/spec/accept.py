"""Acceptance of a verify step's drafts, and which requests may draft at all.

Every position of a verify item is sampled exactly as a decode step would sample it: the same penalties over
the tokens before it (the accepted drafts included), the same request seed and output step, so the same
counter-based uniforms (``sampling.sample`` is a pure function of logits row, params, seed and step). The
drafts are accepted while they equal those tokens; the first that differs is replaced by the target's token
(and when all match, the token after the last draft is the bonus). So a request produces, token for token,
what it produces without speculation (greedy or seeded sampling alike), hence the same distribution.

This is Leviathan et al.'s rejection sampling for a deterministic (one-hot) draft, with its randomness
coupled to the non-speculative draw: the sampler takes argmax(p / -log u) over the kept tokens, which equals
the draft d with probability p(d) (Leviathan's acceptance min(1, p(d) / q(d)) for q = one-hot d) and is
otherwise distributed as p restricted to the other tokens (Leviathan's residual norm(max(0, p - q))).
"""
from __future__ import annotations

import torch

from ..sample_rows import LazyRows
from ..sampling import apply_penalties, sample
from ..scheduler import SchedulerOutput
from .drafter import fill_drafts


def can_draft(params, grammar=None) -> bool:
    """True when a request may verify drafts: anything but logprobs (one entry per step, not per accepted
    token, in RunnerOutput) and structured outputs (the grammar would have to check each draft first)."""
    if params is None:
        return False
    return params.logprobs is None and grammar is None and params.structured_outputs is None


def _penalized(p, num_output_tokens: int) -> bool:
    """Whether apply_penalties would change a row of these params (min_tokens: at the item's first position,
    which has the fewest output tokens); else the acceptance skips it and its per-row views."""
    return bool(p.logit_bias or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
                or num_output_tokens < p.min_tokens)


def verify_items(out: SchedulerOutput):
    """(sample row, first hidden row, item) of every verify item."""
    offset = row = 0
    for it in out.scheduled:
        if it.num_drafts:
            yield row, offset, it
        offset += it.num_new
        row += it.num_samples


def accept(model, hidden: torch.Tensor, out: SchedulerOutput, eos_token_ids=(),
           drafts: torch.Tensor | None = None) -> dict[int, list[int]]:
    """row -> the tokens a verify item adds: its drafts up to the first that differs from the target's own
    token there, then that token (the bonus token after the last draft when all matched). ``drafts``: the
    drafts [b, k] still on the device (every scheduled item verifies k), copied to the items' draft_tokens
    here, in the same host copy as the target's tokens when no penalty needs them first."""
    items = list(verify_items(out))
    if not items:
        return {}
    index, params, seeds, steps = [], [], [], []
    penalized = False
    for _, first, it in items:
        seq, o = it.seq, it.seq.num_output_tokens
        p = seq.params
        penalized = penalized or _penalized(p, o)
        q = it.num_drafts + 1   # position i draws output token o + i after drafts[:i]
        index.extend(range(first, first + q))
        params.extend([p] * q)
        seeds.extend([seq.seed] * q)
        steps.extend(range(o, o + q))
    if index[-1] + 1 == len(index) == hidden.shape[0]:   # every hidden row is a verify row (uniform steps)
        logits = model.compute_logits(hidden)
    else:
        logits = model.compute_logits(hidden.index_select(0, torch.tensor(index, dtype=torch.int64,
                                                                          device=hidden.device)))
    if penalized and drafts is not None:   # the penalties count the drafts before each position
        fill_drafts([it for _, _, it in items], drafts)
        drafts = None
    if penalized:
        views = [(it, i) for _, _, it in items for i in range(it.num_drafts + 1)]
        prompts = LazyRows(len(views), lambda j: views[j][0].seq.prompt_token_ids)
        outputs = LazyRows(len(views), lambda j: (views[j][0].seq.output_token_ids
                                                  + views[j][0].draft_tokens[:views[j][1]]))
        logits = apply_penalties(logits, prompts, outputs, params, eos_token_ids)
    target = sample(logits, params, seeds, steps)[0]
    if drafts is None:
        target = target.tolist()
    else:   # one host copy for both
        both = torch.cat([target, drafts.reshape(-1)]).tolist()
        target, flat = both[:len(index)], both[len(index):]
        k = drafts.shape[1]
        fill_drafts([it for _, _, it in items], [flat[i * k:(i + 1) * k] for i in range(len(items))])
    accepted, first = {}, 0
    for row, _, it in items:
        t, d, m = target[first:first + it.num_drafts + 1], it.draft_tokens, it.num_drafts
        n = 0
        while n < m and d[n] == t[n]:
            n += 1
        accepted[row] = t[:n + 1]
        first += m + 1
    return accepted
