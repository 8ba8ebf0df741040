"""The explicit op registry (catengine.kernels.ops): one function per op with its twin's signature and
docstring, the Triton implementation with the same signature, the twin off CUDA, no duplicate names."""
import inspect
import subprocess
import sys

import pytest
import torch

from catengine.kernels import ops

OPS = ("rms_norm", "gated_rms_norm", "silu_mul", "qk_norm_rope", "store_kv", "paged_attention",
       "causal_conv1d", "causal_conv1d_update", "gdn_gating", "chunk_gated_delta_rule",
       "recurrent_gated_delta_rule", "gdn_gating_recurrent", "w4a16_linear", "w8a16_linear", "skinny_linear",
       "skinny_counters", "moe_route", "fused_moe", "shared_expert_add", "sample_tokens", "apply_token_bitmask")


def test_op_names_are_the_model_ops():
    assert ops.OP_NAMES == OPS


@pytest.mark.parametrize("name", OPS)
def test_op_has_its_twins_signature_and_docstring(name):
    fn, twin = getattr(ops, name), ops.REGISTRY.twin(name)
    assert twin.__module__.endswith(".naive") and twin.__name__ == name
    assert inspect.signature(fn) == inspect.signature(twin)
    assert fn.__doc__ == twin.__doc__ and fn.__doc__


def test_triton_implementations_have_the_twins_signatures():
    table = ops.triton_ops()
    assert tuple(table) == OPS
    for name, fn in table.items():
        assert inspect.signature(fn) == inspect.signature(ops.REGISTRY.twin(name)), name
    from catengine.kernels.w4a16 import dequant
    assert table["w4a16_linear"] is dequant.w4a16_linear  # the one CUDA form: by M, dequant+cuBLAS or fused


def test_registering_an_op_twice_is_an_error():
    registry = ops.OpRegistry()
    twin = ops.REGISTRY.twin("silu_mul")

    @registry.op(twin)
    def silu_mul(x):
        return x

    with pytest.raises(ops.DuplicateOpError, match="'silu_mul' is registered twice"):
        @registry.op(twin)
        def silu_mul(x):  # noqa: F811
            return x
    assert registry.names() == ("silu_mul",)


def test_an_op_must_name_its_own_twin():
    with pytest.raises(ops.DuplicateOpError, match="names the twin"):
        @ops.OpRegistry().op(ops.REGISTRY.twin("rms_norm"))
        def silu_mul(x):
            return x


def test_cpu_tensors_run_the_twin(monkeypatch):
    x = torch.randn(3, 8)
    torch.testing.assert_close(ops.silu_mul(x), ops.REGISTRY.twin("silu_mul")(x), rtol=0, atol=0)
    assert not ops.use_triton(x.device)
    assert ops.use_triton(torch.device("cuda"))
    monkeypatch.setenv("CATENGINE_KERNELS", "reference")
    assert not ops.use_triton(torch.device("cuda"))


def test_importing_ops_does_not_import_triton():
    """The Triton modules load on the first CUDA call: a CPU process never pays for them."""
    code = "import sys, catengine.kernels.ops; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
