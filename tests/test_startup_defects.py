"""Start-up defects a new user hit (issue 24), each checked without a GPU: float32 on CUDA is refused at start-up
with the fix (it crashed in the GDN kernel: 279,552 B of shared memory asked on the H200), and the capacity line
says "1 sequence", not "1 sequences"."""
import pytest
import torch

from catengine.config import check_dtype_supported
from catengine.engine import capacity_line
from catengine.errors import ConfigError
from catengine.memory import MemoryPlan


def test_float32_on_cuda_is_a_config_error_that_names_the_fix():
    with pytest.raises(ConfigError, match="float32 is not supported on CUDA.*dtype='float16'.*device='cpu'"):
        check_dtype_supported(torch.float32, torch.device("cuda"))
    with pytest.raises(ConfigError, match="float32"):
        check_dtype_supported(torch.float32, torch.device("cuda", 0))
    check_dtype_supported(torch.float32, torch.device("cpu"))   # the CPU path (torch twins) runs float32


def _plan(blocks: int, max_model_len: int) -> MemoryPlan:
    return MemoryPlan(num_blocks=blocks, block_size=16, num_live_slots=1, num_snapshot_slots=0,
                      max_model_len=max_model_len, kv_bytes_per_block=1, state_bytes_per_slot=1, budget_bytes=1,
                      used_bytes=1)


def test_capacity_line_counts_in_words():
    one = capacity_line(_plan(4, 64), 1, None)
    assert "= 1 sequence of max_model_len 64" in one and "64 tokens" in one and "off (eager)" in one
    many = capacity_line(_plan(8, 64), 2, 2)
    assert "= 2 sequences of" in many and "batch sizes up to 2" in many


@pytest.mark.gpu
def test_float32_engine_on_cuda_fails_before_loading():
    from catengine import Engine
    with pytest.raises(ConfigError, match="float32 is not supported on CUDA"):
        Engine(model=None, device="cuda", dtype="float32", max_model_len=1024)


@pytest.mark.gpu
def test_cuda_graph_sizes_are_the_captured_ones():
    from catengine import Engine, SamplingParams
    engine = Engine(model=None, device="cuda", max_model_len=1024, max_num_seqs=8, cuda_graph_sizes=(1, 3, 64),
                    kv_cache_memory_bytes=256 << 20)
    try:
        assert engine.runner.graphs is not None and engine.runner.graphs.batch_sizes == [1, 3]  # 64 > max_num_seqs
        outs = engine.generate(["a", "b"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        assert [len(o.token_ids) for o in outs] == [4, 4]
        engine.check_integrity()
    finally:
        engine.close()
