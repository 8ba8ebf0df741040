"""Tensor-parallel pieces without an engine: which sizes split, the 4-bit alignment checks, the shards
adding up to the whole weights, and the MTP head's forward at TP2 against TP1."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from catengine.config import EngineConfig
from catengine.distributed.group import TPGroup
from catengine.errors import ConfigError
from catengine.models import ModelConfig, load_model
from catengine.models.batch import BatchMetadata
from catengine.models.sharding import TPLayout, check_tp_size
from catengine.tools.quantize import quantize_checkpoint

from .helpers import tiny_checkpoint

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tmp_path_factory.mktemp("tp_unit_ckpts")


def test_sizes_that_do_not_split_name_the_dimension_and_a_size_that_works(ckpts):
    cfg = ModelConfig.from_pretrained(tiny_checkpoint(ckpts))
    check_tp_size(cfg, 4)
    with pytest.raises(ConfigError, match=r"num_attention_heads=4.* use tensor_parallel_size 4"):
        check_tp_size(cfg, 8)
    odd = dataclasses.replace(cfg, num_key_value_heads=3, num_attention_heads=6)
    with pytest.raises(ConfigError, match=r"num_key_value_heads=3"):
        check_tp_size(odd, 2)
    with pytest.raises(ConfigError, match="must be one of"):
        check_tp_size(cfg, 3)
    with pytest.raises(ConfigError, match="tensor_parallel_size must be 1, 2, 4 or 8"):
        EngineConfig(tensor_parallel_size=3).validate()
    with pytest.raises(ConfigError, match="distributed_executor_backend 'ray'"):
        EngineConfig(distributed_executor_backend="ray").validate()
    from catengine import Engine
    with pytest.raises(ConfigError, match="tensor_parallel_size 8 does not split this model"):
        Engine(str(tiny_checkpoint(ckpts)), device="cpu", tensor_parallel_size=8)


def test_kv_heads_are_replicated_when_fewer_than_ranks(ckpts):
    cfg = ModelConfig.from_pretrained(tiny_checkpoint(ckpts))   # 4 q heads, 2 KV heads
    starts = [TPLayout.of(cfg, r, 4).kv_start for r in range(4)]
    assert starts == [0, 0, 1, 1] and TPLayout.of(cfg, 0, 4).nkv == 1
    # q heads of rank r belong to KV head r // 2 in the unsharded model (GQA group of 2)
    assert [r * TPLayout.of(cfg, r, 4).nh // (cfg.num_attention_heads // cfg.num_key_value_heads)
            for r in range(4)] == starts


@pytest.fixture(scope="module")
def awq_g16(ckpts):
    dst = ckpts / "moe-awq-g16"
    quantize_checkpoint(tiny_checkpoint(ckpts, moe=True), dst, "awq", group_size=16, progress=False)
    return dst


def test_quantized_cut_inside_a_group_is_a_config_error(awq_g16):
    dst = awq_g16
    # TP4 gives each rank 8 of the experts' 32 intermediate rows: down_proj's input splits inside a group of 16
    with pytest.raises(ConfigError, match=r"experts.*inside a quantization group of 16.*smaller tensor_parallel_size"):
        load_model(dst, tp=TPGroup(1, 4), progress=False)
    load_model(dst, tp=TPGroup(1, 2), progress=False)   # 16 rows per rank: whole groups


def test_engine_start_with_a_bad_cut_raises_it_and_stops_the_workers(awq_g16):
    import multiprocessing

    from catengine import Engine

    with pytest.raises(ConfigError, match="inside a quantization group of 16"):
        Engine(str(awq_g16), device="cpu", tensor_parallel_size=4, num_kv_blocks=16, max_model_len=64)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("catengine-tp")]


@pytest.mark.parametrize("quant", [None, "awq", "compressed-tensors"])
def test_shards_concatenate_to_the_whole_weights(ckpts, quant):
    """Column-parallel slices stacked along the output and row-parallel ones along the input give back
    the TP1 tensors (for 4-bit: the canonical packed words, scales and zeros)."""
    path = tiny_checkpoint(ckpts, moe=True, quant=quant)
    whole = load_model(path, progress=False)
    parts = [load_model(path, tp=TPGroup(r, 2), progress=False) for r in range(2)]

    def same(get, dim):
        w = get(whole)
        fields = ("qweight", "scales", "zeros") if hasattr(w, "qweight") else (None,)
        for f in fields:
            pick = (lambda m: getattr(get(m), f)) if f else get
            # QuantizedWeight is x @ w ([.., K, N]): a column split is its last dim, a row split the one before
            d = dim if f is None else (-1 if dim == -2 else -2)
            torch.testing.assert_close(torch.cat([pick(p) for p in parts], d), pick(whole), rtol=0, atol=0)

    layer = lambda m: m.layers[0]
    same(lambda m: layer(m).mixer.in_proj_ba.weight[: layer(m).mixer.hv], -2)   # the in_proj_b rows (dense)
    same(lambda m: layer(m).mixer.out_proj.weight, -1)
    same(lambda m: m.layers[3].mixer.o_proj.weight, -1)
    same(lambda m: layer(m).mlp.w2, -1)
    same(lambda m: layer(m).mlp.shared_expert.down_proj.weight, -1)
    same(lambda m: m.embed_tokens, -2)
    torch.testing.assert_close(torch.cat([p.layers[0].mixer.A_log for p in parts]), whole.layers[0].mixer.A_log)


def test_mtp_head_forward_under_tp_matches_tp1(ckpts):
    from catengine.distributed.executor import TPExecutor

    path = tiny_checkpoint(ckpts, moe=True, mtp=True)
    ref = load_model(path, load_mtp=True, progress=False)
    assert ref.mtp is not None
    cfg = EngineConfig(model=str(path), device="cpu", tensor_parallel_size=2).resolve(
        device=torch.device("cpu"), max_position_embeddings=ref.config.max_position_embeddings)
    ex = TPExecutor(path, cfg, torch.device("cpu"), load_mtp=True)
    try:
        model = ex.model
        assert model.mtp is not None
        T = 7
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, ref.config.vocab_size, (T,), generator=g)
        h_prev = torch.randn(T, ref.config.hidden_size, generator=g)
        batch = BatchMetadata.build([T], [T], [[0, 1]], 4, [0])
        pos = BatchMetadata.positions([T], [T])
        want = ref.mtp_forward(ids, pos, h_prev, batch, ref.allocate_caches(8, 4, 2))
        got = model.mtp_forward(ids, pos, h_prev, batch, model.allocate_caches(8, 4, 2))
        # fp32 on both sides; only the order of the row-parallel sums differs
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.compute_logits(got), ref.compute_logits(want), rtol=1e-5, atol=1e-4)
    finally:
        ex.shutdown()


def test_expert_parallel_sizes(ckpts, tmp_path):
    """Expert parallelism needs num_experts to divide by the ranks (not the experts' intermediate dim) and a
    MoE model; the error names the fix, before any worker starts."""
    cfg = ModelConfig.from_pretrained(tiny_checkpoint(ckpts, moe=True))     # 8 experts, I 32
    check_tp_size(cfg, 4, True)
    assert [TPLayout.of(cfg, r, 4, True).expert_range for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert TPLayout.of(cfg, 0, 1, True).expert_range is None and TPLayout.of(cfg, 1, 2).expert_range is None
    odd_inter = dataclasses.replace(cfg, moe_intermediate_size=30)
    check_tp_size(odd_inter, 4, True)                  # whole experts: their width does not matter
    with pytest.raises(ConfigError, match="moe_intermediate_size=30"):
        check_tp_size(odd_inter, 4)
    with pytest.raises(ConfigError, match=r"num_experts=6 is not divisible by 4; use tensor_parallel_size 2"):
        check_tp_size(dataclasses.replace(cfg, num_experts=6), 4, True)
    with pytest.raises(ConfigError, match="enable_expert_parallel needs a mixture-of-experts model"):
        check_tp_size(ModelConfig.from_pretrained(tiny_checkpoint(ckpts)), 2, True)
    with pytest.raises(ConfigError, match="enable_expert_parallel must be True or False"):
        EngineConfig(enable_expert_parallel="yes").validate()
    import multiprocessing

    from catengine import Engine
    six = tiny_checkpoint(tmp_path, moe=True, num_experts=6)
    with pytest.raises(ConfigError, match="num_experts=6 is not divisible by 4"):
        Engine(str(six), device="cpu", tensor_parallel_size=4, enable_expert_parallel=True, num_kv_blocks=16,
               max_model_len=64)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("catengine-tp")]
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        Engine(str(tiny_checkpoint(ckpts)), device="cpu", enable_expert_parallel=True, num_kv_blocks=16,
               max_model_len=64)


@pytest.mark.parametrize("quant", [None, "awq"])
def test_expert_parallel_shards_are_whole_experts(ckpts, quant):
    """Each rank's stacks are its experts of the TP1 stacks, bit for bit (fused fp16 stacks cut by expert, and
    per-expert 4-bit tensors stacked from the rank's own); the shared expert stays split."""
    path = tiny_checkpoint(ckpts, moe=True, quant=quant)
    whole = load_model(path, progress=False)
    parts = [load_model(path, tp=TPGroup(r, 4), progress=False, expert_parallel=True) for r in range(4)]
    for name in ("w13", "w2"):
        w = getattr(whole.layers[0].mlp, name)
        for f in (("qweight", "scales", "zeros") if quant else (None,)):
            pick = (lambda v: getattr(v, f)) if f else (lambda v: v)
            got = torch.cat([pick(getattr(p.layers[0].mlp, name)) for p in parts])
            torch.testing.assert_close(got, pick(w), rtol=0, atol=0)
    assert parts[0].layers[0].mlp.expert_range == (0, 2)
    if quant is None:   # row-parallel: the ranks' input slices
        sh = lambda m: m.layers[0].mlp.shared_expert.down_proj.weight
        torch.testing.assert_close(torch.cat([sh(p) for p in parts], -1), sh(whole), rtol=0, atol=0)


def test_one_shot_rendezvous_timeout_is_bounded():
    """The symmetric-memory set-up runs under a deadline: a rendezvous that never returns is a TimeoutError
    after it (setup then falls back to NCCL), an error is re-raised, a result returned."""
    import threading
    import time

    from catengine.distributed.oneshot import within

    stuck = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish in 0 s"):
        within(stuck.wait, 0.2)
    assert time.monotonic() - t0 < 5
    stuck.set()
    with pytest.raises(ZeroDivisionError):
        within(lambda: 1 / 0, 5)
    assert within(lambda: 7, 5) == 7


def test_one_shot_all_reduce_falls_back_on_gloo_with_one_line(caplog):
    import logging

    from catengine.distributed.launch import host_store, make_group

    store = host_store("127.0.0.1", 0, 1)
    with caplog.at_level(logging.WARNING, logger="catengine.distributed"):
        group = make_group(store, 0, 1, torch.device("cpu"), one_shot=True)
    assert group.oneshot is None
    lines = [r.getMessage() for r in caplog.records if "one-shot" in r.getMessage()]
    assert lines == ["one-shot all-reduce is off, falling back to gloo (it needs CUDA (torch symmetric memory); "
                     "this group runs on gloo)"]


@pytest.mark.gpu
def test_gpu_one_shot_all_reduce_on_one_rank():
    """The symmetric-memory path on one GPU (a one-rank NCCL group; several GPUs are issue 23's): set-up
    through our own store and group name, a sum equal to its input, and a replay from a CUDA graph."""
    from catengine.distributed.launch import NO_MULTICAST_ENV, host_store, make_group, set_no_multicast_env

    set_no_multicast_env()
    import os
    assert all(os.environ[k] == v for k, v in NO_MULTICAST_ENV.items())
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    group = make_group(host_store("127.0.0.1", 0, 1), 0, 1, dev, one_shot=True)
    assert group.oneshot is not None
    x = torch.randn(3, 2048, device=dev)
    torch.testing.assert_close(group.oneshot(x), x, rtol=0, atol=0)
    static = torch.zeros(4, 2048, device=dev)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        group.oneshot(static)
    torch.cuda.current_stream(dev).wait_stream(side)
    with torch.cuda.graph(g):
        out = group.oneshot(static)
    y = torch.randn(4, 2048, device=dev)
    static.copy_(y)
    g.replay()
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(out, y, rtol=0, atol=0)
