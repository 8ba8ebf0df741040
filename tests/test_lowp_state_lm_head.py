"""mamba_ssm_cache_dtype and quantize_lm_head through the engine (tiny random model, CPU twins).

- float32 state (explicit, or "auto", the default, on a float32 model) is the engine as before: identical
  greedy tokens.
- A 16-bit state: slots allocated in that dtype (the plan's per-slot bytes follow), teacher-forced next-token
  log-probs close to the float32 state's. Bound: each stored state element carries a relative rounding of at
  most the unit roundoff u (fp16 2^-11, bf16 2^-8); the decay exp(g) <= 1 and the delta-rule update
  (I - beta k k^T, |k| = 1, 0 < beta < 1) are contractions, so the per-token roundings do not compound
  beyond the state's memory, and a log-prob moves by about (sensitivity) x u: the trained demo model measured
  about 0.4 u (bench/NOTES.md), so 4 u on the mean |delta log p| leaves a 10x margin. The lower bound (> 0)
  checks that the state really is stored in 16 bits, the float32 variant that the harness itself is exact.
- int8 lm_head: each weight is off by at most half a step, absmax_row / 254; the logit error is a sum of H
  such terms times the activations, ~ |x| absmax / 254 / sqrt(3); bound 0.05 on the mean |delta log p| (the
  demo model measured 0.007).
"""
import pytest
import torch

from catengine import Engine, SamplingParams
from catengine.tools.lowp_accuracy import compare
from tests.support import assert_clean

pytestmark = pytest.mark.usefixtures("single_thread")
U = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [3] * 9]


def _engine(path, **kw):
    return Engine(str(path), max_model_len=64, block_size=4, max_num_seqs=4, seed=3, **kw)


def test_float32_state_is_the_engine_as_before(tiny_model_dir):
    base = _engine(tiny_model_dir)
    want = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    for dtype in ("float32", "auto"):
        e = _engine(tiny_model_dir, mamba_ssm_cache_dtype=dtype)
        assert e.config.mamba_ssm_cache_dtype == "float32"
        assert all(c.ssm.dtype == torch.float32 for c in e.runner.caches.layers if hasattr(c, "ssm"))
        assert [o.token_ids for o in e.generate(PROMPTS, GREEDY)] == want
        assert_clean(e)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_state_slots_and_plan(tiny_model_dir, dtype):
    e = _engine(tiny_model_dir, mamba_ssm_cache_dtype=dtype)
    base = _engine(tiny_model_dir)
    ssm = [c.ssm for c in e.runner.caches.layers if hasattr(c, "ssm")]
    assert ssm and all(s.dtype == getattr(torch, dtype) for s in ssm)
    saved = sum(s[0].numel() for s in ssm) * 2    # 2 bytes fewer per state element and slot
    assert base.memory_plan.state_bytes_per_slot - e.memory_plan.state_bytes_per_slot == saved
    out = e.generate(PROMPTS, GREEDY)
    assert all(len(o.token_ids) == 12 for o in out)
    assert_clean(e)


def test_int8_lm_head_engine(tiny_model_dir):
    e = _engine(tiny_model_dir, quantize_lm_head="int8")
    q, s = e.model.lm_head_int8
    assert q.dtype == torch.int8 and s.shape == (q.shape[0],)
    assert all(len(o.token_ids) == 12 for o in e.generate(PROMPTS, GREEDY))
    assert_clean(e)


def test_teacher_forced_cost_within_the_bounds(tiny_model_dir):
    from catengine.tools.perplexity import load
    model = load(tiny_model_dir, torch.float32, torch.device("cpu"))
    windows = torch.randint(0, model.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    res = compare(model, windows, 8, {"f16": ("float16", False), "bf16": ("bfloat16", False),
                                      "f32": ("float32", False), "int8": ("float32", True)})
    assert res["f32"]["max_abs_dlogp"] == 0.0 and res["f32"]["top1_agree"] == 1.0   # the same computation
    assert 0 < res["f16"]["mean_abs_dlogp"] < 4 * U["float16"]
    assert 0 < res["bf16"]["mean_abs_dlogp"] < 4 * U["bfloat16"]
    assert 0 < res["int8"]["mean_abs_dlogp"] < 0.05
