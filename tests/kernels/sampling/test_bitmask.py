"""apply_token_bitmask (Triton; the interpreter on CPU) against its twin, and the twin against a plain
per-token loop over xgrammar's bit layout. Masking is exact: equality, no tolerance."""
import pytest
import torch

from catengine.errors import KernelContractError
from catengine.kernels.sampling import naive as ref
from catengine.kernels.sampling.bitmask import apply_token_bitmask

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(b, v, rows, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=gen)
    words = -(-v // 32) + 1        # one spare word: the width may exceed the vocabulary
    bitmask = torch.randint(-2**31, 2**31 - 1, (len(rows), words), dtype=torch.int64, generator=gen).to(torch.int32)
    bitmask[0, 0] = -1             # a word that allows everything, and one that allows nothing
    if bitmask.shape[1] > 2:
        bitmask[0, 1] = 0
    return logits, bitmask, torch.tensor(rows, dtype=torch.int64)


def test_twin_follows_the_bit_layout():
    logits, bitmask, rows = _case(3, 70, [2, 0], 0)
    want = logits.clone()
    for i, r in enumerate(rows.tolist()):
        for t in range(70):
            if not (int(bitmask[i, t // 32]) >> (t % 32)) & 1:
                want[r, t] = float("-inf")
    got = logits.clone()
    ref.apply_token_bitmask(got, bitmask, rows)
    assert torch.equal(got, want)
    assert torch.equal(got[1], logits[1])     # a free row of the batch is untouched


@pytest.mark.parametrize("b,v,rows", [(1, 33, [0]), (4, 1500, [3, 1]), (5, 2100, [0, 1, 2, 3, 4])])
def test_kernel_matches_twin(b, v, rows):
    logits, bitmask, rows_t = _case(b, v, rows, b * v)
    want = logits.clone()
    ref.apply_token_bitmask(want, bitmask, rows_t)
    got = logits.to(DEV)
    apply_token_bitmask(got, bitmask.to(DEV), rows_t.to(DEV))
    assert torch.equal(got.cpu(), want)


def test_kernel_refuses_a_mask_narrower_than_the_vocabulary():
    logits = torch.zeros(1, 100, device=DEV)
    with pytest.raises(KernelContractError, match="bitmask must be int32"):
        apply_token_bitmask(logits, torch.zeros(1, 3, dtype=torch.int32, device=DEV),
                            torch.zeros(1, dtype=torch.int64, device=DEV))


@pytest.mark.gpu
def test_kernel_on_the_gpu_at_the_qwen_vocabulary():
    assert torch.cuda.is_available()
    logits, bitmask, rows = _case(8, 248320, [7, 0, 3], 1)
    want = logits.clone()
    ref.apply_token_bitmask(want, bitmask, rows)
    got = logits.cuda()
    apply_token_bitmask(got, bitmask.cuda(), rows.cuda())
    assert torch.equal(got.cpu(), want)


def test_twin_never_draws_a_masked_token_where_the_uniform_is_one():
    """The uniform's top value rounds to 1.0 in fp32 (about once per 2^24 tokens): a -inf token there had a
    NaN score, which argmax picked (a grammar-masked token sampled in about 1.5% of Qwen-vocabulary steps)."""
    V = 248320
    seeds = torch.zeros(1, dtype=torch.int64)
    hit = None
    for step in range(400):
        u = ref.sampling_uniforms(seeds, torch.tensor([step]), V)[0]
        ones = torch.nonzero(u == 1.0).flatten()
        if len(ones):
            hit = (step, int(ones[0]))
            break
    assert hit is not None, "no u == 1.0 in 400 steps: the search range is too small"
    step, token = hit
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0))
    logits[0, token] = float("-inf")
    got = ref.sample_tokens(logits, torch.ones(1), torch.zeros(1, dtype=torch.int32), torch.ones(1), torch.zeros(1),
                            seeds, torch.tensor([step]))
    assert int(got) != token
