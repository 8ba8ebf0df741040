"""fp16 safety on CUDA (-m gpu): the overflow models of tests/models/overflow.py (residual stream past
65,504) in fp16 through the Triton kernels, directly and in the engine with CUDA graphs on: no inf/NaN,
and a match with the float32 run on the CPU. The bound is the CPU test's (test_fp16_overflow.py: 2e-2
of the logits' scale, the worst-case sum of ~40 fp16 roundings); the Triton kernels round at the same
points as the twins (the W4A16 path's half2 products do not arise: these experts are dense)."""
import pytest
import torch

from catengine import Engine, SamplingParams
from catengine.models import ModelConfig, model_class

from .helpers import PagedRunner, ours_from_hf
from .overflow import FP16_MAX, StreamProbe, build_overflow_hf
from .test_fp16_overflow import DECODE, PROMPT, REL_TOL, run

pytestmark = pytest.mark.gpu
# the CPU test's models have head_dim 32; the Triton attention kernels have launch configs for 64, 128, 256
HEAD_DIM = 64


def on_cuda(hf):
    config = ModelConfig.from_hf(hf.config.to_dict())
    model = model_class(config.architecture)(config, torch.float16, "cuda")
    model.load_weights((n, p.detach()) for n, p in hf.state_dict().items())
    return model


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fp16_triton_kernels_match_float32(kind, monkeypatch):
    hf = build_overflow_hf(kind, head_dim=HEAD_DIM)
    probe = StreamProbe(monkeypatch)
    want = run(hf, torch.float32)
    assert max(probe.streams) > FP16_MAX, probe.streams
    runner = PagedRunner(on_cuda(hf))
    got = torch.cat([runner.step({0: PROMPT}, all_rows=True)] + [runner.step({0: [t]}) for t in DECODE]).cpu()
    assert torch.isfinite(got).all(), "fp16 logits on CUDA are not finite"
    err, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert err <= REL_TOL * scale, (err, scale)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_fp16_engine_with_cuda_graphs_matches_float32(kind, tmp_path):
    """Greedy decode in the engine (fp16, CUDA graphs captured and replayed), then the float32 model
    teacher-forced on the engine's tokens: each token is float32's argmax where float32's top two are
    further apart than the bound, and its logprob is float32's within twice the bound."""
    from catengine.tools.demo import demo_model_path
    from catengine.tools.tiny_model import TOKENIZER_KEEP, write_small_tokenizer
    hf = build_overflow_hf(kind, head_dim=HEAD_DIM)
    hf.save_pretrained(str(tmp_path))
    write_small_tokenizer(demo_model_path() / "tokenizer.json", tmp_path / "tokenizer.json", TOKENIZER_KEEP)
    (tmp_path / "tokenizer_config.json").write_bytes((demo_model_path() / "tokenizer_config.json").read_bytes())
    engine = Engine(model=str(tmp_path), device="cuda", dtype="float16", max_model_len=512, max_num_seqs=4,
                    kv_cache_memory_bytes=64 << 20)
    assert engine.runner.graphs is not None and engine.runner.graphs.capture
    out = engine.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0))[0]
    assert engine.runner.graphs.num_runs > 0
    tokens = list(out.token_ids)
    assert len(tokens) == 12
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT + tokens[:-1]])).logits[0, len(PROMPT) - 1:].float()
    logp = logits.log_softmax(-1)
    scale = logits.abs().max().item()
    top2 = logits.topk(2, dim=-1).values
    for i, (tok, lp) in enumerate(zip(tokens, out.logprobs)):
        assert lp.logprob == lp.logprob and abs(lp.logprob - logp[i, tok].item()) <= 2 * REL_TOL * scale, i
        if top2[i, 0] - top2[i, 1] > 2 * REL_TOL * scale:
            assert tok == int(logits[i].argmax()), i
    engine.check_integrity()
