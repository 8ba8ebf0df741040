"""Checks the engine tests share (plain functions; the shared fixtures are in tests/conftest.py)."""
from __future__ import annotations


def assert_clean(engine) -> None:
    """Every KV block and state slot is free and the bookkeeping is consistent."""
    engine.check_integrity()
    sched = engine.scheduler
    assert not sched.running and not sched.waiting, "sequences left in the scheduler"
    assert sched.blocks.num_used == 0, f"{sched.blocks.num_used} KV blocks still referenced"
    assert sched.states.num_free_live == sched.states.num_live, "live state slots still held"
    assert not engine.has_unfinished()
