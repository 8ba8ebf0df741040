"""Tensor parallelism on the CPU over gloo: TP2/TP4 greedy tokens equal TP1's (dense and MoE; fp16 loaded
as float32, AWQ and compressed-tensors), through prefix caching, preemption and n > 1; a killed worker
ends the engine promptly with every rank gone; the torchrun-style env path."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catengine import Engine
from catengine.errors import EngineDead
from catengine.sampling import SamplingParams

from .helpers import tiny_checkpoint

pytestmark = pytest.mark.usefixtures("single_thread")

# 9 shared-prefix prompts of 10-13 tokens (block 4: prefix-cache hits after the first) and one n=2 request;
# 24 blocks of 4 tokens cannot hold all of them with 12 new tokens each, so sequences get preempted
PREFIX = [5, 17, 33, 2, 91, 64, 7, 250]
PROMPTS = [PREFIX + [i, 3 * i + 1, (7 * i) % 500][: 2 + i % 2] for i in range(9)]
SMALL = dict(device="cpu", block_size=4, num_kv_blocks=24, max_model_len=64, max_num_seqs=6,
             max_num_batched_tokens=64)


def run(engine: Engine) -> list[list[list[int]]]:
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    params = [greedy] * len(PROMPTS) + [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=2)]
    outs = engine.generate(PROMPTS + [PROMPTS[0][:6]], params)
    return [[c.token_ids for c in o.outputs] for o in outs]


_TP1: dict[Path, list] = {}


def tp1_tokens(path: Path):
    if path not in _TP1:
        e = Engine(str(path), **SMALL)
        _TP1[path] = run(e)
        e.close()
    return _TP1[path]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tmp_path_factory.mktemp("tp_ckpts")


@pytest.mark.parametrize("moe,quant,tp", [
    (False, None, 2), (False, None, 4), (True, None, 2), (True, None, 4),
    (False, "awq", 2), (True, "awq", 4), (False, "compressed-tensors", 4), (True, "compressed-tensors", 2),
])
def test_tp_greedy_tokens_equal_tp1(ckpts, moe, quant, tp):
    path = tiny_checkpoint(ckpts, moe=moe, quant=quant)
    want = tp1_tokens(path)
    engine = Engine(str(path), tensor_parallel_size=tp, **SMALL)
    try:
        got = run(engine)
        stats = engine.stats()
        engine.check_integrity()
    finally:
        engine.close()
    assert got == want
    # the scenario really went through the paths it is meant to cover
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    assert len(got[-1]) == 2


def test_each_rank_reads_its_slices_once(ckpts):
    from catengine.models.loader import list_tensors

    path = tiny_checkpoint(ckpts, moe=True, quant="awq")
    full = {t.name: t.nbytes for t in list_tensors(path) if not t.name.startswith("mtp.")}
    engine = Engine(str(path), tensor_parallel_size=2, **SMALL)
    try:
        reports = engine.executor.reports()
    finally:
        engine.close()
    per_name: dict[str, list] = {}
    for r in reports:
        names = [read[0] for read in r["reads"]]
        assert len(names) == len(set(names)), "a rank read a tensor twice"
        assert set(names) == set(full)
        for name, dim, ranges, nbytes in r["reads"]:
            per_name.setdefault(name, []).append((ranges, nbytes))
        assert r["read_bytes"] < 0.75 * sum(full.values())
    for name, reads in per_name.items():
        if reads[0][0] is None:   # replicated: every rank reads all of it
            assert all(n == full[name] for _, n in reads), name
        else:                     # split: the ranks' slices add up to the tensor, none overlapping
            assert sum(n for _, n in reads) == full[name], name
            assert reads[0][0] != reads[1][0], name


@pytest.mark.parametrize("quant,tp", [(None, 2), (None, 4), ("awq", 2), ("awq", 4), ("compressed-tensors", 2),
                                      ("compressed-tensors", 4)])
def test_expert_parallel_greedy_tokens_equal_tp1(ckpts, quant, tp):
    """Whole experts per rank (routing replicated, other ranks' experts skipped, summed by the all-reduce)."""
    path = tiny_checkpoint(ckpts, moe=True, quant=quant)
    want = tp1_tokens(path)
    engine = Engine(str(path), tensor_parallel_size=tp, enable_expert_parallel=True, **SMALL)
    try:
        got = run(engine)
        assert engine.model.local.layers[0].mlp.expert_range == (0, 8 // tp)
        engine.check_integrity()
    finally:
        engine.close()
    assert got == want


@pytest.mark.parametrize("quant", [None, "awq"])
def test_expert_parallel_ranks_read_only_their_experts(ckpts, quant):
    """fp16 stacks are read by expert range, per-expert 4-bit tensors only by the rank holding the expert:
    every expert's bytes are read exactly once over the ranks, and each rank reads under half the experts'."""
    import re

    from catengine.models.loader import list_tensors

    path = tiny_checkpoint(ckpts, moe=True, quant=quant)
    experts = {t.name: t.nbytes for t in list_tensors(path) if ".mlp.experts." in t.name}
    engine = Engine(str(path), tensor_parallel_size=2, enable_expert_parallel=True, **SMALL)
    try:
        reports = engine.executor.reports()
    finally:
        engine.close()
    seen: dict[str, int] = {}
    for rank, r in enumerate(reports):
        mine = [read for read in r["reads"] if ".mlp.experts." in read[0]]
        for name, dim, ranges, nbytes in mine:
            m = re.search(r"\.experts\.(\d+)\.", name)
            if m:                       # per expert: only this rank's 4 of 8, whole
                assert 4 * rank <= int(m[1]) < 4 * (rank + 1) and ranges is None, name
            else:                       # a fused stack: this rank's experts along dim 0
                assert (dim, ranges) == (0, ((4 * rank, 4 * (rank + 1)),)), name
            seen[name] = seen.get(name, 0) + nbytes
        assert sum(read[-1] for read in mine) == sum(experts.values()) // 2
    assert seen == experts


def test_killed_worker_ends_engine_promptly(ckpts):
    path = tiny_checkpoint(ckpts)
    engine = Engine(str(path), tensor_parallel_size=4, **SMALL)
    procs = list(engine.executor.procs)
    assert len(procs) == 3 and all(p.is_alive() for p in procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    procs[1].join(10)
    t0 = time.monotonic()
    with pytest.raises(EngineDead, match="worker catengine-tp2 exited"):
        run(engine)
    with pytest.raises(EngineDead):          # dead stays dead
        run(engine)
    for p in procs:
        p.join(10)
    assert time.monotonic() - t0 < 10
    assert not any(p.is_alive() for p in procs), "a worker outlived the failure"
    engine.close()
    assert not engine.has_unfinished()


def test_killed_worker_mid_step_is_engine_dead(ckpts):
    """The worker dies while rank 0 waits in a collective: gloo's lost peer -> EngineDead, not a hang."""
    path = tiny_checkpoint(ckpts)
    engine = Engine(str(path), tensor_parallel_size=2, **SMALL)
    proc = engine.executor.procs[0]
    check = engine.executor.check_alive
    engine.executor.check_alive = lambda wait_s=0.0: None   # let the step start although the worker is gone
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    t0 = time.monotonic()
    with pytest.raises(EngineDead, match="collective failed"):
        run(engine)
    assert time.monotonic() - t0 < 30
    engine.executor.check_alive = check
    engine.close()


def test_workers_from_torchrun_style_env(ckpts, monkeypatch):
    from tests.server.conftest import free_port

    path = tiny_checkpoint(ckpts)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    worker = subprocess.Popen([sys.executable, "-m", "catengine.distributed.worker"],
                              env={**os.environ, **env, "RANK": "1", "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        for k, v in {**env, "RANK": "0"}.items():
            monkeypatch.setenv(k, v)
        engine = Engine(str(path), tensor_parallel_size=2, distributed_executor_backend="external_launcher", **SMALL)
        assert engine.executor.procs == []
        got = run(engine)
        engine.close()
        assert worker.wait(30) == 0        # asked to stop, it exits cleanly
    finally:
        if worker.poll() is None:
            worker.kill()
    assert got == tp1_tokens(path)


def test_tp_logprobs_prompt_logprobs_and_seeded_sampling_match_tp1(ckpts):
    """Every compute_logits call of a step (sampled rows, prompt-logprob rows) goes through the gathered
    vocab slices; the values differ from TP1 only by the order of the row-parallel fp32 sums."""
    path = tiny_checkpoint(ckpts, moe=True)
    params = [SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True)]
    outs = {}
    for tp in (1, 2):
        engine = Engine(str(path), tensor_parallel_size=tp, **SMALL)
        try:
            outs[tp] = engine.generate([PROMPTS[1], PROMPTS[2]], params)
        finally:
            engine.close()
    a, b = outs[1], outs[2]
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    for x, y in zip(a[0].outputs[0].logprobs, b[0].outputs[0].logprobs):
        assert [t for t, _ in x.top] == [t for t, _ in y.top]
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
    for x, y in zip(a[0].prompt_logprobs[1:], b[0].prompt_logprobs[1:]):
        assert x.token_id == y.token_id and x.rank == y.rank
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)


def test_tp2_with_int8_lm_head_and_fp16_state_equals_tp1_with_them(ckpts):
    # every rank quantises its own vocab slice of the lm_head and allocates 16-bit state slots, so TP2 gives the
    # tokens TP1 gives with the same two settings (a per-row quantisation and per-slot storage split by rank)
    path = tiny_checkpoint(ckpts, moe=False, quant=None)
    kw = dict(SMALL, quantize_lm_head="int8", mamba_ssm_cache_dtype="float16")
    e = Engine(str(path), **kw)
    want = run(e)
    e.close()
    engine = Engine(str(path), tensor_parallel_size=2, **kw)
    try:
        got = run(engine)
        engine.check_integrity()
    finally:
        engine.close()
    assert got == want


@pytest.mark.parametrize("moe", [False, True])
def test_tp2_with_mtp_equals_tp1_without(ckpts, moe):
    # speculative decoding and tensor parallelism together must not change greedy output: every rank loads its
    # shard of the MTP head, the verify forward writes per-token states on every rank
    path = tiny_checkpoint(ckpts, moe=moe, mtp=True)
    want = tp1_tokens(path)
    engine = Engine(str(path), tensor_parallel_size=2,
                    speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **SMALL)
    try:
        got = run(engine)
        stats = engine.stats()
        engine.check_integrity()
    finally:
        engine.close()
    assert got == want
    assert stats["spec_decode_num_draft_tokens"] > 0


@pytest.mark.parametrize("moe,mtp", [(True, False), (False, True)])
def test_graph_messages_reach_every_rank(ckpts, moe, mtp):
    """CUDA graphs at TP > 1: every rank builds the same decode (and verify) graphs and replays the same one each
    step. gloo cannot capture, so the graphs run their static buffers eagerly (capture=False): the ranks'
    collectives would hang or the tokens differ if any rank missed or mismatched a message. Greedy tokens equal
    TP1's, and each worker served exactly the replays rank 0 did, per graph."""
    from catengine.distributed.graphs import RemoteGraphs
    from catengine.spec.graphs import build_verify_graphs

    path = tiny_checkpoint(ckpts, moe=moe, mtp=mtp)
    want = tp1_tokens(path)
    spec = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}} if mtp else {}
    engine = Engine(str(path), tensor_parallel_size=2, **spec, **SMALL)
    try:
        runner = engine.runner
        runner.enable_decode_graphs(capture=False)
        if mtp:
            runner.verify_graphs = build_verify_graphs(runner, capture=False)
        graphs = [g for g in (runner.graphs, runner.verify_graphs) if g is not None]
        assert all(isinstance(g, RemoteGraphs) for g in graphs) and len(graphs) == 1 + mtp
        got = run(engine)
        engine.check_integrity()
        worker = engine.executor.reports()[1]["graph_runs"]
    finally:
        engine.close()
    assert got == want
    assert all(g.num_runs > 0 for g in graphs)
    assert worker == {g.gid: g.num_runs for g in graphs}


def test_one_shot_flag_falls_back_on_gloo_and_no_rank_uses_multicast(ckpts, caplog):
    """enable_one_shot_all_reduce on the CPU: every rank logs the fall-back once and sums over gloo (TP1's
    tokens); every rank's process has NVLink multicast off (NCCL, torch symmetric memory, NVSHMEM)."""
    import logging

    from catengine.distributed.launch import NO_MULTICAST_ENV

    path = tiny_checkpoint(ckpts, moe=False)
    want = tp1_tokens(path)
    with caplog.at_level(logging.WARNING, logger="catengine.distributed"):
        engine = Engine(str(path), tensor_parallel_size=2, enable_one_shot_all_reduce=True, **SMALL)
    try:
        got = run(engine)
        reports = engine.executor.reports()
    finally:
        engine.close()
    assert got == want
    assert [r.getMessage() for r in caplog.records if "one-shot" in r.getMessage()] == [
        "one-shot all-reduce is off, falling back to gloo (it needs CUDA (torch symmetric memory); this group "
        "runs on gloo)"]
    assert [r["one_shot"] for r in reports] == [False, False]
    assert all(r["env"] == NO_MULTICAST_ENV for r in reports)
