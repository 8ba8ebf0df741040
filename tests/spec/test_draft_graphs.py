"""The MTP draft-pass graphs' padded static buffers, run eagerly (capture=False: the CPU checks the layout, the
GPU test the capture), and the reduced draft vocabulary. The drafts themselves are compared, not only the
output tokens: the verify step would hide wrong drafts behind correct output."""
from pathlib import Path

import pytest

from catengine import Engine
from catengine.errors import ConfigError
from catengine.sampling import SamplingParams
from catengine.spec import MTPDrafter
from catengine.spec.draft_graphs import build_draft_graphs
from catengine.spec.graphs import build_verify_graphs
from catengine.spec.vocab import draft_vocab_ids, ranked_token_ids
from tests.support import assert_clean

from .helpers import engine, write_tiny_mtp_model

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = ["Hello world, this is", "The quick brown fox jumps over the lazy dog and then it runs far away into the "
           "forest where nobody can see it any more", "1 2 3 4 5 6 7", "a"]
SETTINGS = dict(max_num_seqs=8, max_num_batched_tokens=16, block_size=4)


def greedy(max_tokens=12):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return write_tiny_mtp_model(tmp_path_factory.mktemp("mtp_graphs"))


def record_drafts(e) -> list:
    """Wrap the runner: every step's (seq_id, drafts) pairs, in order, read after the step is launched (the graph
    path's drafts reach the items' draft_tokens in the acceptance, with the target's tokens; speculating steps
    run synchronously, so the acceptance is done when launch returns)."""
    log, launch = [], e.runner.launch

    def wrapped(out, *args, **kwargs):
        pending = launch(out, *args, **kwargs)
        log.append([(it.seq.seq_id, list(it.draft_tokens)) for it in out.scheduled if it.num_drafts])
        return pending
    e.runner.launch = wrapped
    return log


def tokens(results):
    return [[list(c.token_ids) for c in r.outputs] for r in results]


def with_graphs(e, verify=True):
    if verify:
        e.runner.verify_graphs = build_verify_graphs(e.runner, capture=False)
    e.runner.drafter.graphs = build_draft_graphs(e.runner, e.runner.drafter, capture=False)
    return e.runner.drafter.graphs


@pytest.mark.parametrize("k", [1, 2, 4])
def test_draft_graph_padding_gives_the_eager_drafts(dense, k):
    params = [greedy(12), greedy(9), greedy(14), greedy(5)]
    want = tokens(engine(dense, **SETTINGS).generate(PROMPTS, params))
    eager = engine(dense, k, **SETTINGS, cuda_graph_sizes=(1, 2, 4, 8))
    eager_drafts = record_drafts(eager)
    assert tokens(eager.generate(PROMPTS, params)) == want
    e = engine(dense, k, **SETTINGS, cuda_graph_sizes=(1, 2, 4, 8))
    graphs = with_graphs(e)
    drafts = record_drafts(e)
    assert tokens(e.generate(PROMPTS, params)) == want
    assert graphs.num_runs > 0 and e.runner.verify_graphs.num_runs > 0
    assert drafts == eager_drafts   # same steps, same drafts: the padded passes compute the packed ones
    per_pos = "spec_decode_num_accepted_tokens_per_pos"
    assert e.stats()[per_pos] == eager.stats()[per_pos]
    assert_clean(e)


