"""sample_tokens (Triton) against its twin (naive.sample_tokens).

Greedy rows must be identical. A sampled row may differ from the twin only where float rounding
decides: the twin sorts fp32 softmax probabilities and cumsums them, the kernel compares unnormalised
exp(x - max) against thresholds scaled by the row sum, with its own exp/log. So a differing token is
accepted only if exact (float64) arithmetic could have picked it: it passes every filter with the
thresholds widened by a relative 1e-5, and its score p / -log(u) is within a relative 1e-5 of the best
score among tokens that pass the filters tightened by 1e-5. A wrong token fails this by orders of
magnitude, so the check keeps its power."""
import pytest
import torch

from catengine.kernels.sampling import naive as ref
from catengine.kernels.sampling.sampler import SampleLaunch, sample_tokens_with

DEV = "cuda" if torch.cuda.is_available() else "cpu"
REL = 1e-5


def _keep64(logits, t, k, tp, mp, slack):
    p = torch.softmax(logits.double() / t, -1)
    sp, order = p.sort(descending=True)
    kth = sp[k - 1] if 0 < k <= p.numel() else torch.tensor(-1.0, dtype=torch.float64)
    keep = p >= kth * (1 - slack) if k > 0 else torch.ones_like(p, dtype=torch.bool)
    before = torch.empty_like(p)
    before[order] = sp.cumsum(0) - sp
    keep &= before < tp * (1 + slack) + slack
    keep &= p >= mp * sp[0] * (1 - slack)
    return p, keep


def _explained(logits, t, k, tp, mp, u, got) -> bool:
    p, loose = _keep64(logits, t, k, tp, mp, REL)
    _, strict = _keep64(logits, t, k, tp, mp, -REL)
    if not strict.any():
        return got == 0 or bool(loose[got])
    score = p / -torch.log(u.double())
    return bool(loose[got]) and bool(score[got] >= score[strict].max() * (1 - REL))


def check_rows(logits, temp, top_k, top_p, min_p, seeds, steps, got):
    want = ref.sample_tokens(logits, temp, top_k, top_p, min_p, seeds, steps)
    u = ref.sampling_uniforms(seeds, steps, logits.shape[1])
    mism = 0
    for b in range(logits.shape[0]):
        g, w = int(got[b]), int(want[b])
        if g == w:
            continue
        assert temp[b] > 0, f"greedy row {b}: got {g}, want {w}"
        assert _explained(logits[b], float(temp[b]), int(top_k[b]), float(top_p[b]), float(min_p[b]), u[b], g), \
            f"row {b}: token {g} is no rounding-level alternative to {w}"
        mism += 1
    assert mism <= max(1, logits.shape[0] // 10), f"{mism} rounding-level mismatches is implausibly many"


def _params(b, gen):
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.6, 2.0, 1.0, 0.0, 0.9])[:b]
    top_k = torch.tensor([0, 0, 20, 0, 5, 0, 50, 1, 3, 0], dtype=torch.int32)[:b]
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.9, 0.8, 0.5, 0.95, 1.0, 0.5, 0.0])[:b]
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.1, 0.0, 0.0, 0.2, 0.0])[:b]
    seeds = torch.randint(-2 ** 62, 2 ** 62, (b,), generator=gen)
    steps = torch.randint(0, 1 << 40, (b,), generator=gen)
    return temp, top_k, top_p, min_p, seeds, steps


def _run(logits, params, cfg=None):
    dev = [x.to(DEV) for x in (logits, *params)]
    return sample_tokens_with(*dev, cfg=cfg).cpu()


@pytest.mark.parametrize("scale", [1.0, 6.0], ids=["flat", "peaked"])
def test_sampler_matches_reference(scale):
    gen = torch.Generator().manual_seed(int(scale * 10))
    b, v = 10, 1500
    # bf16-rounded logits, as a bf16 lm_head produces: exact ties exercise first-index argmax
    logits = (torch.randn(b, v, generator=gen) * scale).to(torch.bfloat16).float()
    params = _params(b, gen)
    check_rows(logits, *params, _run(logits, params))


