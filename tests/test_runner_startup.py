"""Engine start-up is the runner's: ModelRunner.__init__ profiles, plans the memory, allocates the caches,
warms up and captures the decode graphs, in that order (nano-vllm's); the engine only reads its plan.
The last two tests read engine.py's source: "no torch.cuda in engine.py, no runner attribute set from
outside, no callback into the engine" is a contract about the code itself (issue 17)."""
from __future__ import annotations

import ast
import inspect

import torch

import catengine.engine as engine_module
import catengine.runner as runner_module
from catengine import Engine, EngineConfig
from catengine.models import load_model
from catengine.runner import ModelRunner


def _record(monkeypatch, events: list[str]):
    """Wrap the plan and the cache allocation so the test sees when each runs."""
    plan_memory, allocate = runner_module.plan_memory, ModelRunner._allocate

    def plan(*args, **kwargs):
        events.append("plan")
        return plan_memory(*args, **kwargs)

    def alloc(self, num_blocks, num_slots, *, block_size):
        events.append(f"allocate {num_blocks}")
        return allocate(self, num_blocks, num_slots, block_size=block_size)
    monkeypatch.setattr(runner_module, "plan_memory", plan)
    monkeypatch.setattr(ModelRunner, "_allocate", alloc)


def test_engine_start_up_is_the_runners(tiny_model_dir, monkeypatch):
    events: list[str] = []
    _record(monkeypatch, events)
    engine = Engine(str(tiny_model_dir), max_model_len=64, block_size=4, max_num_seqs=4)
    runner, plan = engine.runner, engine.runner.memory_plan
    # CPU: the plan takes the CPU budget (no profile), then the real caches; no warm-up, no graphs
    assert events == ["plan", f"allocate {plan.num_blocks}"]
    assert engine.memory_plan is plan and runner.graphs is None
    caches = runner.caches
    assert (caches.num_blocks, caches.block_size, caches.num_state_slots) == (
        plan.num_blocks, plan.block_size, plan.num_state_slots)
    # one block size, from the config through the plan to the caches and the scheduler
    sched = engine.scheduler
    assert plan.block_size == 4 == sched.block_size == sched.blocks.block_size == sched.config.block_size
    assert sched.config.num_blocks == plan.num_blocks and sched.config.max_model_len == plan.max_model_len
    assert engine.config.max_model_len == plan.max_model_len
    engine.close()
    assert runner.caches is None and runner.graphs is None and runner.model is None


def test_cuda_start_up_order(tiny_model_dir, monkeypatch):
    """The CUDA branch of ModelRunner.__init__, with the steps that need a GPU recorded instead of run:
    profile -> plan -> caches -> warm-up -> graphs (no graphs with enforce_eager)."""
    model = load_model(tiny_model_dir, torch.float32, "cpu", progress=False)
    events: list[str] = []
    plan_memory = runner_module.plan_memory

    def plan(*args, **kwargs):
        events.append("plan")
        return plan_memory(*args, **kwargs)

    def alloc(self, num_blocks, num_slots, *, block_size):   # on the CPU, where the model is
        events.append(f"allocate {num_blocks}")
        return self.model.allocate_caches(num_blocks, block_size, num_slots, self.config.kv_cache_dtype, "cpu")

    def profile(self):
        events.append("profile")
        return 64 << 20

    def warm_up(self):
        events.append("warm_up")
        return 0.0

    monkeypatch.setattr(runner_module, "plan_memory", plan)
    monkeypatch.setattr(ModelRunner, "_allocate", alloc)
    monkeypatch.setattr(ModelRunner, "_profile_cache_budget", profile)
    monkeypatch.setattr(ModelRunner, "warm_up", warm_up)
    monkeypatch.setattr(ModelRunner, "enable_decode_graphs", lambda self, capture=True: events.append("graphs"))
    for eager, graphs in ((False, ["graphs"]), (True, [])):
        events.clear()
        cfg = EngineConfig(max_model_len=64, block_size=4, max_num_seqs=4, dtype="float32", enforce_eager=eager)
        cfg = cfg.resolve(device=torch.device("cuda"), max_position_embeddings=model.config.max_position_embeddings)
        runner = ModelRunner(model, cfg)
        plan = runner.memory_plan
        assert events == ["profile", "plan", f"allocate {plan.num_blocks}", "warm_up"] + graphs
        assert plan.budget_bytes == 64 << 20 and runner.caches.num_blocks == plan.num_blocks


def _engine_tree() -> ast.Module:
    return ast.parse(inspect.getsource(engine_module))


def test_engine_py_has_no_cuda_calls_and_no_callbacks():
    source = inspect.getsource(engine_module)
    assert "torch.cuda" not in source and "functools" not in source
    calls = [n for n in ast.walk(_engine_tree()) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "ModelRunner"]
    assert len(calls) == 1
    for arg in [*calls[0].args, *(k.value for k in calls[0].keywords)]:
        # the model, the config and plain values; never a function of the engine
        assert not isinstance(arg, ast.Lambda)
        assert not (isinstance(arg, ast.Attribute) and arg.attr.startswith("_")), ast.unparse(arg)


def test_engine_never_sets_runner_attributes():
    def is_runner(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "runner"

    for node in ast.walk(_engine_tree()):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for part in ast.walk(target):
                assert not (isinstance(part, ast.Attribute) and is_runner(part.value)), ast.unparse(target)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            assert not is_runner(node.args[0]), ast.unparse(node)
