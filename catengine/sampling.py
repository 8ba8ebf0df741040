"""Per-request sampling parameters and the batched logits pipeline that applies them.

Pipeline for one decode step (the runner's view)::

    raw = model logits [B, V] fp32
    logits = apply_penalties(raw, prompt_ids, output_ids, params, eos_ids)   # new tensor; raw untouched
    token_ids, logprobs = sample(logits, params, seeds, steps, raw_logits=raw)

Everything is vectorised over the batch and device-agnostic; Python work is per request or per
token id listed in a request, never per vocabulary entry. Randomness is the counter-based hash of
``kernels.sampling.naive.sampling_uniforms``: a request's draw at output position ``step`` depends only on
``(seed, step)``, so a seeded request samples the same tokens in any batch, in any row, and after
preemption-by-recompute. Requests without a seed get one drawn once per request
(:func:`random_seed`); child ``i`` of an ``n > 1`` request uses :meth:`SamplingParams.child`.
"""
from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Mapping, Sequence

import torch

from .errors import InvalidRequest
from .kernels import ops
from .logprobs import TokenLogprobs, compute_logprobs, finite_or_neg_inf
from .structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20
# Below this temperature a request is greedy (vLLM uses the same threshold): dividing by it would
# overflow fp32 anyway.
GREEDY_EPS = 1e-5
# generation_config.json key -> SamplingParams field; these are the defaults a model may ship.
GENERATION_CONFIG_KEYS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "max_new_tokens": "max_tokens",
}


def random_seed() -> int:
    """A fresh 63-bit seed for a request that did not ask for one (drawn once per request)."""
    return secrets.randbits(63)


def _bad(name: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"{name} must be {expected}, got {value!r}")


def _as_int(name: str, value: Any, expected: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, expected, value)
    if isinstance(value, float):
        if not value.is_integer():
            raise _bad(name, expected, value)
        value = int(value)
    return value