def test_sampler_across_chunks():
    """Small chunks: the row's max, sum, candidates and counts are combined across programs."""
    gen = torch.Generator().manual_seed(21)
    b, v = 10, 1000
    logits = (torch.randn(b, v, generator=gen) * 3).to(torch.bfloat16).float()
    params = _params(b, gen)
    check_rows(logits, *params, _run(logits, params, SampleLaunch(384, 128, 4)))


def test_sampler_edge_rows():
    """top_p = 0 and min_p > 1 keep nothing (the twin then answers token 0); top_k = 1 is the mode;
    top_k beyond the vocabulary is no filter."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 300, generator=gen) * 2
    params = (torch.ones(4), torch.tensor([0, 0, 1, 1000], dtype=torch.int32), torch.tensor([0.0, 1.0, 1.0, 0.99]),
              torch.tensor([0.0, 1.5, 0.0, 0.0]), torch.arange(4), torch.zeros(4, dtype=torch.int64))
    got = _run(logits, params)
    assert got[0] == 0 and got[1] == 0 and got[2] == logits[2].argmax()
    check_rows(logits, *params, got)


def test_sampler_filters_are_sharp():
    """Three dominant tokens with p = .5, .3, .2: top-k 2, top-p .6 and min-p .5 each keep exactly the
    first two. Over 36 draws the third must never appear and both kept tokens must."""
    b, v = 36, 300
    logits = torch.full((b, v), -30.0)
    top3 = torch.tensor([7, 100, 250])
    logits[:, top3] = torch.tensor([0.5, 0.3, 0.2]).log()
    kind = torch.arange(b) % 3
    params = (torch.ones(b), torch.where(kind == 0, 2, 0).to(torch.int32), torch.where(kind == 1, 0.6, 1.0),
              torch.where(kind == 2, 0.5, 0.0), torch.arange(b) * 7919, torch.full((b,), 3, dtype=torch.int64))
    got = _run(logits, params)
    assert set(got.tolist()) == {7, 100}
    check_rows(logits, *params, got)


def test_sampler_rows_are_batch_independent():
    """A row's draw depends only on its (seed, step), not on its batch position."""
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(6, 700, generator=gen) * 3
    params = _params(6, gen)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    got = _run(logits, params)
    got_perm = _run(logits[perm], tuple(x[perm] for x in params))
    assert torch.equal(got[perm], got_perm)


def test_uniforms_hash_matches_twin():
    """The Triton uint32 hash reproduces sampling_uniforms bit for bit: with top_k = top_p = off and a
    flat distribution, the draw is argmax(1 / -log u) = argmax(u), a direct read of the hash."""
    gen = torch.Generator().manual_seed(11)
    b, v = 8, 900
    logits = torch.zeros(b, v)
    seeds = torch.randint(-2 ** 63, 2 ** 63 - 1, (b,), generator=gen)
    steps = torch.randint(0, 1 << 62, (b,), generator=gen)
    params = (torch.ones(b), torch.zeros(b, dtype=torch.int32), torch.ones(b), torch.zeros(b), seeds, steps)
    got = _run(logits, params)
    assert torch.equal(got, ref.sampling_uniforms(seeds, steps, v).argmax(-1))


@pytest.mark.gpu
def test_sampler_gpu_full_vocab_and_graph_capture():
    gen = torch.Generator().manual_seed(3)
    b, v = 64, 248320
    logits = (torch.randn(b, v, generator=gen) * 4).to(torch.bfloat16).float()
    base = _params(10, gen)
    params = tuple(x.repeat(7)[:b] for x in base[:4]) + (torch.randint(0, 1 << 62, (b,), generator=gen),
                                                          torch.randint(0, 1000, (b,), generator=gen))
    check_rows(logits, *params, _run(logits, params))
    # no host sync anywhere: the whole sampler captures into a CUDA graph and replays identically
    dev = [x.cuda() for x in (logits, *params)]
    torch.cuda.synchronize()
    first = sample_tokens_with(*dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sample_tokens_with(*dev)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)
