"""MTP speculative decoding end to end on CPU (float32): greedy tokens with drafting equal the tokens without,
whatever the drafts are, in every scheduling situation; nothing leaks."""
import logging

import torch

import pytest

from catengine.errors import ConfigError
from catengine.sampling import SamplingParams
from catengine.spec import ScriptedDrafter
from tests.support import assert_clean

from .helpers import engine, finish, write_tiny_mtp_model

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = ["Hello world, this is", "The quick brown fox jumps over the lazy dog and then it runs far away into the "
           "forest where nobody can see it any more", "1 2 3 4 5 6 7", "a"]
# chunked prefill (the long prompt takes several steps) and verify steps share the budget
SETTINGS = dict(max_num_seqs=8, max_num_batched_tokens=16, block_size=4)


def greedy(max_tokens=12, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def mixed_params():
    return [greedy(12), greedy(9), greedy(14), greedy(5)]


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def model(request, tmp_path_factory):
    return write_tiny_mtp_model(tmp_path_factory.mktemp("mtp_moe" if request.param else "mtp_dense"),
                                moe=request.param)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return write_tiny_mtp_model(tmp_path_factory.mktemp("mtp_dense_only"))


def tokens(results):
    return [[list(c.token_ids) for c in r.outputs] for r in results]


@pytest.fixture(scope="module")
def baseline(model):
    e = engine(model, **SETTINGS)
    batched = e.generate(PROMPTS, mixed_params())
    alone = e.generate(PROMPTS[1], greedy(12))
    return tokens(batched), tokens(alone)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_tokens_equal_without_speculation(model, baseline, k):
    e = engine(model, k, **SETTINGS)
    assert tokens(e.generate(PROMPTS, mixed_params())) == baseline[0]
    assert tokens(e.generate(PROMPTS[1], greedy(12))) == baseline[1]
    # the same prompts again start from the prefix cache (KV blocks and GDN snapshots of the first run)
    hits = e.stats()["prefix_cache_hits"]
    assert tokens(e.generate(PROMPTS, mixed_params())) == baseline[0]
    s = e.stats()
    assert s["prefix_cache_hits"] > hits
    assert s["spec_decode_num_drafts"] > 0 and s["spec_decode_num_draft_tokens"] >= s["spec_decode_num_drafts"]
    assert len(s["spec_decode_num_accepted_tokens_per_pos"]) == k
    assert_clean(e)


@pytest.mark.parametrize("correct", [None, 0, 1], ids=["always-matches", "never-matches", "first-matches"])
def test_test_hook_drafters_give_the_same_tokens(dense, correct):
    base = engine(dense, **SETTINGS).generate(PROMPTS, mixed_params())
    e = engine(dense, 3, **SETTINGS)
    e.runner.drafter = ScriptedDrafter(expected(base), e.vocab_size, correct)
    assert tokens(e.generate(PROMPTS, mixed_params())) == tokens(base)
    s = e.stats()
    drafts, per_pos = s["spec_decode_num_draft_tokens"], s["spec_decode_num_accepted_tokens_per_pos"]
    assert drafts > 0
    if correct is None:   # every draft is the target's own token: all accepted, several tokens per step
        assert s["spec_decode_num_accepted_tokens"] == drafts
        assert s["spec_decode_mean_acceptance_length"] > 2
    elif correct == 0:
        assert s["spec_decode_num_accepted_tokens"] == 0
    else:                 # a partial acceptance every round: the state continues from a middle slot
        assert per_pos[0] == s["spec_decode_num_drafts"] and per_pos[1] == 0
    assert_clean(e)


def expected(results):
    return {(tuple(r.prompt_token_ids), c.index): list(c.token_ids) for r in results for c in r.outputs}


def test_stops_inside_an_accepted_run_cut_exactly(dense):
    ref = engine(dense, **SETTINGS).generate(PROMPTS[:3], greedy(16))
    outs = [list(r.outputs[0].token_ids) for r in ref]
    texts = [r.outputs[0].text for r in ref]
    params = [
        greedy(16, stop_token_ids=[outs[0][6]]),              # a stop token mid-run
        greedy(16, stop=[texts[1][len(texts[1]) // 2:len(texts[1]) // 2 + 3]]),   # a stop string
        greedy(7),                                            # max_tokens
    ]
    want = engine(dense, **SETTINGS).generate(PROMPTS[:3], params)
    e = engine(dense, 4, **SETTINGS)
    e.runner.drafter = ScriptedDrafter(expected(ref), e.vocab_size)   # long accepted runs: the stops fall inside one
    got = e.generate(PROMPTS[:3], params)
    assert tokens(got) == tokens(want)
    assert list(finish(got).values()) == list(finish(want).values())   # reasons, stop reasons, texts
    assert [c.finish_reason for r in got for c in r.outputs] == ["stop", "stop", "length"]
    assert e.stats()["spec_decode_mean_acceptance_length"] > 2
    assert_clean(e)


@pytest.mark.parametrize("correct", [None, 1, "mtp"], ids=["always-matches", "first-matches", "mtp-head"])
def test_preemption_and_n_greater_than_one(dense, correct):
    # 24 blocks of 4 tokens: four sequences of up to ~50 tokens cannot all hold their blocks, so some are
    # preempted and recompute; n=3 forks children from the leader's prompt
    settings = dict(SETTINGS, num_kv_blocks=24)
    params = [greedy(20), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, n=3), greedy(20), greedy(20)]
    base = engine(dense, **settings).generate(PROMPTS, params)
    e = engine(dense, 2, **settings)
    if correct != "mtp":
        e.runner.drafter = ScriptedDrafter(expected(base), e.vocab_size, correct)
    assert tokens(e.generate(PROMPTS, params)) == tokens(base)
    assert e.stats()["num_preemptions"] > 0 and e.stats()["spec_decode_num_drafts"] > 0
    assert_clean(e)


@pytest.mark.parametrize("correct", [None, 1, "mtp"], ids=["always-matches", "first-matches", "mtp-head"])
def test_seeded_sampling_and_penalties_give_the_same_tokens(dense, correct):
    """Every verified position draws with the request's seed and output step, as a decode step would: a seeded
    request gets the tokens it gets without speculation, penalties and min_tokens included."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=5, seed=8, max_tokens=12, repetition_penalty=1.3,
                             frequency_penalty=0.5, presence_penalty=0.3, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, min_tokens=10, logit_bias={5: 3.0}),
              SamplingParams(temperature=0.7, min_p=0.1, seed=9, max_tokens=12, n=2, ignore_eos=True)]
    base = engine(dense, **SETTINGS).generate(PROMPTS, params)
    e = engine(dense, 3, **SETTINGS)
    if correct != "mtp":
        e.runner.drafter = ScriptedDrafter(expected(base), e.vocab_size, correct)
    assert tokens(e.generate(PROMPTS, params)) == tokens(base)
    s = e.stats()
    assert s["spec_decode_num_drafts"] > 0
    if correct is None:
        assert s["spec_decode_num_accepted_tokens"] == s["spec_decode_num_draft_tokens"]
    assert_clean(e)


def test_sampled_distribution_agrees_with_no_speculation(dense):
    """Two-sample chi-square over independent seeds: the second and third tokens (drawn by verify positions,
    the drafts proposing each position's most frequent token) are distributed as without speculation. top_k=4 keeps four
    categories per position."""
    n = 300
    prompt = PROMPTS[0]

    def draws(k, seeds, drafts=None):
        e = engine(dense, k, disable_by_batch_size=n, max_num_seqs=64, max_num_batched_tokens=512, block_size=4)
        if k:
            e.runner.drafter = ScriptedDrafter(drafts, e.vocab_size)
        res = e.generate([prompt] * n, [SamplingParams(temperature=1.5, top_k=4, seed=s, max_tokens=3,
                                                         ignore_eos=True) for s in seeds])
        stats.append(e.stats())
        return res

    stats = []
    base = draws(0, range(n))
    a = [tuple(r.outputs[0].token_ids[1:]) for r in base]
    # the drafts: at each output position the token seen most often there without speculation
    mode = [max(set(col), key=col.count) for col in ([list(r.outputs[0].token_ids)[i] for r in base] for i in range(3))]
    b = [tuple(r.outputs[0].token_ids[1:])
         for r in draws(2, range(10_000, 10_000 + n), {(tuple(base[0].prompt_token_ids), 0): mode})]
    for pos in (0, 1):
        cats = sorted({x[pos] for x in a + b})
        ca = torch.tensor([sum(x[pos] == c for x in a) for c in cats], dtype=torch.float64)
        cb = torch.tensor([sum(x[pos] == c for x in b) for c in cats], dtype=torch.float64)
        keep = (ca + cb) >= 10   # pool rare categories (they carry no power and break the approximation)
        ca = torch.cat([ca[keep], ca[~keep].sum()[None]]) if (~keep).any() else ca
        cb = torch.cat([cb[keep], cb[~keep].sum()[None]]) if (~keep).any() else cb
        tot = ca + cb
        ea, eb = tot * ca.sum() / tot.sum(), tot * cb.sum() / tot.sum()
        chi2 = float((((ca - ea) ** 2 / ea) + ((cb - eb) ** 2 / eb)).sum())
        dof = len(tot) - 1
        # p < 0.001 critical values of chi-square; a biased acceptance (e.g. always keeping the draft) would
        # put far more mass on one token than this allows with 300 samples a side
        assert dof >= 1 and chi2 < {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}.get(dof, 5 * dof), (cats, ca, cb)
    # both outcomes happened: some drafts accepted, some rejected
    assert 0 < stats[1]["spec_decode_num_accepted_tokens"] < stats[1]["spec_decode_num_draft_tokens"]


def test_large_batches_do_not_draft(dense):
    # above disable_by_batch_size running sequences no step drafts: three short prompts are admitted together and
    # run to the same length, so 3 > 2 sequences run in every step
    short = [PROMPTS[0], PROMPTS[2], PROMPTS[3]]
    wide = dict(SETTINGS, max_num_batched_tokens=64)
    want = tokens(engine(dense, **wide).generate(short, greedy(8)))
    from catengine import Engine
    e = Engine(model=str(dense), device="cpu", speculative_config={
        "method": "qwen3_next_mtp", "num_speculative_tokens": 2, "disable_by_batch_size": 2}, **wide)
    assert tokens(e.generate(short, greedy(8))) == want
    assert e.stats()["spec_decode_num_drafts"] == 0
    assert tokens(e.generate(short[:2], greedy(8))) == want[:2]   # two running: they draft
    assert e.stats()["spec_decode_num_drafts"] > 0
    assert_clean(e)


def test_mtp_needs_the_mtp_weights(tiny_model_dir):
    with pytest.raises(ConfigError, match="no mtp.\\* weights"):
        engine(tiny_model_dir, 2)


@pytest.mark.parametrize("spec,match", [
    ({"method": "ngram", "num_speculative_tokens": 2}, "method 'ngram' is not supported"),
    ({"method": "mtp", "num_speculative_tokens": 9}, "integer in \\[1, 8\\]"),
    ({"method": "mtp"}, "integer in \\[1, 8\\]"),
    ({"method": "mtp", "num_speculative_tokens": 2, "model": "x"}, "keys \\['model'\\] are not supported"),
    ("mtp", "must be a dict"),
])
def test_bad_speculative_config_is_refused_before_loading(spec, match):
    from catengine import Engine
    with pytest.raises(ConfigError, match=match):
        Engine(model="/nonexistent", speculative_config=spec)


def test_start_up_hint_when_the_checkpoint_has_an_mtp_head(dense, caplog):
    with caplog.at_level(logging.INFO, logger="catengine"):
        engine(dense, **SETTINGS)
    assert any("--speculative-config" in r.getMessage() for r in caplog.records)


def test_generate_cli_takes_the_speculative_flags(dense, capsys):
    from catengine.cli import main
    argv = ["generate", PROMPTS[1], "--model", str(dense), "--device", "cpu", "--max-tokens", "12",
            "--temperature", "0", "--ignore-eos", "--max-num-seqs", "4"]
    assert main(argv) == 0
    want = capsys.readouterr().out
    assert main(argv + ["--speculative-config", '{"method": "qwen3_5_mtp", "num_speculative_tokens": 3}']) == 0
    assert capsys.readouterr().out == want and want.strip()
    assert main(argv + ["--num-speculative-tokens", "2", "--speculative-disable-by-batch-size", "4"]) == 0
    assert capsys.readouterr().out == want


def test_trained_mtp_head_of_the_demo_model_is_accepted():
    """The demo model's trained head drafts held-out code well (the MTP KV catch-up, the hidden-state chaining
    and the positions all have to be right for that), and the tokens stay those of plain greedy decoding."""
    from pathlib import Path

    from catengine import Engine
    from catengine.tools.demo import trained_model_path
    path = trained_model_path()
    assert path is not None, "catengine/demo_model is part of the repository"
    base = Engine(model=str(path), device="cpu", max_num_seqs=4)
    ids = base.tokenizer.encode((Path(path) / "heldout_code.txt").read_text()[:3000])
    prompts = [ids[:48], ids[400:440]]
    params = greedy(24)
    want = tokens(base.generate(prompts, params))
    e = Engine(model=str(path), device="cpu", max_num_seqs=4,
               speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    assert tokens(e.generate(prompts, params)) == want
    s = e.stats()
    assert s["spec_decode_mean_acceptance_length"] > 1.8, s   # measured 2.2-2.4 at k = 3 (random heads: 1.0)
    assert s["spec_decode_num_accepted_tokens_per_pos"][0] >= s["spec_decode_num_accepted_tokens_per_pos"][2]
    assert_clean(e)


def test_max_model_len_inside_an_accepted_run(dense):
    settings = dict(SETTINGS, max_model_len=40)
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)   # up to the full context
    want = engine(dense, **settings).generate(PROMPTS[0], params)
    e = engine(dense, 4, **settings)
    e.runner.drafter = ScriptedDrafter(expected(want), e.vocab_size)
    got = e.generate(PROMPTS[0], params)
    assert tokens(got) == tokens(want) and len(got[0].prompt_token_ids) + len(got[0].outputs[0].token_ids) == 40
    assert got[0].outputs[0].finish_reason == "length" and e.stats()["spec_decode_num_accepted_tokens"] > 0
    assert_clean(e)


@pytest.mark.parametrize("correct", [None, 1, 0], ids=["always-matches", "first-matches", "never-matches"])
def test_verify_graph_padding_gives_the_same_tokens(dense, correct):
    """The verify CUDA graphs' padded static buffers, run eagerly (capture=False: the CPU checks the padding, the
    GPU tests the capture): uniform verify steps of 1..4 sequences padded to the captured sizes."""
    from catengine.spec.graphs import build_verify_graphs
    base = engine(dense, **SETTINGS).generate(PROMPTS, mixed_params())
    e = engine(dense, 3, **SETTINGS, cuda_graph_sizes=(1, 2, 4, 8))
    e.runner.drafter = ScriptedDrafter(expected(base), e.vocab_size, correct)
    e.runner.verify_graphs = build_verify_graphs(e.runner, capture=False)
    assert tokens(e.generate(PROMPTS, mixed_params())) == tokens(base)
    assert e.runner.verify_graphs.num_runs > 0 and e.stats()["spec_decode_num_drafts"] > 0
    assert_clean(e)
