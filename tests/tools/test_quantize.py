"""The RTN quantizer: its rounding, the files and quantization_config it writes, the CLI."""
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from catengine.cli import main as cli_main
from catengine.errors import ConfigError
from catengine.kernels.w4a16.packing import dequantize, unpack_int4_along_k
from catengine.models import ModelConfig
from catengine.models.loader import INDEX_FILE, iter_checkpoint
from catengine.models.quant_formats import matches_skip
from catengine.tools.quantize import quantize_checkpoint, rtn_quantize
from tests.models.helpers import build_hf_model
from tests.models.test_quant_formats import awq_reference, ct_reference


def ceil_to(x: np.float32, dtype: torch.dtype) -> np.float32:
    """Smallest value of ``dtype`` >= the positive float32 ``x``."""
    if dtype == torch.float32:
        return x
    if dtype == torch.float16:
        h = np.float16(x)
        return np.float32(h if np.float32(h) >= x else np.nextafter(h, np.float16(np.inf)))
    bits = int(np.array(x, np.float32).view(np.uint32))   # bfloat16 = the upper half of a float32
    return np.array((bits + 0xFFFF) & 0xFFFF0000, np.uint32).view(np.float32)[()]


def rtn_reference(w: np.ndarray, group: int, symmetric: bool, scale_dtype: torch.dtype):
    """Group by group in numpy (float32): scale, zero point and the nearest code, as documented."""
    out_f, in_f = w.shape
    codes = np.zeros((out_f, in_f), np.int64)
    scales = np.zeros((out_f, in_f // group), np.float32)
    zeros = np.zeros((out_f, in_f // group), np.float32)
    tiny = torch.finfo(scale_dtype).tiny
    for o in range(out_f):
        for g in range(in_f // group):
            x = w[o, g * group:(g + 1) * group].astype(np.float32)
            lo, hi = min(x.min(), np.float32(0)), max(x.max(), np.float32(0))
            s = np.float32(np.abs(x).max() / np.float32(7.5)) if symmetric else np.float32((hi - lo) / np.float32(15))
            s = ceil_to(np.float32(max(float(s), tiny)), scale_dtype)
            z = np.float32(8) if symmetric else np.clip(np.rint(-lo / s), 0, 15)
            codes[o, g * group:(g + 1) * group] = np.clip(np.rint(x / s) + z, 0, 15)
            scales[o, g], zeros[o, g] = s, z
    return codes, scales, zeros


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rtn_matches_groupwise_reference(symmetric, scale_dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 64, generator=g) * torch.rand(24, 1, generator=g)
    w[3, :16] = 0.0                   # an all-zero group
    w[5, 16:32] = w[5, 16:32].abs()    # an all-positive group: zero must stay representable
    qw = rtn_quantize(w, 16, symmetric, scale_dtype)
    codes, scales, zeros = rtn_reference(w.numpy(), 16, symmetric, scale_dtype)
    assert torch.equal(unpack_int4_along_k(qw.qweight).t().long(), torch.from_numpy(codes))
    assert torch.equal(qw.scales.t().float(), torch.from_numpy(scales))
    assert torch.equal(qw.zeros.t().float(), torch.from_numpy(zeros))
    assert set(codes.reshape(-1).tolist()) == set(range(16)) if not symmetric else codes.max() <= 15
    deq = dequantize(qw, torch.float32).t()
    step = qw.scales.float().t().repeat_interleave(16, 1)
    # within half a step: scales are rounded up, so clamping at 0 / 15 never costs more
    assert ((deq - w).abs() <= step * (0.5 + 1e-6)).all()
    assert torch.equal(deq[3, :16], torch.zeros(16))


def test_rtn_scales_of_bf16_weights_are_bf16_exact_in_fp16():
    w = (torch.randn(16, 32) * 0.02).bfloat16()
    qw = rtn_quantize(w, 32, False, torch.float16, via_dtype=torch.bfloat16)
    assert qw.scales.dtype == torch.float16
    assert torch.equal(qw.scales.bfloat16().half(), qw.scales)


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def src(request, tmp_path_factory):
    moe = request.param
    d = tmp_path_factory.mktemp("q") / "src"
    build_hf_model(moe=moe, seed=11).save_pretrained(d)
    (d / "tokenizer.json").write_text('{"model": {}}')
    (d / "chat_template.jinja").write_text("{{ messages }}")
    (d / "pytorch_model.bin").write_bytes(b"stale")
    return moe, d


def modules(tensors: dict, suffix: str) -> set[str]:
    return {k[: -len(suffix) - 1] for k in tensors if k.endswith("." + suffix)}


def dense_linears(tensors: dict) -> set[str]:
    return {k[: -len(".weight")] for k, v in tensors.items() if k.endswith(".weight") and v.dim() >= 2}


def test_awq_files_and_config(src, tmp_path):
    moe, d = src
    group = 64  # leaves the MLP down projections (input 96 or 48) and the experts (32 x 64) unquantized
    q = quantize_checkpoint(d, tmp_path / "awq", "awq", group, progress=False)
    qc = json.loads((q / "config.json").read_text())["quantization_config"]
    skip = qc.pop("modules_to_not_convert")
    assert qc == {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    t = load_file(str(q / "model.safetensors"))
    quantized, dense = modules(t, "qweight"), dense_linears(t)
    assert "model.layers.0.linear_attn.in_proj_qkv" in quantized and "model.layers.3.self_attn.o_proj" in quantized
    assert {"model.layers.0.linear_attn.in_proj_a", "model.layers.0.linear_attn.in_proj_b", "lm_head",
            "model.embed_tokens", "model.layers.0.linear_attn.conv1d"} <= dense
    if moe:
        assert "model.layers.1.mlp.shared_expert.gate_proj" in quantized and "model.layers.1.mlp.gate" in dense
        assert "model.layers.1.mlp.experts.7.gate_proj" in dense and "model.layers.1.mlp.shared_expert_gate" in dense
        assert {"mlp.gate", "shared_expert_gate", "layers.1.mlp.experts"} <= set(skip)
        assert "layers.1.mlp.shared_expert.down_proj" in skip
    else:
        assert "model.layers.2.mlp.down_proj" in dense and "layers.2.mlp.down_proj" in skip
        assert "mlp.gate" not in skip  # it would also name mlp.gate_proj for vLLM / AutoAWQ
    # substring semantics, written out: every dense linear named, no quantized one
    assert all(any(s in m for s in skip) for m in dense)
    assert not any(any(s in m for s in skip) for m in quantized)
    for m in sorted(quantized)[:6]:
        qweight, qzeros, scales = t[f"{m}.qweight"], t[f"{m}.qzeros"], t[f"{m}.scales"]
        k, n = qweight.shape[0], qweight.shape[1] * 8
        assert qweight.dtype == qzeros.dtype == torch.int32 and scales.dtype == torch.float16
        assert scales.shape == (k // group, n) and qzeros.shape == (k // group, n // 8)
        want = dequantize(rtn_quantize(load_file(str(d / "model.safetensors"))[f"{m}.weight"], group, False,
                                       torch.float16))
        assert torch.equal(awq_reference(qweight, qzeros, scales, group), want)
    assert ModelConfig.from_pretrained(q).quant.skip == tuple(skip)
    assert (q / "tokenizer.json").is_file() and (q / "chat_template.jinja").is_file()
    assert (q / "generation_config.json").is_file() and not (q / "pytorch_model.bin").exists()


@pytest.mark.parametrize("symmetric", [True, False])
def test_compressed_tensors_files_and_config(src, tmp_path, symmetric):
    moe, d = src
    q = quantize_checkpoint(d, tmp_path / "ct", "compressed-tensors", 32, symmetric, progress=False)
    qc = json.loads((q / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["quantization_status"] == "compressed"
    (group,) = qc["config_groups"].values()
    assert group["targets"] == ["Linear"]
    assert {k: group["weights"][k] for k in ("num_bits", "type", "symmetric", "strategy", "group_size")} == \
        {"num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": 32}
    t = load_file(str(q / "model.safetensors"))
    quantized, dense = modules(t, "weight_packed"), dense_linears(t)
    assert all(matches_skip(m, qc["ignore"], "compressed-tensors") for m in dense)
    assert not any(matches_skip(m, qc["ignore"], "compressed-tensors") for m in quantized)
    assert (modules(t, "weight_zero_point") == set()) if symmetric else (modules(t, "weight_zero_point") == quantized)
    src_t = load_file(str(d / "model.safetensors"))
    for m in sorted(quantized)[:6]:
        n, k = t[f"{m}.weight_shape"].tolist()
        assert t[f"{m}.weight_packed"].shape == (n, k // 8) and t[f"{m}.weight_scale"].dtype == torch.float32
        want = dequantize(rtn_quantize(src_t[f"{m}.weight"], 32, symmetric, torch.float32))
        got = ct_reference(t[f"{m}.weight_packed"], t[f"{m}.weight_scale"], t.get(f"{m}.weight_zero_point"), 32)
        assert torch.equal(got.t(), want)
    if moe:
        assert "model.layers.0.mlp.experts.5.up_proj" in quantized
        assert "model.layers.0.mlp.experts.5.down_proj" in quantized
    assert ModelConfig.from_pretrained(q).quant.symmetric == symmetric


def test_fused_bf16_source_sharded_output(src, tmp_path):
    """Fused experts are written per expert; bf16 scales stay bf16 (CT); small shards get an index."""
    moe, d = src
    t = {k: v.bfloat16() for k, v in load_file(str(d / "model.safetensors")).items()}
    if moe:
        for i in range(4):
            p = f"model.layers.{i}.mlp.experts"
            t[f"{p}.gate_up_proj"] = torch.stack([torch.cat([t.pop(f"{p}.{e}.gate_proj.weight"),
                                                             t.pop(f"{p}.{e}.up_proj.weight")]) for e in range(8)])
            t[f"{p}.down_proj"] = torch.stack([t.pop(f"{p}.{e}.down_proj.weight") for e in range(8)])
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file(t, str(fused / "model.safetensors"), {"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    (fused / "config.json").write_text(json.dumps(cfg))
    q = quantize_checkpoint(fused, tmp_path / "q", "compressed-tensors", 16, max_shard_bytes=200_000, progress=False)
    index = json.loads((q / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((q / f).is_file() for f in files)
    names = set()
    for f in files:
        with safe_open(str(q / f), framework="pt") as h:
            names |= set(h.keys())
    assert names == set(index["weight_map"])
    if moe:
        assert "model.layers.2.mlp.experts.7.down_proj.weight_packed" in names
        assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)
    got = dict(iter_checkpoint(q, ModelConfig.from_pretrained(q), progress=False))
    want = dict(iter_checkpoint(fused, ModelConfig.from_pretrained(fused), progress=False))
    assert got.keys() == want.keys()
    name = "model.layers.0.mlp.experts.gate_up_proj" if moe else "model.layers.0.mlp.gate_proj.weight"
    assert got[name].scales.dtype == torch.bfloat16
    w = want[name]
    expected = rtn_quantize(w[1, : w.shape[1] // 2] if moe else w, 16, False, torch.bfloat16)
    assert torch.equal(dequantize(got[name])[1, :, : w.shape[1] // 2] if moe else dequantize(got[name]),
                       dequantize(expected))


def test_refuses_bad_inputs(src, tmp_path):
    _, d = src
    with pytest.raises(ConfigError, match="format 'gptq' is not supported"):
        quantize_checkpoint(d, tmp_path / "x", "gptq")
    q = quantize_checkpoint(d, tmp_path / "q", "awq", 32, progress=False)
    with pytest.raises(ConfigError, match="already quantized"):
        quantize_checkpoint(q, tmp_path / "qq", "awq")
    with pytest.raises(ConfigError, match="already holds a model"):
        quantize_checkpoint(d, q, "awq")


def test_cli(src, tmp_path, capsys):
    _, d = src
    out = tmp_path / "cli"
    assert cli_main(["quantize", str(d), str(out), "--format", "compressed-tensors", "--group-size", "32",
                     "--symmetric"]) == 0
    quant = ModelConfig.from_pretrained(out).quant
    assert (quant.method, quant.group_size, quant.symmetric) == ("compressed-tensors", 32, True)
    assert "linears quantized" in capsys.readouterr().err
    assert cli_main(["quantize", str(d), str(out)]) == 2
    assert "already holds a model" in capsys.readouterr().err


def test_written_files_follow_the_umask(src, tmp_path):
    """safetensors writes its files 0600; the quantized checkpoint's files get what open() gives (0666 less the
    umask), like its config.json, so another user or a container can read the model."""
    import os
    import stat
    _, d = src
    old = os.umask(0o027)
    try:
        quantize_checkpoint(d, tmp_path / "q", "awq", 32, False)
    finally:
        os.umask(old)
    written = [p for p in (tmp_path / "q").iterdir() if p.suffix == ".safetensors" or p.name == "config.json"]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in written}
    assert len(modes) >= 2 and all(m == 0o640 for m in modes.values()), {k: oct(v) for k, v in modes.items()}
