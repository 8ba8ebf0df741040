"""SamplingParams validation/defaults, the penalty pipeline, and batched seeded sampling."""
import math

import pytest
import torch

from catengine.errors import InvalidRequest
from catengine.sampling import (MAX_LOGPROBS, SamplingParams, TokenLogprobs, apply_penalties, compute_logprobs,
                                random_seed, sample)

NEG_INF = float("-inf")


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs, words", [
    ({"temperature": -0.1}, ["temperature", ">= 0"]),
    ({"temperature": float("nan")}, ["temperature", ">= 0"]),
    ({"top_p": 0.0}, ["top_p", "(0, 1]"]),
    ({"top_p": 1.5}, ["top_p", "(0, 1]"]),
    ({"top_k": -2}, ["top_k", "-1 or 0"]),
    ({"top_k": 2.5}, ["top_k", "integer"]),
    ({"min_p": -0.1}, ["min_p", "[0, 1]"]),
    ({"min_p": 1.1}, ["min_p", "[0, 1]"]),
    ({"presence_penalty": 2.5}, ["presence_penalty", "[-2, 2]"]),
    ({"frequency_penalty": -3}, ["frequency_penalty", "[-2, 2]"]),
    ({"repetition_penalty": 0.0}, ["repetition_penalty", "> 0"]),
    ({"n": 0}, ["n", ">= 1"]),
    ({"n": 2, "best_of": 3}, ["best_of", "equal to n"]),
    ({"max_tokens": 0}, ["max_tokens", ">= 1"]),
    ({"min_tokens": -1}, ["min_tokens", ">= 0"]),
    ({"min_tokens": 10, "max_tokens": 5}, ["min_tokens", "max_tokens"]),
    ({"logprobs": MAX_LOGPROBS + 1}, ["logprobs", "[0, 20]"]),
    ({"logprobs": -1}, ["logprobs", "[0, 20]"]),
    ({"logit_bias": {5: 101}}, ["logit_bias[5]", "[-100, 100]"]),
    ({"logit_bias": {"x": 1}}, ["logit_bias keys", "token ids"]),
    ({"stop": ["ok", ""]}, ["stop", "non-empty"]),
    ({"stop": 5}, ["stop", "string"]),
    ({"stop_token_ids": [-3]}, ["stop_token_ids", ">= 0"]),
    ({"seed": "abc"}, ["seed", "integer"]),
    ({"ignore_eos": "yes"}, ["ignore_eos", "true or false"]),
    ({"temperature": "hot"}, ["temperature", ">= 0"]),
])
def test_validation_names_field_and_range(kwargs, words):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_normalisation_and_defaults():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens, p.stop, p.logprobs) == (1, 1.0, 1.0, 0, 16, (), None)
    p = SamplingParams(stop="###", stop_token_ids=[7, 8], top_k=-1, logit_bias={"12": 3, 4: -100},
                       best_of=1, max_tokens=None, temperature=0)
    assert p.stop == ("###",) and p.stop_token_ids == (7, 8) and p.top_k == 0
    assert p.logit_bias == {12: 3.0, 4: -100.0} and p.max_tokens is None and p.is_greedy
    assert not SamplingParams(temperature=0.01).is_greedy
    assert p.stop_token_set([1, 2]) == {1, 2, 7, 8}
    assert SamplingParams(ignore_eos=True, stop_token_ids=[9]).stop_token_set([1]) == {9}
    with pytest.raises(InvalidRequest, match="stop_token_ids has token id 100"):
        SamplingParams(stop_token_ids=[100]).verify_vocab(100)
    SamplingParams(logit_bias={99: 1}).verify_vocab(100)
    with pytest.raises(InvalidRequest, match="logit_bias has token id 100"):
        SamplingParams(logit_bias={100: 1}).verify_vocab(100)


def test_from_request_uses_generation_config_for_unset_fields():
    qwen = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "eos_token_id": [1, 2]}
    p = SamplingParams.from_request({}, qwen)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.6, 0.95, 20, 16)
    # None is "unset" (clients send null); explicit values win; unknown keys are ignored.
    p = SamplingParams.from_request({"temperature": None, "top_p": 0.5, "user": "x"}, qwen, default_max_tokens=99)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.6, 0.5, 20, 99)
    p = SamplingParams.from_request({"temperature": 0, "max_tokens": 3}, qwen)
    assert p.is_greedy and p.max_tokens == 3
    p = SamplingParams.from_request({}, {"max_new_tokens": 64, "repetition_penalty": 1.05}, default_max_tokens=8)
    assert p.max_tokens == 64 and p.repetition_penalty == 1.05
    assert SamplingParams.from_request({}, None).temperature == 1.0
    with pytest.raises(InvalidRequest, match="top_p"):
        SamplingParams.from_request({"top_p": 7}, qwen)


