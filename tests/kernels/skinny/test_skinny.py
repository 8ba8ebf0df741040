"""The skinny dense linear (catengine.kernels.skinny) against an fp64 product, and its dispatch.

CPU: the Triton interpreter (which runs CPU tensors as the sm_90 row on a 4-SM chip) at every row block, splits 1 / 3
/ picked, bias or none, partial tiles in M, N and K: the counters left zero and the same bits on a second call; the
contract errors; the dispatch to cuBLAS (the twin) outside the table; the split and counter arithmetic at the model
shapes on 132 SMs; the weight-owned counters of models/linear.py.
GPU (``-m gpu``, sm_90): the model shapes at every row count of the table through the op, fp16 and bf16, eager and replayed from a CUDA
graph (same bits as eager), and a first call inside a capture (cuBLAS, no counters allocated).

Tolerances are on ||y - ref|| / ||ref||: fp32 accumulation, so the output rounding dominates (2^-11 fp16, 2^-8 bf16;
the interpreter truncates bf16, one unit more).
"""
import pytest
import torch
import torch.nn.functional as F

from catengine.errors import KernelContractError
from catengine.kernels import ops
from catengine.kernels.common.splitk import held_counters
from catengine.kernels.skinny import skinny

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
TABLE = skinny.TABLES["sm90"]
# (name, K, N): the fp16 projections of AWQ checkpoints that take the kernel
MODEL_SHAPES = [("27B in_proj_ba", 5120, 96), ("35B router+gate", 2048, 257), ("35B in_proj_ba", 2048, 64),
                ("27B in_proj_ba TP2", 5120, 48)]


def rel_err(y, ref):
    assert torch.isfinite(y).all()
    return ((y.double() - ref).norm() / ref.norm()).item()


def operands(m, n, k, dtype, bias=False, device="cpu", seed=0):
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device).to(dtype)
    w = (torch.randn(n, k, generator=g, device=device) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g, device=device).to(dtype) if bias else None
    return x, w, b


def reference(x, w, b):
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


# ---------------------------------------------------------------- interpreter (CI)
@pytest.mark.parametrize("m", [5, 16, 20, 37])          # BM 16 (partial, full), 32, 64
@pytest.mark.parametrize("split", [1, 3, None])          # None: skinny_split's pick
@pytest.mark.parametrize("bias", [False, True])
def test_matches_fp64_leaves_counters_zero_same_bits(m, split, bias):
    # N = 70: two full 32-column tiles and a partial one; K = 520: five k steps of 128, the last partial
    x, w, b = operands(m, 70, 520, torch.float16, bias, seed=m)
    counters = torch.zeros(8, dtype=torch.int32)
    y = skinny.skinny_linear_with(x, w, b, counters, TABLE, split)
    assert y.shape == (m, 70) and y.dtype == torch.float16
    assert rel_err(y, reference(x, w, b)) < TOL[torch.float16]
    assert int(counters.abs().sum()) == 0
    assert torch.equal(skinny.skinny_linear_with(x, w, b, counters, TABLE, split), y)
    assert int(counters.abs().sum()) == 0


def test_bf16_and_leading_dims():
    x, w, b = operands(12, 40, 384, torch.bfloat16, True)
    counters = torch.zeros(4, dtype=torch.int32)
    y = skinny.skinny_linear_with(x.view(3, 4, 384), w, b, counters, TABLE, 3)
    assert y.shape == (3, 4, 40)
    assert rel_err(y.view(12, 40), reference(x, w, b)) < TOL[torch.bfloat16]


def test_strided_rows():
    """x a column slice (row stride past K), w rows of a wider matrix: the kernel takes both strides."""
    x, w, _ = operands(6, 48, 640, torch.float16)
    xs = torch.cat([x, x[:, :8]], 1)[:, :640]
    ws = torch.cat([w, w[:, :16]], 1)[:, :640]
    y = skinny.skinny_linear_with(xs, ws, None, torch.zeros(2, dtype=torch.int32), TABLE, 5)
    assert rel_err(y, reference(x, w, None)) < TOL[torch.float16]


