"""Decode steps replayed through the padded static buffers of the CUDA-graph runner give the same
tokens as eager steps, for every padded batch size, and leave nothing behind. On the CPU the graphs
run eagerly (``capture=False``) on exactly the buffers a replay reads, so the padding rows (no KV
write, padding state slot, zeroed state) are what is checked here; tests/test_engine_gpu.py replays
real graphs."""
from __future__ import annotations

import pytest
import torch

from catengine import Engine, SamplingParams
from catengine.cuda_graphs import graph_batch_sizes
from tests.support import assert_clean
from tests.test_engine import PROMPTS, _engine


def test_graph_batch_sizes():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph_batch_sizes(1000)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:]))


def _staggered(engine: Engine) -> list[list[int]]:
    # different lengths: the decode batch shrinks 11 -> 1 one sequence at a time, crossing padded sizes
    params = [SamplingParams(temperature=0.0, max_tokens=2 + i, ignore_eos=True) for i in range(11)]
    return [o.token_ids for o in engine.generate(PROMPTS[:11], params)]


@pytest.fixture(scope="module")
def eager_tokens(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=16, enable_prefix_caching=False)
    assert engine.runner.graphs is None   # CPU: never captured
    out = _staggered(engine)
    assert_clean(engine)
    return out


@pytest.mark.parametrize("max_num_seqs", [16, 12])
def test_padded_graph_buffers_give_eager_tokens(tiny_model_dir, eager_tokens, max_num_seqs):
    engine = _engine(tiny_model_dir, max_num_seqs=max_num_seqs, enable_prefix_caching=False)
    engine.runner.enable_decode_graphs(capture=False)
    graphs = engine.runner.graphs
    plan = engine.memory_plan
    assert graphs.pad_state_slot == plan.num_state_slots - 1 == plan.num_live_slots + plan.num_snapshot_slots
    assert _staggered(engine) == eager_tokens
    assert graphs.num_runs >= 11   # every decode step went through the padded buffers
    assert_clean(engine)


def test_padding_rows_write_only_the_padding_slot(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=8, enable_prefix_caching=False)
    engine.runner.enable_decode_graphs(capture=False)
    graphs, caches = engine.runner.graphs, engine.runner.caches
    for layer in caches.layers:   # a live-looking cache: every byte nonzero
        for t in vars(layer).values():
            if isinstance(t, torch.Tensor):
                t.uniform_(0.5, 1.0)
    before = [[t.clone() for t in vars(layer).values()] for layer in caches.layers]
    # 3 decode rows (padded to 4): positions 5, 9, 2 in blocks 3|4, 6|7|8, 10 of 4 tokens; slots 1, 2, 5
    host = {"input_ids": torch.tensor([7, 8, 9]), "positions": torch.tensor([5, 9, 2]),
            "seq_lens": torch.tensor([6, 10, 3], dtype=torch.int32),
            "block_tables": torch.tensor([[3, 4, 0], [6, 7, 8], [10, 0, 0]], dtype=torch.int32),
            "slot_mapping": torch.tensor([4 * 4 + 1, 8 * 4 + 1, 10 * 4 + 2]),
            "state_slots": torch.tensor([1, 2, 5], dtype=torch.int32)}
    hidden = graphs.run(host)
    assert graphs.padded_size(3) == 4 and hidden.shape[0] == 3 and torch.isfinite(hidden).all()
    written_kv = {(4, 1), (8, 1), (10, 2)}
    written_slots = {1, 2, 5, graphs.pad_state_slot}
    for layer, old in zip(caches.layers, before):
        if hasattr(layer, "k"):
            for new, prev in zip((layer.k, layer.v), old):
                changed = {(b, s) for b, s in (new != prev).any(-1).any(-1).nonzero().tolist()}
                assert changed == written_kv
        else:
            for new, prev in zip((layer.conv, layer.ssm), old):
                changed = set((new != prev).flatten(1).any(1).nonzero().flatten().tolist())
                assert changed == written_slots


def test_prefix_hits_and_graphs_together(tiny_model_dir, eager_tokens):
    engine = _engine(tiny_model_dir, max_num_seqs=16)
    engine.runner.enable_decode_graphs(capture=False)
    first = _staggered(engine)
    again = _staggered(engine)   # the same prompts: prefix hits restore GDN snapshots, decodes replay
    assert first == again == eager_tokens
    assert engine.stats()["prefix_cache_hits"] > 0
    assert_clean(engine)


def test_warm_up_runs_on_throwaway_caches(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=4)
    caches = engine.runner.caches
    before = [t.clone() for layer in caches.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    seconds = engine.runner.warm_up()
    after = [t for layer in caches.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    assert seconds >= 0 and engine.runner.caches is caches
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_close_drops_the_graphs(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_num_seqs=4)
    engine.runner.enable_decode_graphs(capture=False)
    engine.close()
    assert engine.runner.graphs is None and engine.runner.caches is None



@pytest.mark.parametrize("preset,kv", [("tiny-moe", "auto"), ("tiny-dense", "fp8_e5m2")])
def test_padded_buffers_with_awq_moe_and_fp8_kv(tmp_path, preset, kv):
    """Padding rows through MoE routing (they route somewhere, their outputs are dropped), AWQ linears
    and an fp8 KV store (slot -1 writes nothing)."""
    from catengine.tools.bench_common import BENCH_PRESETS
    from catengine.tools.random_checkpoint import write_random_checkpoint
    spec, group = BENCH_PRESETS[preset]
    path = write_random_checkpoint(tmp_path / preset, spec, quant="awq", group_size=group, progress=False)
    kw = dict(model=str(path), max_model_len=1024, max_num_seqs=16, kv_cache_dtype=kv, kv_cache_memory_bytes=64 << 20)
    padded, eager = Engine(**kw), Engine(**kw)
    padded.runner.enable_decode_graphs(capture=False)
    prompts = [[(7 * i + 3 * j) % 400 + 1 for j in range(5 + 9 * i)] for i in range(11)]
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(11)]
    a = [o.token_ids for o in padded.generate(prompts, params)]
    b = [o.token_ids for o in eager.generate(prompts, params)]
    assert a == b and padded.runner.graphs.num_runs >= 20 and len({tuple(t) for t in a}) > 5
    assert_clean(padded)
