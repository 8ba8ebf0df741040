"""fp16 safety (V100 has no bf16): a model whose residual stream outgrows fp16's 65,504 runs in fp16
without inf/NaN and matches its float32 run (CPU, through the torch twins).

The fp16 model keeps its residual stream in fp32 (catengine.models.layers.residual_dtype) and hands
the MoE block's fp32 sum to the residual add unrounded; before that, the stream overflowed to inf at
the first layer whose sum passed 65,504 and the next norm turned it into NaN logits.

Tolerance: both runs share the same (fp16-rounded) weights, so the difference is activation rounding
only: every GEMM input, norm output, attention / GDN output and MLP output is rounded to fp16 (relative
2^-11 = 4.9e-4 each). Four layers with ~10 such roundings each, the last one the final norm's output
before lm_head: adding them linearly (the worst case, no cancellation) gives ~40 x 4.9e-4 = 2e-2 of
the logits' scale; measured: 7.9e-4 (dense) and 8.3e-4 (MoE) of it. We bound max |dlogit| by 2e-2 x max |logit|.
"""
import pytest
import torch

from .helpers import PagedRunner, ours_from_hf
from .overflow import FP16_MAX, StreamProbe, build_overflow_hf

PROMPT = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
DECODE = [7, 300, 42, 511]    # teacher-forced: both runs see the same tokens
REL_TOL = 2e-2


def run(hf, dtype):
    """Logits of every prompt token, then of 4 decode steps: [44, V] fp32."""
    runner = PagedRunner(ours_from_hf(hf, dtype))
    rows = [runner.step({0: PROMPT}, all_rows=True)]
    rows += [runner.step({0: [tok]}) for tok in DECODE]
    return torch.cat(rows)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fp16_stream_past_65504_matches_float32(kind, monkeypatch):
    hf = build_overflow_hf(kind)
    probe = StreamProbe(monkeypatch)
    want = run(hf, torch.float32)
    # not vacuous: the float32 stream really passes fp16's range (each layer's own output does not:
    # an fp16 GEMM output past 65,504 is out of this scheme's reach, and of this model's)
    assert max(probe.streams) > FP16_MAX, probe.streams
    assert max(probe.outputs) < FP16_MAX, probe.outputs
    got = run(hf, torch.float16)
    assert torch.isfinite(got).all(), "fp16 logits are not finite"
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert err <= REL_TOL * scale, (err, scale)
    # greedy tokens agree except where float32's top two are closer than the error bound
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * REL_TOL * scale
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()