def test_contract_errors():
    x, w, b = operands(4, 40, 384, torch.float16, True)
    c = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(KernelContractError, match="one dtype"):
        skinny.skinny_linear(x, w.bfloat16(), b, c)
    with pytest.raises(KernelContractError, match="one dtype"):
        skinny.skinny_linear(x[:, :256], w, b, c)                   # K differs
    with pytest.raises(KernelContractError, match="one dtype"):
        skinny.skinny_linear(x, w, b[:39], c)                       # bias not [N]
    with pytest.raises(KernelContractError, match="int32"):
        skinny.skinny_linear(x, w, b, c.long())
    with pytest.raises(KernelContractError, match="fp16/bf16"):
        skinny.skinny_linear_with(x.float(), w.float(), None, c, TABLE)
    with pytest.raises(KernelContractError, match="leaves a split empty"):
        skinny.skinny_linear_with(x, w, b, c, TABLE, 4)             # 4 splits of 3 k steps
    with pytest.raises(KernelContractError, match="zeroed int32 counters"):
        skinny.skinny_linear_with(x, w, b, c[:1], TABLE, 3)         # 2 column tiles need 2


def test_dispatch_runs_the_kernel_inside_the_table_and_cublas_outside(monkeypatch):
    launched = []
    with_ = skinny.skinny_linear_with
    monkeypatch.setattr(skinny, "skinny_linear_with", lambda *a, **k: launched.append(a[0].shape) or with_(*a, **k))

    def runs(x, w, counters=None, bias=None):
        """Whether the call launched the kernel; either way it equals F.linear."""
        launched.clear()
        y = skinny.skinny_linear(x, w, bias, counters)
        tol = TOL.get(x.dtype, 1e-6)
        assert rel_err(y, reference(x, w, bias)) < tol
        return bool(launched)

    x, w, _ = operands(TABLE.max_m, 96, 512, torch.float16)
    c = torch.zeros(skinny.skinny_counters(w), dtype=torch.int32)
    assert c.numel() == 3                                           # 3 column tiles a row tile
    assert runs(x, w, c) and runs(x[:1], w, c) and runs(x.view(4, 8, 512), w, c)
    assert not runs(torch.cat([x, x[:1]]), w, c)                    # rows > max_m
    assert not runs(x.float(), w.float(), c)                        # fp32
    assert not runs(x[:, :256], w[:, :256], c)                      # K 256 < k_min
    xw, ww, _ = operands(4, 513, 512, torch.float16)
    assert not runs(xw, ww, c)                                      # N 513 > max_n
    assert not runs(x, w, None)                                     # splits K but no counters (capture-time first call)
    assert not runs(x, w.t().contiguous().t())                      # w's rows not unit stride
    monkeypatch.setitem(skinny.TABLES, "sm90", None)                # a row without a table (sm_70, sm_80)
    assert not runs(x, w, c) and skinny.skinny_counters(w) == 0
    assert skinny.TABLES["sm70"] is None and skinny.TABLES["sm80"] is None