def test_child_params_get_distinct_reproducible_seeds():
    p = SamplingParams(n=3, seed=10, temperature=0.7)
    kids = [p.child(i) for i in range(3)]
    assert [k.seed for k in kids] == [10, 11, 12] and all(k.n == 1 and k.temperature == 0.7 for k in kids)
    assert SamplingParams(n=2).child(1).seed is None
    assert 0 <= random_seed() < 2**63 and random_seed() != random_seed()


# ------------------------------------------------------------------ penalties
def test_penalties_hand_checked():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25,
                             logit_bias={0: 2.0, 4: 10.0})]
    out = apply_penalties(logits, [[0]], [[1, 1, 3]], params)
    # bias first: [4, -1, .5, 3, 8]; repetition over {0, 1, 3}: 4/2, -1*2, 3/2;
    # then output counts {1: 2, 3: 1}: freq .5*count, presence .25.
    expected = torch.tensor([[2.0, -2.0 - 1.0 - 0.25, 0.5, 1.5 - 0.5 - 0.25, 8.0]])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert logits.tolist() == [[2.0, -1.0, 0.5, 3.0, -2.0]], "input must not be modified"


def test_penalties_each_alone_and_rows_independent():
    logits = torch.tensor([[1.0, -1.0, 2.0, 0.0]] * 4)
    params = [SamplingParams(), SamplingParams(repetition_penalty=0.5),
              SamplingParams(frequency_penalty=-1.0), SamplingParams(presence_penalty=1.0)]
    prompts = [[0, 1], [0, 1], [0, 1], [0, 1]]
    outputs = [[2, 2], [2, 2], torch.tensor([2, 2]), [2, 2, 9999]]   # tensors accepted, bad ids ignored
    out = apply_penalties(logits, prompts, outputs, params)
    assert out[0].tolist() == [1.0, -1.0, 2.0, 0.0]
    assert out[1].tolist() == [2.0, -0.5, 4.0, 0.0]     # r < 1 boosts seen tokens (prompt and output)
    assert out[2].tolist() == [1.0, -1.0, 4.0, 0.0]     # negative frequency penalty: +1 per occurrence
    assert out[3].tolist() == [1.0, -1.0, 1.0, 0.0]     # presence counts once
    plain = torch.randn(2, 8)
    assert apply_penalties(plain, [[1], [2]], [[3], []], [SamplingParams()] * 2) is plain


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.zeros(4, 6)
    params = [SamplingParams(min_tokens=2, stop_token_ids=[3]),
              SamplingParams(min_tokens=2, stop_token_ids=[3]),
              SamplingParams(min_tokens=2, ignore_eos=True, stop_token_ids=[3]),
              SamplingParams(stop_token_ids=[3])]
    out = apply_penalties(logits, [[0]] * 4, [[1], [1, 2], [], []], params, eos_ids=[5])
    assert out[0].tolist() == [0, 0, 0, NEG_INF, 0, NEG_INF]
    assert out[1].tolist() == [0] * 6                    # two tokens generated: no longer masked
    assert out[2].tolist() == [0, 0, 0, NEG_INF, 0, 0]   # ignore_eos: EOS is an ordinary token
    assert out[3].tolist() == [0] * 6
    tokens, _ = sample(out, [SamplingParams(temperature=1.0)] * 4, [1] * 4, [0] * 4)
    assert tokens[0].item() not in (3, 5) and tokens[2].item() != 3


# ------------------------------------------------------------------ sampling
def test_greedy_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(6, 97)
    logits[2, 10] = logits[2, 11] = 50.0                  # tie: first index wins
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0, top_k=3, top_p=0.1, min_p=0.9),
              SamplingParams(temperature=1e-6)] * 2
    tokens, _ = sample(logits, params, [1, 2, 3, 4, 5, 6], [0, 7, 3, 1, 2, 9])
    assert tokens.dtype == torch.int64 and tokens.tolist() == logits.argmax(-1).tolist()
    assert tokens[2].item() == 10


def test_seeded_sampling_is_reproducible_and_batch_independent():
    torch.manual_seed(1)
    target = torch.randn(64)
    p = SamplingParams(temperature=1.0, seed=1234)
    alone = [sample(target[None], [p], [1234], [s])[0].item() for s in range(24)]
    others = torch.randn(3, 64)
    for step in range(24):
        batch = torch.stack([others[0], others[1], target, others[2]])
        params = [SamplingParams(temperature=0.5), SamplingParams(temperature=0), p,
                  SamplingParams(top_k=3)]
        tokens, _ = sample(batch, params, [7, 8, 1234, 9], [step, 0, step, 5])
        assert tokens[2].item() == alone[step]
        tokens_rev, _ = sample(batch.flip(0), params[::-1], [9, 1234, 8, 7], [5, step, 0, step])
        assert tokens_rev[1].item() == alone[step]
    assert len(set(alone)) > 5, "different steps must draw different random numbers"
    other_seed = [sample(target[None], [p], [99], [s])[0].item() for s in range(24)]
    assert other_seed != alone
    # seeds are read modulo 2**64
    assert sample(target[None], [p], [2**64 + 5], [3])[0].item() == sample(target[None], [p], [5], [3])[0].item()
    assert sample(target[None], [p], [-1], [3])[0].item() == sample(target[None], [p], [2**64 - 1], [3])[0].item()


