"""Memory planning as a pure function: budget split, snapshot pool, auto-trim, error messages."""
from __future__ import annotations

import math

import pytest

from catengine.config import EngineConfig
from catengine.errors import ConfigError
from catengine.memory import plan_memory

KV, STATE = 1000, 5000   # bytes per KV block / per state slot


def cfg(**kw) -> EngineConfig:
    kw.setdefault("max_num_seqs", 4)
    kw.setdefault("max_num_batched_tokens", 64)
    kw.setdefault("block_size", 16)
    return EngineConfig(**kw).validate()


def plan(c: EngineConfig, budget=None, hybrid=True, max_pos=4096):
    return plan_memory(c, kv_bytes_per_block=KV, state_bytes_per_slot=STATE, hybrid=hybrid,
                       max_position_embeddings=max_pos, budget_bytes=budget)


def test_budget_split_and_auto_trim():
    p = plan(cfg(max_model_len=1024), budget=10_000_000)
    assert p.num_live_slots == 4 and p.num_snapshot_slots == 64         # the cap max(8 x 4, 64) (10% allows 200)
    assert p.num_blocks == math.ceil(1.05 * 1024 * 4 / 16)               # trimmed
    untrimmed = plan(cfg(max_model_len=1024, kv_cache_auto_trim_ratio=0), budget=10_000_000)
    assert untrimmed.num_blocks == (10_000_000 - 69 * STATE) // KV   # 4 live + 64 snapshots + 1 padding
    assert untrimmed.num_state_slots == 69 and untrimmed.pad_state_slot == 68
    assert untrimmed.used_bytes <= 10_000_000
    exact = plan(cfg(max_model_len=1024, kv_cache_memory_bytes=2_000_000))
    assert exact.num_blocks == (2_000_000 - 45 * STATE) // KV  # 4 live + 40 snapshots (10%) + 1 padding; not trimmed
    assert plan(cfg(max_model_len=1024, num_kv_blocks=77)).num_blocks == 77


def test_snapshot_pool_follows_caching_and_model_kind():
    assert plan(cfg(max_model_len=256, enable_prefix_caching=False), budget=10**7).num_snapshot_slots == 0
    assert plan(cfg(max_model_len=256), budget=10**7, hybrid=False).num_snapshot_slots == 0
    assert plan(cfg(max_model_len=256, num_state_snapshots=3), budget=10**7).num_snapshot_slots == 3


def test_snapshots_shrink_before_the_context_does():
    # 200 kB: 10% gives 4 snapshots, leaving 160 blocks; 170 blocks are needed, so the pool drops to 1
    p = plan(cfg(max_model_len=170 * 16), budget=200_000)
    assert p.num_snapshot_slots == 1 and p.num_blocks >= 170
    assert plan(cfg(max_model_len=150 * 16), budget=200_000).num_snapshot_slots == 4


def test_unset_max_model_len_shrinks_to_fit_and_set_one_fails_with_numbers():
    p = plan(cfg(), budget=100_000, max_pos=262144)
    assert p.max_model_len == p.num_blocks * 16 and p.max_model_len < 262144
    with pytest.raises(ConfigError) as err:
        plan(cfg(max_model_len=262144, device="cuda"), budget=100_000)
    msg = str(err.value)
    assert "262144 needs" in msg and "gpu_memory_utilization" in msg and "fp8_e5m2" in msg
    with pytest.raises(ConfigError, match="lower max_num_seqs"):
        plan(cfg(max_model_len=64), budget=10_000)                       # the live slots alone do not fit
    with pytest.raises(ConfigError, match="raise num_kv_blocks"):
        plan(cfg(max_model_len=1024, num_kv_blocks=10))


def test_model_without_full_attention_layers():
    """A model of GDN layers only (``random_checkpoint --layers 1``) has no KV cache: blocks cost 0 bytes. The
    plan used to divide by that (ZeroDivisionError); now every sequence gets max_model_len in free blocks, and
    state slots that do not fit still fail with the fix."""
    c = cfg(max_model_len=1024)
    p = plan_memory(c, kv_bytes_per_block=0, state_bytes_per_slot=STATE, hybrid=True, max_position_embeddings=4096,
                    budget_bytes=10_000_000)
    assert p.num_blocks == 1024 * 4 // 16 and p.max_model_len == 1024 and p.used_bytes <= 10_000_000
    unset = plan_memory(cfg(), kv_bytes_per_block=0, state_bytes_per_slot=STATE, hybrid=True,
                        max_position_embeddings=4096, budget_bytes=10_000_000)
    assert unset.max_model_len == 4096 and unset.num_blocks == 4096 * 4 // 16
    with pytest.raises(ConfigError, match="lower max_num_seqs"):
        plan_memory(c, kv_bytes_per_block=0, state_bytes_per_slot=STATE, hybrid=True, max_position_embeddings=4096,
                    budget_bytes=4 * STATE)
