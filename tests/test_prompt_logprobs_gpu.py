"""prompt_logprobs on CUDA (fp16 demo model, Triton kernels, decode graphs beside the prefill chunks): close to a
float32 transformers forward on the CPU, across 64-token chunks, with nothing left behind."""
import pytest
import torch
import transformers

from catengine import Engine, SamplingParams

pytestmark = pytest.mark.gpu


def test_prompt_logprobs_on_cuda_match_float32():
    from catengine.tools.demo import demo_model_path
    # the random-weight fp16 model (transformers loads the trained AWQ demo only through gptqmodel)
    engine = Engine(model=str(demo_model_path()), device="cuda", max_model_len=2048, max_num_seqs=8, max_num_batched_tokens=64,
                    kv_cache_memory_bytes=256 << 20)
    text = "Prompt logprobs on the GPU: " + "the quick brown fox jumps over the lazy dog, " * 20
    ids = engine.tokenizer.encode(text)
    assert len(ids) > 3 * 64
    others = [f"Request {i}: tell me about GPUs" for i in range(4)]   # decodes share the steps
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * 4
    outs = engine.generate([ids] + others, [SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)] + params)
    got = outs[0].prompt_logprobs
    assert got[0] is None and len(got) == len(ids) and all(o.prompt_logprobs is None for o in outs[1:])
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(engine.model_path), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    want = torch.tensor([ref[p - 1, ids[p]].item() for p in range(1, len(ids))])
    mine = torch.tensor([got[p].logprob for p in range(1, len(ids))])
    assert all(got[p].token_id == ids[p] and len(got[p].top) == 3 for p in range(1, len(ids)))
    # fp16 activations against float32: ~1e-3 relative is rounding (as in tests/models/test_model_gpu.py)
    rel = ((mine - want).norm() / want.norm()).item()
    assert rel < 2e-2, rel
    top1 = torch.tensor([got[p].top[0][0] for p in range(1, len(ids))])
    assert (top1 == ref[:-1].argmax(-1)).float().mean() >= 0.9
    engine.check_integrity()
    stats = engine.stats()
    assert stats["num_running"] == 0 and stats["num_free_kv_blocks"] == stats["num_kv_blocks"]