@pytest.mark.parametrize("verify_graphs", [True, False], ids=["verify-graph", "eager-verify"])
def test_device_drafts_with_penalties_and_seeded_sampling(verify_graphs):
    """The graph path's drafts stay on the device: the verify graph reads them there (or, without one, the host
    takes them before the eager verify), and penalties (which count the drafts before each position) and seeded
    sampling see them on the host in time: the tokens are those without speculation. The demo model's trained
    head, so that drafts are accepted and a wrong host copy of them would change the tokens."""
    from catengine.tools.demo import trained_model_path
    path = trained_model_path()
    params = [SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=1.1, frequency_penalty=0.2,
                             ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.9, seed=8, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=20, min_tokens=6, logit_bias={5: 1.0})]
    base = Engine(model=str(path), device="cpu", max_num_seqs=4)
    ids = base.tokenizer.encode((Path(path) / "heldout_code.txt").read_text()[:3000])
    prompts = [ids[:40], ids[400:440], ids[800:830]]
    want = tokens(base.generate(prompts, params))
    e = Engine(model=str(path), device="cpu", max_num_seqs=4, cuda_graph_sizes=(1, 2, 4),
               speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    graphs = with_graphs(e, verify_graphs)
    assert tokens(e.generate(prompts, params)) == want
    s = e.stats()
    assert graphs.num_runs > 0 and s["spec_decode_num_accepted_tokens"] > s["spec_decode_num_drafts"] / 2, s
    assert_clean(e)


def test_draft_graphs_on_the_trained_head_accept_as_eagerly():
    """The demo model's trained head: graph-path drafts equal the eager ones and are accepted (a misplaced row or
    position in the padded layout would show as a collapsed acceptance length)."""
    from catengine.tools.demo import trained_model_path
    path = trained_model_path()
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    runs = []
    for graphs in (False, True):
        e = Engine(model=str(path), device="cpu", max_num_seqs=4, speculative_config=spec, cuda_graph_sizes=(1, 2, 4))
        ids = e.tokenizer.encode((Path(path) / "heldout_code.txt").read_text()[:3000])
        g = with_graphs(e) if graphs else None
        log = record_drafts(e)
        out = tokens(e.generate([ids[:48], ids[400:440]], greedy(24)))
        runs.append((out, log, e.stats()))
        if g is not None:
            assert g.num_runs > 0
        assert_clean(e)
    (out0, log0, s0), (out1, log1, s1) = runs
    assert any(log0) and out1 == out0 and log1 == log0
    assert s1["spec_decode_mean_acceptance_length"] > 1.8, s1


def test_reduced_draft_vocabulary_keeps_the_greedy_tokens(dense, tmp_path):
    want = tokens(engine(dense, **SETTINGS).generate(PROMPTS, greedy(12)))
    ranked = [7, 3, 250, 3, 99]    # most frequent first, a repeat; the rest filled from the lowest ids
    (tmp_path / "ids.txt").write_text(" ".join(map(str, ranked)))
    for extra in ({"draft_vocab_size": 16}, {"draft_vocab_size": 8, "draft_vocab_file": str(tmp_path / "ids.txt")}):
        e = Engine(model=str(dense), device="cpu", speculative_config={"method": "mtp", "num_speculative_tokens": 3,
                                                                        **extra}, cuda_graph_sizes=(1, 2, 4, 8),
                   **SETTINGS)
        drafter = e.runner.drafter
        assert isinstance(drafter, MTPDrafter) and drafter.draft_ids is not None
        allowed = set(drafter.draft_ids.tolist())
        with_graphs(e)
        log = record_drafts(e)
        assert tokens(e.generate(PROMPTS, greedy(12))) == want
        proposed = {t for step in log for _, d in step for t in d}
        assert proposed and proposed <= allowed, (proposed - allowed)
        assert e.runner.drafter.graphs.num_runs > 0
        assert_clean(e)
    assert allowed == {7, 3, 250, 99, 0, 1, 2, 4} | set(e.eos_token_ids)


def test_draft_vocab_ids_choice():
    assert draft_vocab_ids(None, 100) is None
    assert draft_vocab_ids({"draft_vocab_size": 100}, 100) is None              # the whole vocabulary
    assert draft_vocab_ids({"draft_vocab_size": 4}, 100, (97,)).tolist() == [0, 1, 2, 3, 97]

    class Tok:
        def encode(self, text):
            return [int(t) for t in text.split()]
    assert ranked_token_ids(Tok(), ["5 5 2 9", "9 5"]) == [5, 9, 2]


@pytest.mark.parametrize("extra,match", [
    ({"draft_vocab_size": 0}, "draft_vocab_size must be a positive integer"),
    ({"draft_vocab_file": "x"}, "draft_vocab_file needs draft_vocab_size"),
])
def test_bad_draft_vocab_config_is_refused(extra, match):
    with pytest.raises(ConfigError, match=match):
        Engine(model="/nonexistent", speculative_config={"method": "mtp", "num_speculative_tokens": 2, **extra})


def test_draft_vocab_under_tensor_parallelism_is_refused():
    with pytest.raises(ConfigError, match="not supported with tensor_parallel_size > 1"):
        Engine(model="/nonexistent", tensor_parallel_size=2,
               speculative_config={"method": "mtp", "num_speculative_tokens": 2, "draft_vocab_size": 64})


def test_bad_draft_vocab_file_is_refused(dense, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 999999")
    for path, match in ((bad, "outside the vocabulary"), (tmp_path / "missing.txt", "cannot be read")):
        with pytest.raises(ConfigError, match=match):
            engine_with = {"method": "mtp", "num_speculative_tokens": 2, "draft_vocab_size": 4,
                           "draft_vocab_file": str(path)}
            Engine(model=str(dense), device="cpu", speculative_config=engine_with, **SETTINGS)


def test_cli_takes_the_draft_vocabulary(dense, capsys):
    from catengine.cli import main
    argv = ["generate", PROMPTS[1], "--model", str(dense), "--device", "cpu", "--max-tokens", "12",
            "--temperature", "0", "--ignore-eos", "--max-num-seqs", "4"]
    assert main(argv) == 0
    want = capsys.readouterr().out
    spec = '{"method": "mtp", "num_speculative_tokens": 3, "draft_vocab_size": 64}'
    assert main(argv + ["--speculative-config", spec]) == 0
    assert capsys.readouterr().out == want and want.strip()


def test_reduced_draft_vocabulary_over_the_int8_lm_head(dense):
    """With quantize_lm_head int8 the draft head gathers the int8 rows and their scales."""
    want = tokens(engine(dense, quantize_lm_head="int8", **SETTINGS).generate(PROMPTS, greedy(10)))
    e = Engine(model=str(dense), device="cpu", quantize_lm_head="int8", cuda_graph_sizes=(1, 2, 4, 8), **SETTINGS,
               speculative_config={"method": "mtp", "num_speculative_tokens": 2, "draft_vocab_size": 32})
    assert isinstance(e.runner.drafter.draft_head, tuple) and e.runner.drafter.draft_head[0].shape[0] >= 32
    with_graphs(e)
    log = record_drafts(e)
    assert tokens(e.generate(PROMPTS, greedy(10))) == want
    assert {t for step in log for _, d in step for t in d} <= set(e.runner.drafter.draft_ids.tolist())
    assert e.runner.drafter.graphs.num_runs > 0
    assert_clean(e)


def test_draft_graphs_through_preemption_forks_and_prefix_hits(dense):
    """The graph path where sequences are preempted and recompute, forks of n = 3 start drafting, and a second
    run starts from the prefix cache: tokens unchanged, graph steps taken, nothing leaked."""
    settings = dict(SETTINGS, num_kv_blocks=24)
    params = [greedy(20), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, n=3), greedy(20), greedy(20)]
    want = tokens(engine(dense, **settings).generate(PROMPTS, params))
    e = engine(dense, 2, **settings, cuda_graph_sizes=(1, 2, 4, 8))
    graphs = with_graphs(e)
    for _ in range(2):
        assert tokens(e.generate(PROMPTS, params)) == want
    s = e.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0 and graphs.num_runs > 0
    assert_clean(e)
