"""MTP speculative decoding on CUDA (fp16, Triton kernels): the trained demo model's own MTP head drafts, the
verify step runs the multi-row attention, the recurrent GDN rule with per-token state slots and the conv windows,
and greedy tokens equal the tokens without speculation; nothing leaks."""
from pathlib import Path

import pytest

from catengine import Engine, SamplingParams
from tests.support import assert_clean

pytestmark = pytest.mark.gpu


def _prompts(engine):
    text = (Path(engine.model_path) / "heldout_code.txt").read_text()[:6000]
    ids = engine.tokenizer.encode(text)
    return [ids[i * 300:i * 300 + 40 + 7 * i] for i in range(6)]


GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def reference():
    """(prompts, greedy tokens without speculation): what every speculative run here must reproduce."""
    base = Engine(model=None, device="cuda", max_num_seqs=8, max_model_len=2048, gpu_memory_utilization=0.3)
    prompts = _prompts(base)
    want = [list(o.outputs[0].token_ids) for o in base.generate(prompts, GREEDY)]
    base.close()
    return prompts, want


def test_mtp_on_cuda_matches_greedy_and_accepts(reference):
    prompts, want = reference
    params = GREEDY
    engine = Engine(model=None, device="cuda", max_num_seqs=8, max_model_len=2048, gpu_memory_utilization=0.3,
                    speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    assert engine.runner.verify_graphs is not None, "the verify CUDA graphs were not captured (see the log)"
    drafts = engine.runner.drafter.graphs
    assert drafts is not None, "the MTP draft CUDA graphs were not captured (see the log)"
    got = [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params)]
    s = engine.stats()
    print("verify graph steps", engine.runner.verify_graphs.num_runs, "draft graph steps", drafts.num_runs)
    assert engine.runner.verify_graphs.num_runs > 0 and drafts.num_runs > 0
    print("mean acceptance length", s["spec_decode_mean_acceptance_length"], "per position",
          s["spec_decode_num_accepted_tokens_per_pos"])
    assert got == want
    assert s["spec_decode_mean_acceptance_length"] > 1.5   # the trained head: ~2.2-2.4 on CPU at k = 3
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=11, max_tokens=24, ignore_eos=True)
    assert len(engine.generate(prompts[:3], seeded)) == 3
    assert_clean(engine)
    engine.close()
    # the eager drafter (no graphs at all) accepts about as much: a wrong row, position or slot in the draft
    # graphs' padded layout would show as a lower acceptance there (fp16 rounding of the padded GEMMs may flip a
    # near-tie draft now and then, hence the margin)
    eager = Engine(model=None, device="cuda", max_num_seqs=8, max_model_len=2048, gpu_memory_utilization=0.3,
                   enforce_eager=True, speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    assert [list(o.outputs[0].token_ids) for o in eager.generate(prompts, params)] == want
    e_acc = eager.stats()["spec_decode_mean_acceptance_length"]
    print("eager drafter: mean acceptance length", e_acc)
    assert s["spec_decode_mean_acceptance_length"] > e_acc - 0.2
    eager.close()


def test_reduced_draft_vocabulary_on_cuda_keeps_the_tokens(reference):
    """The draft lm_head over the 2,048 lowest ids of the demo model's 8,192 (inside the draft graphs): greedy
    tokens unchanged, drafts still accepted."""
    prompts, want = reference
    params = GREEDY
    engine = Engine(model=None, device="cuda", max_num_seqs=8, max_model_len=2048, gpu_memory_utilization=0.3,
                    speculative_config={"method": "mtp", "num_speculative_tokens": 3, "draft_vocab_size": 2048})
    assert engine.runner.drafter.draft_ids is not None and engine.runner.drafter.graphs is not None
    got = [list(o.outputs[0].token_ids) for o in engine.generate(prompts, params)]
    s = engine.stats()
    print("reduced vocab: mean acceptance length", s["spec_decode_mean_acceptance_length"])
    assert got == want and engine.runner.drafter.graphs.num_runs > 0
    assert s["spec_decode_mean_acceptance_length"] > 1.3
    assert_clean(engine)
    engine.close()
