"""Parity with transformers (float32, CPU): the correctness oracle for the model code."""
import pytest
import torch

from catengine.models.batch import BatchMetadata

from .helpers import PagedRunner, build_hf_model, ours_from_hf

CONFIGS = {
    "dense": dict(moe=False),
    "dense-gqa4-tied-rot0.5": dict(moe=False, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                    "partial_rotary_factor": 0.5}),
    "dense-mha-pattern": dict(moe=False, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=5,
                              layer_types=["full_attention", "linear_attention", "linear_attention",
                                           "full_attention", "linear_attention"], linear_num_value_heads=2),
    "moe": dict(moe=True),
    "moe-tied-gqa": dict(moe=True, tie_word_embeddings=True, num_attention_heads=6, num_key_value_heads=2,
                         linear_num_key_heads=1, linear_num_value_heads=3),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    hf = build_hf_model(seed=list(CONFIGS).index(request.param), **CONFIGS[request.param])
    return hf, ours_from_hf(hf)


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def test_prefill_logits_match(pair):
    hf, ours = pair
    ids = torch.randint(0, 512, (75,), generator=torch.Generator().manual_seed(1)).tolist()
    runner = PagedRunner(ours)
    qlens, slens = [len(ids)], [len(ids)]
    batch = BatchMetadata.build(qlens, slens, [list(range(19))], runner.block_size, [0])
    hidden = ours(torch.tensor(ids), BatchMetadata.positions(qlens, slens), batch, runner.caches)
    err = (ours.compute_logits(hidden) - hf_logits(hf, ids)).abs().max().item()
    assert err <= 1e-4, err


def greedy_ours(ours, prompt, steps, chunk_sizes=None):
    runner = PagedRunner(ours)
    chunk_sizes = chunk_sizes or [len(prompt)]
    pos = 0
    for size in chunk_sizes:
        logits = runner.step({3: prompt[pos:pos + size]})
        pos += size
    assert pos == len(prompt)
    out = []
    for _ in range(steps):
        tok = int(logits[0].argmax())
        out.append(tok)
        logits = runner.step({3: [tok]})
    return out


def hf_generate(hf, prompt, steps):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        # an explicit all-ones mask: with a pad id, generate would mask prompt tokens equal to it
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                          min_new_tokens=steps, eos_token_id=None, pad_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("chunks", [None, [5, 1, 17, 14]], ids=["one-prefill", "chunked"])
def test_greedy_generation_matches_transformers(pair, chunks):
    hf, ours = pair
    prompt = torch.randint(0, 512, (37,), generator=torch.Generator().manual_seed(2)).tolist()
    assert greedy_ours(ours, prompt, 32, chunks) == hf_generate(hf, prompt, 32)


def test_ragged_batch_matches_single_sequences(pair):
    """Several sequences of different lengths in one flat batch, prefill and decode mixed in one step."""
    hf, ours = pair
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 9, 23, 64)]
    expected = [hf_generate(hf, p, 8) for p in prompts]
    runner = PagedRunner(ours)
    # sequence 0 and 1 prefill first; 2 and 3 join while 0 and 1 decode (mixed step); 3 arrives in two chunks
    outs = {i: [] for i in range(4)}
    logits = runner.step({0: prompts[0], 1: prompts[1]})
    next_tok = {0: int(logits[0].argmax()), 1: int(logits[1].argmax())}
    logits = runner.step({0: [next_tok[0]], 1: [next_tok[1]], 2: prompts[2], 3: prompts[3][:40]})
    outs[0].append(next_tok[0]); outs[1].append(next_tok[1])
    next_tok = {0: int(logits[0].argmax()), 1: int(logits[1].argmax()), 2: int(logits[2].argmax())}
    logits = runner.step({0: [next_tok[0]], 1: [next_tok[1]], 2: [next_tok[2]], 3: prompts[3][40:]})
    for i in range(3):
        outs[i].append(next_tok[i])
    next_tok = {i: int(logits[i].argmax()) for i in range(4)}
    while min(len(o) for o in outs.values()) < 8:
        for i in range(4):
            outs[i].append(next_tok[i])
        logits = runner.step({i: [next_tok[i]] for i in range(4)})
        next_tok = {i: int(logits[i].argmax()) for i in range(4)}
    assert [o[:8] for o in outs.values()] == expected