def test_split_and_counters_at_the_model_shapes_on_132_sms():
    """Toward one program an SM, at most MAX_SPLIT, whole k steps, none empty; one counter a tile when split."""
    splits = {name: [skinny.skinny_split(m, n, k, TABLE, 132) for m in (1, 16, 32, 64)] for name, k, n in MODEL_SHAPES}
    # 27B in_proj_ba: 3 tiles want 44 splits, 16 at most; 40 k steps in 14 splits of 3 (13 of 3, one of 1)
    assert splits == {"27B in_proj_ba": [14] * 4, "35B router+gate": [8] * 4, "35B in_proj_ba": [16] * 4,
                      "27B in_proj_ba TP2": [14] * 4}
    for _, k, n in MODEL_SHAPES:
        for m in range(1, TABLE.max_m + 1):
            s, n_kb = skinny.skinny_split(m, n, k, TABLE, 132), -(-k // TABLE.bk)
            per = -(-n_kb // s)
            assert 1 <= s <= skinny.MAX_SPLIT and per * (s - 1) < n_kb
        assert skinny.counters_for(n, k, TABLE, 132) == -(-n // TABLE.bn)
    assert skinny.skinny_split(64, 512, 384, TABLE, 132) == 3       # 16 tiles: 3 k steps bound it
    assert skinny.counters_needed(64, 512, 384, TABLE, 132) == 16
    assert skinny.counters_needed(1, 512, 384, TABLE, 16) == 0      # 16 tiles fill 16 SMs unsplit


def test_aot_configs_are_sm90_only():
    assert skinny.aot_configs(70) == [] and skinny.aot_configs(80) == []
    names = [c.name for c in skinny.aot_configs(90)]
    assert len(names) == len(set(names)) == 2 * 3 * 3


def test_ops_run_the_twin_on_cpu():
    x, w, b = operands(4, 40, 384, torch.float16, True)
    assert torch.equal(ops.skinny_linear(x, w, b, None), F.linear(x, w, b))
    assert ops.skinny_counters(w) == 0


def test_held_counters_are_made_once_and_kept():
    class Owner:
        buf = None
    o = Owner()
    first = held_counters(o, "buf", "cpu", 3, 5)
    assert first is o.buf and first.numel() == 5 and first.dtype == torch.int32 and not first.any()
    assert held_counters(o, "buf", "cpu", 5, 9) is first            # never replaced
    assert held_counters(o, "buf", "cpu", 6, 9) is None             # a call that needs more


def test_weight_owned_counters(monkeypatch):
    """models/linear.py: sized by ops.skinny_counters once per weight shape, made on first use, dropped by reset;
    none where the op never splits K (on the CPU, the twin says 0)."""
    from catengine.models.linear import Linear, SkinnyCounters
    lin = Linear(384, 40)
    lin.weight = torch.randn(40, 384)
    assert lin.counters.take(lin.weight) is None and lin.counters.buf is None
    x = torch.randn(3, 384)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=0, atol=0)
    asked = []
    monkeypatch.setattr(ops, "skinny_counters", lambda w: asked.append(w.shape) or 2)
    c = SkinnyCounters()
    buf = c.take(lin.weight)
    assert buf is not None and buf.numel() == 2 and c.take(lin.weight) is buf and len(asked) == 1
    c.reset()
    assert c.buf is None and c.take(lin.weight) is not buf


# ---------------------------------------------------------------- GPU, model shapes
def _sm90():
    if skinny.TABLES[skinny.device_key(torch.device("cuda"))[0]] is None:
        pytest.skip("the skinny kernel has a table on sm_90 only")


@pytest.mark.gpu
@pytest.mark.parametrize("name,k,n", MODEL_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_model_shapes_eager_and_from_a_graph(name, k, n, dtype):
    """Every row count of the table through the op (the kernel, split as picked), eager then replayed from one CUDA graph
    with new inputs: each equals the fp64 product, a replay gives the eager call's bits, the counters stay zero."""
    _sm90()
    from catengine.models.linear import SkinnyCounters
    ms = list(range(1, TABLE.max_m + 1))
    _, w, _ = operands(1, n, k, dtype, device="cuda", seed=k + n)
    counters = SkinnyCounters()
    xs = [operands(m, n, k, dtype, device="cuda", seed=m)[0] for m in ms]
    for x in xs:
        assert skinny.skinny_applies(x, w)
        y = ops.skinny_linear(x, w, None, counters.take(w))
        assert rel_err(y, reference(x, w, None)) < TOL[dtype], (name, x.shape[0])
    assert counters.buf is not None and not counters.buf.any()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [ops.skinny_linear(x, w, None, counters.take(w)) for x in xs]
    for rep in range(3):
        for x in xs:
            x.copy_(torch.randn(x.shape, device="cuda").to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert not counters.buf.any()
        for x, y in zip(xs, ys):
            eager = ops.skinny_linear(x, w, None, counters.take(w))
            assert torch.equal(y, eager), (name, x.shape[0], rep)
            assert rel_err(y, reference(x, w, None)) < TOL[dtype], (name, x.shape[0], rep)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 7, 33])
def test_gpu_bias_and_explicit_splits(m):
    _sm90()
    x, w, b = operands(m, 257, 2048, torch.float16, True, device="cuda", seed=m)
    counters = torch.zeros(skinny.counters_for(257, 2048, TABLE, 132) * 2, dtype=torch.int32, device="cuda")
    for split in (1, 3, 8, 16):             # of 16 k steps: 6 + 6 + 4, 2 each, 1 each
        y = skinny.skinny_linear_with(x, w, b, counters, TABLE, split)
        assert rel_err(y, reference(x, w, b)) < TOL[torch.float16], split
        assert not counters.any()


@pytest.mark.gpu
def test_gpu_first_call_inside_a_capture_runs_cublas():
    """The weight's counters cannot be made inside a capture: that graph keeps cuBLAS, the next eager call makes
    them and a graph captured after it runs the kernel."""
    _sm90()
    from catengine.models.linear import Linear
    lin = Linear(5120, 96)
    _, lin.weight, _ = operands(1, 96, 5120, torch.float16, device="cuda")
    x = torch.randn(32, 5120, device="cuda").half()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        F.linear(x, lin.weight)       # cuBLAS's own warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = lin(x)
    assert lin.counters.buf is None
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(y, reference(x, lin.weight, None)) < TOL[torch.float16]
    eager = lin(x)
    assert lin.counters.buf is not None and not lin.counters.buf.any()
    assert rel_err(eager, reference(x, lin.weight, None)) < TOL[torch.float16]