def _draws(logits_row, params, n=4000):
    """n draws from one distribution: n rows with the same logits and distinct steps."""
    logits = logits_row[None].repeat(n, 1)
    tokens, _ = sample(logits, [params] * n, [42] * n, list(range(n)))
    return torch.bincount(tokens, minlength=logits_row.numel()).float() / n


def test_filters_only_return_kept_tokens_with_renormalised_frequencies():
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    logits = probs.log()
    cases = [  # (params, kept tokens)
        (SamplingParams(top_k=2), [0, 1]),
        (SamplingParams(top_p=0.6), [0, 1]),       # mass before token 1 is 0.4 < 0.6; before token 2 is 0.7
        (SamplingParams(min_p=0.3), [0, 1, 2]),    # p >= 0.12
        (SamplingParams(top_k=4, top_p=0.8, min_p=0.2), [0, 1, 2]),
        (SamplingParams(), [0, 1, 2, 3, 4]),
    ]
    for params, kept in cases:
        freq = _draws(logits, params)
        expected = torch.zeros(5)
        expected[kept] = probs[kept] / probs[kept].sum()
        assert freq[[i for i in range(5) if i not in kept]].sum() == 0, (params, freq)
        # 4000 draws: std of a frequency <= 0.008; 0.035 is over four standard deviations.
        assert (freq - expected).abs().max() < 0.035, (params, freq, expected)


def test_temperature_sharpens_and_flattens():
    logits = torch.tensor([0.0, 1.0])
    cold = _draws(logits, SamplingParams(temperature=0.2), 2000)
    hot = _draws(logits, SamplingParams(temperature=5.0), 2000)
    p_cold = 1 / (1 + math.exp(-5.0))
    p_hot = 1 / (1 + math.exp(-0.2))
    assert abs(cold[1].item() - p_cold) < 0.03 and abs(hot[1].item() - p_hot) < 0.05


# ------------------------------------------------------------------ logprobs
def test_logprobs_topn_sorted_from_raw_logits():
    torch.manual_seed(2)
    raw = torch.randn(4, 50)
    params = [SamplingParams(logprobs=5, temperature=0), SamplingParams(),
              SamplingParams(logprobs=0, repetition_penalty=1.8), SamplingParams(logprobs=20, seed=3)]
    processed = apply_penalties(raw, [[0, 1, 2]] * 4, [[3, 4]] * 4, params)
    tokens, lps = sample(processed, params, [1, 2, 3, 4], [0, 0, 0, 0], raw_logits=raw)
    reference = torch.log_softmax(raw, -1)
    assert lps[1] is None
    for b, n in ((0, 5), (2, 0), (3, 20)):
        info = lps[b]
        assert isinstance(info, TokenLogprobs) and info.token_id == tokens[b].item()
        assert info.logprob == pytest.approx(reference[b, info.token_id].item(), abs=1e-5)
        assert info.rank == int((reference[b] > reference[b, info.token_id]).sum()) + 1
        assert len(info.top) == n
        values = [v for _, v in info.top]
        assert values == sorted(values, reverse=True)
        expected = reference[b].topk(n).values.tolist() if n else []
        assert values == pytest.approx(expected, abs=1e-5)
        for token, value in info.top:
            assert value == pytest.approx(reference[b, token].item(), abs=1e-5)
    assert lps[0].rank == 1 and lps[0].top[0][0] == tokens[0].item()


def test_no_nan_from_nan_or_masked_logits():
    logits = torch.tensor([[float("nan"), 1.0, NEG_INF, 0.5],
                           [NEG_INF] * 4,
                           [float("nan")] * 4,
                           [0.0, float("inf"), 1.0, 2.0]])
    params = [SamplingParams(logprobs=4, temperature=0.9)] * 4
    tokens, lps = sample(logits, params, [1, 2, 3, 4], [0, 0, 0, 0])
    assert tokens[0].item() in (1, 3)
    for info in lps:
        values = [info.logprob] + [v for _, v in info.top]
        assert not any(math.isnan(v) for v in values)
        assert all(math.isfinite(v) or v == NEG_INF for v in values)
    assert lps[0].top[-1][1] == NEG_INF and lps[1].logprob == NEG_INF and lps[2].logprob == NEG_INF
    assert lps[3].top[0][0] == 1 and lps[3].top[0][1] == 0.0
    direct = compute_logprobs(logits, tokens, params)
    assert [d.top for d in direct] == [lp.top for lp in lps]
