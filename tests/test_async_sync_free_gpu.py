"""With async scheduling a decode step's launch must not wait for the GPU: a stream synchronisation inside
``ModelRunner.launch`` (a ``torch.tensor(..., device="cuda")``, which copies and then synchronises; a
boolean-mask index, whose nonzero does) makes the host wait for the step in flight, and the overlap hides
nothing. CUDA's sync debug mode reports every such call; the decode launches of the sampling modes that take
the async path (greedy, sampled, min_tokens, logit_bias) must report none. Logprobs are left out: their
values reach the host in the launch (catengine/logprobs.py), a known synchronisation."""
import traceback
import warnings

import pytest
import torch

from catengine import Engine, SamplingParams

pytestmark = pytest.mark.gpu

CASES = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.9, top_k=20, min_p=0.01, seed=1),
    "min_tokens": dict(temperature=0.0, min_tokens=30, ignore_eos=False),   # EOS masked: a real mask row
    "logit_bias": dict(temperature=0.0, logit_bias={5: 2.0, 7: -1.0}),
}


@pytest.fixture(scope="module")
def engine():
    engine = Engine(model=None, device="cuda", max_model_len=1024, max_num_seqs=8, async_scheduling=True,
                    kv_cache_memory_bytes=256 << 20)
    yield engine
    engine.close()


@pytest.mark.parametrize("case", list(CASES))
def test_decode_launch_does_not_synchronise(engine, case):
    runner = engine.runner
    assert runner.graphs is not None and engine.step_loop.overlap
    params = SamplingParams(**{"max_tokens": 40, "ignore_eos": True, **CASES[case]})
    for i in range(5):
        engine.add_request(f"{case}-{i}", [1 + i + j for j in range(20)], params)
    for _ in range(4):   # prefill and the first decode steps, unwatched (eager prefill may synchronise)
        engine.step()
    launch, caught = runner.launch, []

    def seen(message, *_args, **_kwargs):
        # the mode's own notice ("... is a prototype feature ...") is not a synchronisation; each real one is
        # kept with the Python stack that made it, so a failure names the call
        if "prototype feature" not in str(message):
            caught.append(f"{message}\n{''.join(traceback.format_stack(limit=14)[:-2])}")

    def watched(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = seen
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return launch(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

    runs = runner.graphs.num_runs
    runner.launch = watched
    try:
        for _ in range(20):
            engine.step()
    finally:
        del runner.launch
    assert runner.graphs.num_runs - runs >= 15, "the watched steps were not graphed decode steps"
    assert engine.step_loop.num_overlapped > 0
    assert not caught, "\n".join(caught[:2])
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()