def _as_float(name: str, value: Any, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(name, expected, value)
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """What to generate for one request; field names, meanings and defaults follow vLLM.

    ``__post_init__`` validates every field (raising :class:`InvalidRequest` that names the field
    and its valid range) and normalises: ``stop`` becomes a tuple of strings (a single string is
    accepted), ``stop_token_ids`` a tuple of ints, ``logit_bias`` a ``{token_id: bias}`` dict with
    int keys (string keys, as JSON objects carry them, are converted), ``top_k`` -1 becomes 0.

    - ``temperature`` < 1e-5 means greedy (argmax; top_k/top_p/min_p/seed are then irrelevant).
    - ``top_k`` 0 (or -1) = off; ``top_p`` 1 = off; ``min_p`` 0 = off.
    - ``repetition_penalty`` (> 0, 1 = off) scales logits of tokens seen in prompt or output;
      ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2]) subtract per output token.
    - ``max_tokens`` None = until the context is full (the engine decides); ``min_tokens`` masks
      EOS and ``stop_token_ids`` and disables stop strings until that many tokens were generated.
    - ``logprobs`` None = none; N = the sampled token's logprob and rank plus the top-N.
    - ``prompt_logprobs`` None = none; N = each prompt token's logprob and rank plus the top-N at its
      position (the first token has none). Such a request computes its whole prompt: no prefix-cache
      hit skips positions whose logprobs are wanted (as in vLLM).
    - ``n`` > 1: the engine runs :meth:`child` (i) for i in range(n); ``best_of`` must equal n.
    - ``structured_outputs``: a grammar the output must follow (a :class:`StructuredOutputsParams` or a
      dict of its fields); the sample rows are masked to what it allows, EOS only where it accepts.
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] | list[str] | str = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] | list[int] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        n = _as_int("n", self.n, "an integer >= 1")
        if n < 1:
            raise _bad("n", "an integer >= 1", n)
        put("n", n)
        if self.best_of is not None:
            best_of = _as_int("best_of", self.best_of, f"None or equal to n ({n})")
            if best_of != n:
                raise InvalidRequest(f"best_of must be None or equal to n ({n}), got {best_of}: "
                                     "this engine returns every sampled sequence, not the best ones")
            put("best_of", best_of)
        ranges = {"temperature": (0.0, None, "a number >= 0"),
                  "top_p": (None, 1.0, "a number in (0, 1]"),
                  "min_p": (0.0, 1.0, "a number in [0, 1]"),
                  "presence_penalty": (-2.0, 2.0, "a number in [-2, 2]"),
                  "frequency_penalty": (-2.0, 2.0, "a number in [-2, 2]"),
                  "repetition_penalty": (None, None, "a number > 0 (1 = off)")}
        for name, (lo, hi, expected) in ranges.items():
            value = _as_float(name, getattr(self, name), expected)
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise _bad(name, expected, value)
            put(name, value)
        if self.top_p <= 0.0:
            raise _bad("top_p", "a number in (0, 1]", self.top_p)
        if self.repetition_penalty <= 0.0:
            raise _bad("repetition_penalty", "a number > 0 (1 = off)", self.repetition_penalty)
        top_k = _as_int("top_k", self.top_k, "-1 or 0 (off) or an integer >= 1")
        if top_k < -1:
            raise _bad("top_k", "-1 or 0 (off) or an integer >= 1", top_k)
        put("top_k", max(top_k, 0))
        self._check_lengths(put)
        self._check_stops(put)
        if self.seed is not None:
            put("seed", _as_int("seed", self.seed, "an integer or None"))
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                value = _as_int(name, value, f"None or an integer in [0, {MAX_LOGPROBS}]")
                if not 0 <= value <= MAX_LOGPROBS:
                    raise _bad(name, f"None or an integer in [0, {MAX_LOGPROBS}]", value)
                put(name, value)
        if self.logit_bias is not None:
            put("logit_bias", self._normalise_logit_bias(self.logit_bias))
        if isinstance(self.structured_outputs, Mapping):
            put("structured_outputs", StructuredOutputsParams.from_dict(dict(self.structured_outputs)))
        elif self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise _bad("structured_outputs", "None, a StructuredOutputsParams or a dict of its fields",
                       self.structured_outputs)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "true or false", getattr(self, name))

    def _check_lengths(self, put) -> None:
        if self.max_tokens is not None:
            max_tokens = _as_int("max_tokens", self.max_tokens, "None or an integer >= 1")
            if max_tokens < 1:
                raise _bad("max_tokens", "None or an integer >= 1", max_tokens)
            put("max_tokens", max_tokens)
        min_tokens = _as_int("min_tokens", self.min_tokens, "an integer >= 0")
        if min_tokens < 0:
            raise _bad("min_tokens", "an integer >= 0", min_tokens)
        if self.max_tokens is not None and min_tokens > self.max_tokens:
            raise InvalidRequest(f"min_tokens ({min_tokens}) must be <= max_tokens ({self.max_tokens})")
        put("min_tokens", min_tokens)

    def _check_stops(self, put) -> None:
        stop = self.stop if self.stop is not None else ()
        stop = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise _bad("stop", "a non-empty string or a list of non-empty strings", self.stop)
        put("stop", tuple(stop))
        ids = self.stop_token_ids if self.stop_token_ids is not None else ()
        if not isinstance(ids, (list, tuple)):
            raise _bad("stop_token_ids", "a list of token ids (integers >= 0)", ids)
        ids = tuple(_as_int("stop_token_ids", i, "a list of token ids (integers >= 0)") for i in ids)
        if any(i < 0 for i in ids):
            raise _bad("stop_token_ids", "a list of token ids (integers >= 0)", list(ids))
        put("stop_token_ids", ids)

    @staticmethod
    def _normalise_logit_bias(bias: Any) -> dict[int, float]:
        if not isinstance(bias, Mapping):
            raise _bad("logit_bias", "an object mapping token ids to numbers in [-100, 100]", bias)
        out = {}
        for key, value in bias.items():
            try:
                token = int(key) if not isinstance(key, bool) else -1
            except (TypeError, ValueError):
                token = -1
            if token < 0:
                raise _bad("logit_bias keys", "token ids (integers >= 0)", key)
            value = _as_float(f"logit_bias[{key}]", value, "a number in [-100, 100]")
            if not -100.0 <= value <= 100.0:
                raise _bad(f"logit_bias[{key}]", "a number in [-100, 100]", value)
            out[token] = value
        return out

    # ------------------------------------------------------------------ helpers for the engine
    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def stop_token_set(self, eos_ids: Sequence[int]) -> frozenset[int]:
        """Token ids that end this request: ``stop_token_ids`` plus ``eos_ids`` unless ignore_eos.
        The engine must not end the request on them before ``min_tokens`` outputs (they are masked
        by :func:`apply_penalties` until then anyway)."""
        return frozenset(self.stop_token_ids) | (frozenset() if self.ignore_eos else frozenset(eos_ids))

    def verify_vocab(self, vocab_size: int) -> None:
        """Raise InvalidRequest if logit_bias or stop_token_ids name a token id >= vocab_size."""
        for name, ids in (("logit_bias", self.logit_bias or {}), ("stop_token_ids", self.stop_token_ids)):
            bad = [i for i in ids if i >= vocab_size]
            if bad:
                raise InvalidRequest(f"{name} has token id {bad[0]}; valid ids are 0..{vocab_size - 1}")

    def child(self, index: int) -> "SamplingParams":
        """Params of sequence ``index`` of an ``n > 1`` request: n = 1, and a seeded request gives
        child i the seed ``seed + i`` (as vLLM does) so the n samples differ but reproduce; only
        child 0 keeps ``prompt_logprobs``."""
        seed = None if self.seed is None else self.seed + index
        # the prompt's logprobs belong to the request: the leader (child 0) computes them, once
        prompt_logprobs = self.prompt_logprobs if index == 0 else None
        return dataclasses.replace(self, n=1, best_of=None, seed=seed, prompt_logprobs=prompt_logprobs)

    @classmethod
    def from_request(cls, fields: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None,
                     *, default_max_tokens: int | None = 16) -> "SamplingParams":
        """Build params from the fields a request actually set.

        ``fields`` maps SamplingParams field names to values; a missing key or a ``None`` value
        means "unset" (OpenAI clients send ``null``), unknown keys are ignored. An unset field takes
        the model's ``generation_config.json`` value (temperature, top_p, top_k, min_p,
        repetition/presence/frequency_penalty, max_new_tokens -> max_tokens), then the default:
        ``default_max_tokens`` for max_tokens (the server passes 16 for completions, the room left
        in the context for chat), the dataclass default otherwise. ``do_sample`` is ignored, as in
        vLLM: a request wanting greedy output sends temperature 0.
        """
        if not isinstance(fields, Mapping):
            raise InvalidRequest(f"sampling fields must be an object, got {type(fields).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {"max_tokens": default_max_tokens}
        for key, name in GENERATION_CONFIG_KEYS.items():
            value = (generation_config or {}).get(key)
            if value is not None:
                kwargs[name] = value
        kwargs.update({k: v for k, v in fields.items() if k in names and v is not None})
        return cls(**kwargs)


# ---------------------------------------------------------------------- logits processing
def device_tensor(values: Sequence, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without its stream synchronisation: a host
    tensor copied with ``non_blocking`` (from pageable memory CUDA stages the bytes before returning, so the
    host list may go at once), so that a step's small per-row tensors do not make the host wait for the
    GPU work queued before them (the step in flight, with async scheduling)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _flat_ids(rows: Sequence[int], id_lists: Any, vocab_size: int, device) -> tuple:
    """(i, token id) int64 tensors for every id of ``id_lists[rows[i]]``, i.e. row numbers local to
    ``rows``; ids outside [0, vocab_size) are dropped (an out-of-range index is a device assert).
    Python lists are filtered on the host and travel to the device in one copy each (no boolean-mask
    indexing on the device: its nonzero waits for the GPU); tensors are used as they are."""
    lists = [id_lists[r] for r in rows]
    if any(isinstance(ids, torch.Tensor) for ids in lists):
        lengths = torch.tensor([len(ids) for ids in lists], dtype=torch.int64)
        cols = torch.cat([ids.to(device=device, dtype=torch.int64).reshape(-1) if isinstance(ids, torch.Tensor)
                          else torch.tensor(list(ids), dtype=torch.int64, device=device) for ids in lists])
        local = torch.repeat_interleave(torch.arange(len(rows)), lengths).to(device)
        keep = (cols >= 0) & (cols < vocab_size)
        return local[keep], cols[keep]
    pairs = [(i, t) for i, ids in enumerate(lists) for t in ids if 0 <= t < vocab_size]
    local, cols = zip(*pairs) if pairs else ((), ())
    return device_tensor(local, torch.int64, device), device_tensor(cols, torch.int64, device)


def _row_values(params: Sequence[SamplingParams], rows: Sequence[int], name: str, device) -> torch.Tensor:
    return device_tensor([getattr(params[r], name) for r in rows], torch.float32, device)[:, None]


def apply_penalties(logits: torch.Tensor, prompt_ids: Sequence[Sequence[int] | torch.Tensor],
                    output_ids: Sequence[Sequence[int] | torch.Tensor], params: Sequence[SamplingParams],
                    eos_ids: Sequence[int] = ()) -> torch.Tensor:
    """Apply logit_bias, penalties and the min_tokens mask to a batch of logits.

    logits: [B, V] fp32, row b belongs to a request with ``params[b]``, prompt ``prompt_ids[b]``
    and the tokens generated so far ``output_ids[b]`` (lists of ints or 1-D int tensors).
    Returns a new tensor (``logits`` is not modified; it is returned as is when no row needs any
    processing), in this order, as vLLM v1 does:

    1. ``logit_bias``: ``l[t] += bias[t]``.
    2. repetition penalty ``r`` over tokens in prompt or output: ``l > 0 -> l / r``, else ``l * r``.
    3. frequency / presence over output tokens: ``l[t] -= f * count[t] + p * (count[t] > 0)``.
    4. min_tokens: while ``len(output_ids[b]) < min_tokens``, EOS (``eos_ids``, unless ignore_eos)
       and ``stop_token_ids`` get ``-inf``.

    Scratch memory is [rows using a penalty, V], not [B, V]. Token ids outside [0, V) are ignored
    here; :meth:`SamplingParams.verify_vocab` rejects them at request time.
    """
    B, V = logits.shape
    device = logits.device
    if not any(p.logit_bias or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
               or p.min_tokens > 0 for p in params):   # the common case: one pass, no per-row output views
        return logits
    biased = [b for b in range(B) if params[b].logit_bias]
    repeated = [b for b in range(B) if params[b].repetition_penalty != 1.0]
    counted = [b for b in range(B) if params[b].presence_penalty != 0.0 or params[b].frequency_penalty != 0.0]
    masked = [b for b in range(B) if len(output_ids[b]) < params[b].min_tokens]
    if not (biased or repeated or counted or masked):
        return logits
    out = logits.float().clone()
    if biased:
        pairs = [(b, t, v) for b in biased for t, v in params[b].logit_bias.items() if t < V]
        if pairs:
            r, t, v = zip(*pairs)
            # flat scatters, not index_put_: its CUDA accumulate path sorts and reads a count back (a stream
            # synchronisation inside the launch); a row's bias ids are distinct, so the adds do not race
            flat = device_tensor([b * V + i for b, i in zip(r, t)], torch.int64, device)
            out.view(-1).scatter_add_(0, flat, device_tensor(v, torch.float32, device))
    if repeated:
        index = device_tensor(repeated, torch.int64, device)
        sub = out[index]
        seen = torch.zeros_like(sub, dtype=torch.bool)
        for ids in (prompt_ids, output_ids):
            r, t = _flat_ids(repeated, ids, V, device)
            seen.view(-1).index_fill_(0, r * V + t, True)
        penalty = _row_values(params, repeated, "repetition_penalty", device)
        out[index] = torch.where(seen, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
    if counted:
        index = device_tensor(counted, torch.int64, device)
        counts = torch.zeros(len(counted), V, dtype=torch.float32, device=device)
        r, t = _flat_ids(counted, output_ids, V, device)
        counts.view(-1).scatter_add_(0, r * V + t, torch.ones_like(t, dtype=torch.float32))   # whole counts: exact
        out[index] -= (_row_values(params, counted, "frequency_penalty", device) * counts
                       + _row_values(params, counted, "presence_penalty", device) * (counts > 0).float())
    if masked:
        stops = {b: sorted(params[b].stop_token_set(eos_ids)) for b in masked}
        r, t = _flat_ids(masked, stops, V, device)
        out.view(-1).index_fill_(0, device_tensor(masked, torch.int64, device)[r] * V + t, float("-inf"))
    return out


def _wrap_int64(seed: int) -> int:
    """Any Python int -> the int64 with the same low 64 bits (the hash reads 64 bits of seed)."""
    return ((seed + 2**63) % 2**64) - 2**63


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int],
           steps: Sequence[int], *, raw_logits: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
    """Draw one token per row.

    logits: [B, V] after :func:`apply_penalties`; ``seeds[b]`` the request's seed (its own or the one
    the engine drew), ``steps[b]`` the index of the output token being drawn (0 for the first); the
    draw is a pure function of (logits row, params, seed, step). Greedy rows take the argmax (first
    index on ties). NaN logits count as -inf. Calls ``ops.sample_tokens`` (Triton on CUDA).

    Returns ``(token_ids [B] int64 on logits.device, logprobs)`` where ``logprobs[b]`` is a
    :class:`TokenLogprobs` computed from ``raw_logits`` (defaults to ``logits``) when
    ``params[b].logprobs`` is not None, else None.
    """
    B = logits.shape[0]
    if not (len(params) == len(seeds) == len(steps) == B):
        raise ValueError(f"sample: {B} logit rows but {len(params)} params, {len(seeds)} seeds, "
                         f"{len(steps)} steps")
    clean = finite_or_neg_inf(logits.float())
    if all(p.is_greedy for p in params):
        # what the sampler does for greedy rows, without building its per-row parameter tensors
        # (host-to-device copies) or its full-vocabulary pass
        token_ids = clean.argmax(-1)
    else:
        device = logits.device
        # greedy rows switch the filters off so that the kernel takes a plain argmax
        columns = zip(*[(0.0, 0, 1.0, 0.0) if p.is_greedy else (p.temperature, p.top_k, p.top_p, p.min_p)
                        for p in params], strict=True)
        temperature, top_k, top_p, min_p = (device_tensor(list(c), dt, device) for c, dt in
                                            zip(columns, (torch.float32, torch.int32, torch.float32, torch.float32)))
        seed_t = device_tensor([_wrap_int64(int(s)) for s in seeds], torch.int64, device)
        step_t = device_tensor([int(s) for s in steps], torch.int64, device)
        token_ids = ops.sample_tokens(clean, temperature, top_k, top_p, min_p, seed_t, step_t).to(torch.int64)
    source = logits if raw_logits is None else raw_logits
    return token_ids, compute_logprobs(source, token_ids, params)


__all__ = ["SamplingParams", "TokenLogprobs", "apply_penalties", "sample", "compute_logprobs",
           "random_seed", "MAX_LOGPROBS", "GREEDY_EPS"]
