"""AutoAWQ GEMM and compressed-tensors pack-quantized <-> canonical QuantizedWeight: bit-exact against each
format's own dequantization, written here element by element from the format descriptions (the design notes,
../shared/design/QWEN35.md)."""
import numpy as np
import pytest
import torch

from catengine.errors import ModelLoadError
from catengine.kernels.w4a16.packing import QuantizedWeight, dequantize
from catengine.models.quant_formats import (awq_to_canonical, canonical_to_awq, canonical_to_ct, ct_to_canonical,
                                            matches_skip, module_format)

# AutoAWQ GEMM: nibble i of a word holds column 8c + ORDER[i] of its 8-column pack
ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
SHAPES = [(64, 48, 64), (256, 32, 128), (96, 16, 32), (64, 8, 8)]  # (K, N, group) incl. group == K
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def random_words(*shape, seed: int) -> torch.Tensor:
    """int32 words over the whole range: every nibble position sees every value 0..15."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31, shape, dtype=torch.int64, generator=g).to(torch.int32)


def random_scales(*shape, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mag = 10.0 ** torch.empty(shape).uniform_(-4, 1, generator=g)
    return (torch.randn(shape, generator=g).sign() * mag).to(dtype)


def nibble(words: np.ndarray, i) -> np.ndarray:
    return (words.astype(np.int64) & 0xFFFFFFFF) >> (4 * np.asarray(i)) & 0xF


def awq_reference(qweight, qzeros, scales, group) -> torch.Tensor:
    """AutoAWQ's w = (q - z) * s, [K, N] in the scales' dtype; element (k, n) read from its word and nibble."""
    qw, qz = qweight.numpy(), qzeros.numpy()
    n = np.arange(scales.shape[1])
    pos = np.array([ORDER.index(j) for j in range(8)])[n % 8]
    q = nibble(qw[:, n // 8], pos)
    z = nibble(qz[:, n // 8], pos)
    assert set(np.unique(q)) == set(range(16))
    diff = torch.from_numpy(q - np.repeat(z, group, axis=0))
    return diff.to(scales.dtype) * scales.repeat_interleave(group, 0)


def ct_reference(packed, scale, zero_point, group) -> torch.Tensor:
    """compressed-tensors' w = (x_q - zp) * s, [N, K]; stored nibbles are value + 8."""
    p = packed.numpy()
    k = np.arange(p.shape[1] * 8)
    xq = nibble(p[:, k // 8], k % 8) - 8
    assert set(np.unique(xq)) == set(range(-8, 8))
    if zero_point is None:
        zp = np.zeros((p.shape[0], scale.shape[1]), dtype=np.int64)
    else:
        rows = np.arange(p.shape[0])
        zp = nibble(zero_point.numpy()[rows // 8], (rows % 8)[:, None]) - 8
    diff = torch.from_numpy(xq - np.repeat(zp, group, axis=1))
    return diff.to(scale.dtype) * scale.repeat_interleave(group, 1)


@pytest.mark.parametrize("k,n,group", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_awq_bit_exact(k, n, group, dtype):
    qweight, qzeros = random_words(k, n // 8, seed=k + n), random_words(k // group, n // 8, seed=group)
    scales = random_scales(k // group, n, dtype=dtype, seed=n)
    w = awq_to_canonical(qweight, qzeros, scales)
    assert w.qweight.shape == (k // 8, n) and w.group_size == group and w.scales.dtype == dtype
    want = awq_reference(qweight, qzeros, scales, group)
    assert torch.equal(dequantize(w).view(torch.int16 if dtype != torch.float32 else torch.int32),
                       want.view(torch.int16 if dtype != torch.float32 else torch.int32))
    back = canonical_to_awq(w, scale_dtype=dtype)
    assert torch.equal(back["qweight"], qweight) and torch.equal(back["qzeros"], qzeros)
    assert torch.equal(back["scales"], scales)


@pytest.mark.parametrize("k,n,group", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_compressed_tensors_bit_exact(k, n, group, dtype, symmetric):
    packed = random_words(n, k // 8, seed=k * n)
    scale = random_scales(n, k // group, dtype=dtype, seed=group)
    zp = None if symmetric else random_words((n + 7) // 8, k // group, seed=n + 1)
    w = ct_to_canonical(packed, scale, torch.tensor([n, k]), zp)
    assert w.qweight.shape == (k // 8, n) and w.group_size == group
    if symmetric:
        assert bool((w.zeros == 8).all())
    want = ct_reference(packed, scale, zp, group)
    assert torch.equal(dequantize(w), want.t())
    back = canonical_to_ct(w, symmetric)
    assert torch.equal(back["weight_packed"], packed) and torch.equal(back["weight_scale"], scale)
    assert back["weight_shape"].tolist() == [n, k]
    if not symmetric:
        assert torch.equal(back["weight_zero_point"], zp)


def test_ct_zero_point_rows_not_multiple_of_8():
    n, k, group = 12, 16, 8
    codes = torch.arange(n * 2).reshape(2, n) % 16  # [K/G, N] zero codes
    w = QuantizedWeight(random_words(k // 8, n, seed=0), torch.ones(2, n), codes.float(), group)
    ct = canonical_to_ct(w, symmetric=False)
    assert ct["weight_zero_point"].shape == (2, 2)
    back = ct_to_canonical(ct["weight_packed"], ct["weight_scale"], ct["weight_shape"], ct["weight_zero_point"])
    assert torch.equal(back.zeros, w.zeros) and torch.equal(back.qweight, w.qweight)
    with pytest.raises(ValueError, match="every zero point to be 8"):
        canonical_to_ct(w, symmetric=True)


def test_canonical_round_trip_through_both_formats():
    g = torch.Generator().manual_seed(1)
    k, n, group = 128, 40, 32
    w = QuantizedWeight(random_words(k // 8, n, seed=3), torch.rand(k // group, n, generator=g).half(),
                        torch.randint(0, 16, (k // group, n), generator=g).half(), group)
    a = canonical_to_awq(w)
    via_awq = awq_to_canonical(a["qweight"], a["qzeros"], a["scales"])
    c = canonical_to_ct(w, symmetric=False)
    via_ct = ct_to_canonical(c["weight_packed"], c["weight_scale"], c["weight_shape"], c["weight_zero_point"])
    for other in (via_awq, via_ct):
        assert torch.equal(other.qweight, w.qweight) and torch.equal(other.zeros, w.zeros)
        assert torch.equal(other.scales, w.scales)
    assert awq_to_canonical(a["qweight"], a["qzeros"], a["scales"], dtype=torch.float32).scales.dtype == torch.float32


def test_layout_errors_name_the_module():
    # GPTQ packs along K: qweight [K/8, N] with scales [K/G, N] is not AutoAWQ GEMM
    with pytest.raises(ModelLoadError, match=r"layers\.3\.mlp\.down_proj: shapes .* not the AutoAWQ GEMM layout"):
        awq_to_canonical(random_words(8, 64, seed=0), random_words(2, 8, seed=1), torch.ones(2, 64).half(),
                         module="model.layers.3.mlp.down_proj")
    with pytest.raises(ModelLoadError, match=r"o_proj: 3 scale groups do not divide the input dimension 64"):
        awq_to_canonical(random_words(64, 2, seed=0), random_words(3, 2, seed=1), torch.ones(3, 16).half(),
                         module="o_proj")
    with pytest.raises(ModelLoadError, match=r"x\.weight_packed .* weight_shape \[16, 60\]"):
        ct_to_canonical(random_words(16, 8, seed=0), torch.ones(16, 2), torch.tensor([16, 60]), module="x")
    k, group = 32, 8
    scale = torch.ones(4, k // group)
    ok = torch.arange(k) // group
    w = ct_to_canonical(random_words(4, k // 8, seed=0), scale, torch.tensor([4, k]), weight_g_idx=ok)
    assert w.group_size == group
    with pytest.raises(ModelLoadError, match=r"m\.weight_g_idx reorders input channels"):
        ct_to_canonical(random_words(4, k // 8, seed=0), scale, torch.tensor([4, k]),
                        weight_g_idx=ok.flip(0), module="m")


def test_module_format():
    assert module_format("a", {"qweight", "qzeros", "scales"}) == "awq"
    assert module_format("a", {"weight_packed", "weight_scale", "weight_shape"}) == "compressed-tensors"
    assert module_format("a", {"weight_packed", "weight_scale", "weight_shape", "weight_zero_point"}) \
        == "compressed-tensors"
    with pytest.raises(ModelLoadError, match=r"lacks tensors m\.qzeros; found m\.qweight, m\.scales"):
        module_format("m", {"qweight", "scales"})
    with pytest.raises(ModelLoadError, match=r"lacks tensors m\.weight_shape"):
        module_format("m", {"weight_packed", "weight_scale"})
    with pytest.raises(ModelLoadError, match=r"m\.g_idx.*GPTQ"):
        module_format("m", {"qweight", "qzeros", "scales", "g_idx"})
    with pytest.raises(ModelLoadError, match="mixes"):
        module_format("m", {"qweight", "qzeros", "scales", "weight_packed"})


def test_skip_list_matching_follows_each_format():
    # AutoAWQ / vLLM read modules_to_not_convert by substring
    assert matches_skip("model.language_model.layers.0.linear_attn.in_proj_a", ["in_proj_a"], "awq")
    assert not matches_skip("model.layers.0.mlp.experts.0.gate_proj", ["mlp.gate"], "awq")
    assert matches_skip("model.layers.0.mlp.gate_proj", ["mlp.gate"], "awq")  # why dense models must not list it
    # compressed-tensors: exact names or re: patterns
    assert matches_skip("lm_head", ["lm_head"], "compressed-tensors")
    assert not matches_skip("model.layers.0.mlp.gate_proj", ["mlp.gate"], "compressed-tensors")
    assert matches_skip("model.layers.0.mlp.gate", [r"re:.*mlp\.gate$"], "compressed-tensors")
    assert not matches_skip("model.layers.0.mlp.gate_proj", [r"re:.*mlp\.gate$"], "compressed-tensors")
